"""Word lists for the story generator: characters, places, objects, feelings.

Everything here is the project's own words (Apache-2.0). Each entry carries the grammar the
templates need (pronouns, prepositions, hiding spots) so that the generated stories stay
consistent: a character introduced as "she" stays "she" for the whole story.
"""
from __future__ import annotations

import random

GIRL_NAMES = (
    "Mia Lily Emma Zoe Ava Nora Lucy Ella Rosa Maya Anna Ruby Hana Iris Clara Sara Leila Ada "
    "June Nina Tess Amara Priya Sofia Greta Wren Olive Ivy Poppy Daisy Mei Lena Freya Yara"
).split()
BOY_NAMES = (
    "Tom Leo Sam Max Ben Finn Jack Noah Eli Omar Theo Hugo Kai Ravi Oscar Milo Jonah Arlo "
    "Felix Luca Ezra Owen Toby Pablo Kenji Amir Otto Jasper Rufus Dev Nico Ivan Sami Bruno"
).split()

# Kinds a main character can be; humans get "girl"/"boy" from their pronoun.
ANIMALS = ["fox", "rabbit", "bear cub", "mouse", "owl", "duck", "cat", "puppy", "squirrel",
           "hedgehog", "turtle", "frog", "deer", "badger", "otter", "lamb", "kitten", "goat",
           "robin"]
SIZES = ["little", "small", "young", "curious", "clever", "shy", "cheerful", "brave"]

# (name, pronoun) of grown-ups who give advice.
ELDERS = [
    ("Mom", "she"), ("Dad", "he"), ("Grandma", "she"), ("Grandpa", "he"),
    ("Aunt Rose", "she"), ("Uncle Pete", "he"), ("the old owl", "she"),
    ("the wise turtle", "he"), ("the kind baker", "she"), ("Mr. Brown, the farmer", "he"),
    ("Ms. Park, the teacher", "she"), ("the old fisherman", "he"),
]

PRONOUNS = {
    "he": dict(he="he", him="him", his="his", self="himself"),
    "she": dict(he="she", him="her", his="her", self="herself"),
}

# name, preposition phrase, details, hiding spots, shelter; outdoor places can have weather.
PLACES = [
    ("the park", "in the park", ["tall green trees", "a pond with ducks", "a red slide"],
     ["under a bench", "behind a big tree", "in the tall grass"], "under the big oak tree", True),
    ("the forest", "in the forest", ["old pine trees", "soft moss", "a narrow path"],
     ["under a pile of leaves", "behind a mossy rock", "inside a hollow log"], "in a dry cave", True),
    ("the beach", "at the beach", ["warm sand", "gentle waves", "white shells"],
     ["under a pile of seaweed", "behind a big rock", "in a sand hole"], "under a wooden pier", True),
    ("the garden", "in the garden", ["bright flowers", "rows of carrots", "a little fountain"],
     ["under the rose bush", "behind the watering can", "between the pumpkins"], "in the garden shed", True),
    ("the meadow", "in the meadow", ["yellow flowers", "buzzing bees", "soft grass"],
     ["in the tall grass", "behind a hay bale", "under a flat stone"], "under a wide tree", True),
    ("the farm", "on the farm", ["a big red barn", "sleepy cows", "noisy chickens"],
     ["behind the barn door", "in the hay", "under the old cart"], "inside the barn", True),
    ("the library", "at the library", ["quiet rooms", "tall shelves of books", "a cozy reading corner"],
     ["under a big table", "behind a shelf", "inside a box of old maps"], "in the reading corner", False),
    ("the market", "at the market", ["stalls full of fruit", "busy people", "colorful tents"],
     ["under a fruit stall", "behind a stack of baskets", "next to the flower cart"], "under a striped tent", True),
    ("the river", "by the river", ["cool clear water", "smooth stones", "a small wooden bridge"],
     ["under the bridge", "between two stones", "in the reeds"], "under the old bridge", True),
    ("the hill", "on the hill", ["a lonely tree", "a wide view of the town", "windy grass"],
     ["behind the lonely tree", "in a rabbit hole", "under a bush"], "under the lonely tree", True),
    ("the lake", "by the lake", ["calm blue water", "a little boat", "singing frogs"],
     ["under the boat", "in the reeds", "behind the fishing hut"], "in the fishing hut", True),
    ("the school", "at school", ["a bright classroom", "a busy playground", "a big clock"],
     ["under a desk", "behind the coat hooks", "in the toy box"], "in the classroom", False),
    ("the village square", "in the village square", ["a stone fountain", "little shops", "a bell tower"],
     ["behind the fountain", "under a cart", "next to the bakery door"], "under the bakery roof", True),
    ("the orchard", "in the orchard", ["rows of apple trees", "ripe pears", "a wooden ladder"],
     ["under a fallen branch", "in a basket of apples", "behind the ladder"], "in the tool shed", True),
    ("the harbor", "at the harbor", ["fishing boats", "loud seagulls", "long ropes"],
     ["under a coil of rope", "behind a crate", "next to a boat"], "in the boat house", True),
    ("the zoo", "at the zoo", ["a tall giraffe", "sleepy lions", "a big pond with seals"],
     ["under a bench", "behind the ice cream cart", "near the penguin pool"], "in the reptile house", True),
]

OBJECTS = ["kite", "ball", "toy boat", "book", "hat", "scarf", "lantern", "shell", "drum",
           "key", "map", "teddy bear", "marble", "bell", "basket", "cup", "paint box",
           "wooden horse", "whistle", "feather", "compass", "yo-yo", "flute", "umbrella"]
COLORS = ["red", "blue", "green", "yellow", "shiny", "purple", "orange", "striped", "golden",
          "silver", "pink", "tiny", "old", "new", "spotted"]
FOODS = ["apples", "cookies", "berries", "honey cake", "carrots", "bread", "cherry pie",
         "soup", "pears", "sandwiches", "plums", "pancakes"]
HOBBIES = ["drawing pictures", "singing songs", "reading books", "climbing trees",
           "collecting stones", "dancing", "playing the drum", "building towers",
           "looking at the stars", "running fast", "telling jokes", "picking flowers",
           "watching birds", "baking cookies", "riding a bike", "making paper boats"]
TIMES = ["One sunny morning", "One rainy afternoon", "One cold winter day",
         "One warm summer evening", "One windy autumn day", "One bright spring morning",
         "Early one morning", "Late one afternoon", "One quiet Sunday"]
FEARS = [("the dark", "dark"), ("thunder", "loud"), ("the big dog next door", "big"),
         ("deep water", "deep"), ("high places", "high"), ("the old bridge", "shaky")]
GIFTS_MADE = ["a card with a drawing of a sun", "a necklace of shells", "a little clay bird",
              "a crown of flowers", "a paper boat", "a painted stone", "a song"]
NUMBERS = ["two", "three", "four", "five", "six", "seven"]


def character(rng: random.Random, taken: set[str], human: bool | None = None) -> dict:
    """A named character with a kind and pronouns; names are unique within a story."""
    pron = rng.choice(["he", "she"])
    names = [n for n in (BOY_NAMES if pron == "he" else GIRL_NAMES) if n not in taken]
    name = rng.choice(names)
    taken.add(name)
    if human is None:
        human = rng.random() < 0.5
    kind = ("girl" if pron == "she" else "boy") if human else rng.choice(ANIMALS)
    return dict(name=name, pron=pron, kind=kind, adj=rng.choice(SIZES), human=human)


def elder(rng: random.Random) -> dict:
    name, pron = rng.choice(ELDERS)
    return dict(name=name, pron=pron)


def place(rng: random.Random, outdoor_only: bool = False) -> tuple:
    options = [p for p in PLACES if p[5] or not outdoor_only]
    return rng.choice(options)
