"""Seeded generator of the kvscope-mini corpus: short stories and chat exchanges about them.

Every document is generated from its own seed (split name + index), so any slice of any
split can be regenerated exactly, offline, without storing the corpus. The train and
held-out splits use different seeds: the held-out stories are new combinations of
characters, places, objects and phrasings that the model has not seen.

    python -m kvscope.training.corpus --split heldout --docs 20 --out heldout.txt
"""
from __future__ import annotations

import argparse
import random
from typing import Iterator

from . import lexicon as lx
from .plots import OUTDOOR_PLOTS, PLOTS, Teller

EOT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPLITS = ("train", "heldout")

BUILDS = [("a sand castle", "castle"), ("a tower of blocks", "tower"), ("a tree house", "tree house"),
          ("a bridge of sticks", "bridge"), ("a snowman", "snowman"), ("a little raft", "raft")]
BIRDS = ["Pip", "Sunny", "Chirp", "Blue", "Peep", "Button", "Star"]
OPENERS = [
    "Once upon a time, there was {A_a_kind} named {A}.",
    "Once upon a time, in a small village, there lived {A_a_kind} called {A}.",
    "There was once {A_a_kind} named {A}.",
    "Long ago, {A_a_kind} named {A} lived near {P}.",
    "Once upon a time, {A_a_kind} named {A} lived with {C} in a little house.",
]
SECOND = ["{A_He} loved {hobby}.", "{A_He} was kind, and {A_he} loved {hobby}.",
          "More than anything, {A} liked {hobby}.", ""]


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _person(prefix: str, c: dict, f: dict) -> None:
    p = lx.PRONOUNS[c["pron"]]
    f[prefix] = c["name"]
    f[prefix + "_a_kind"] = _a(f"{c['adj']} {c['kind']}") if "kind" in c else c["name"]
    for key, word in p.items():
        f[f"{prefix}_{key}"] = word
        f[f"{prefix}_{key[0].upper()}{key[1:]}"] = word[0].upper() + word[1:]


def story_fields(rng: random.Random, outdoor: bool) -> dict:
    taken: set[str] = set()
    f: dict = {}
    _person("A", lx.character(rng, taken), f)
    _person("B", lx.character(rng, taken), f)
    _person("C", lx.elder(rng), f)
    f["C_Cap"] = f["C"][0].upper() + f["C"][1:]
    name, at, details, hides, shelter, _ = lx.place(rng, outdoor_only=outdoor)
    d1, d2 = rng.sample(details, 2)
    f.update(P=name, P_Cap=name[0].upper() + name[1:], P_at=at, P_d1=d1, P_d2=d2,
             P_hide=rng.choice(hides), P_shelter=shelter)
    color, obj = rng.choice(lx.COLORS), rng.choice(lx.OBJECTS)
    f.update(O=obj, O_col=f"{color} {obj}", O_colw=color)
    build, build_noun = rng.choice(BUILDS)
    fear, _ = rng.choice(lx.FEARS)
    f.update(food=rng.choice(lx.FOODS), hobby=rng.choice(lx.HOBBIES), time=rng.choice(lx.TIMES),
             n=rng.choice(lx.NUMBERS), fear=fear, build=build, build_noun=build_noun,
             made=rng.choice(lx.GIFTS_MADE), bird=rng.choice(BIRDS))
    return f


def story(rng: random.Random) -> tuple[str, list[tuple[str, str]], dict]:
    """One story: its text, question/answer pairs about it, and its fields."""
    plot = rng.choice(PLOTS)
    f = story_fields(rng, outdoor=plot in OUTDOOR_PLOTS)
    t = Teller(rng, f)
    paragraphs, qa = plot(t)
    intro = " ".join(s for s in (t(*OPENERS), t(*SECOND)) if s)
    text = "\n\n".join([intro + " " + paragraphs[0]] + paragraphs[1:])
    return text, [(q.format_map(f), a.format_map(f)) for q, a in qa], f


def _turn(role: str, content: str) -> str:
    # Must match the chat_template written by tokenizer.py.
    return f"{IM_START}{role}\n{content}{IM_END}\n"


REQUESTS = [
    "Tell me a story about {A_a_kind} named {A}.",
    "Write a short story about {A} and {B}.",
    "Can you tell me a story that happens {P_at}?",
    "Tell me a bedtime story.",
    "Please write a story for children with a {O} in it.",
]
SMALL_TALK = [
    ("Who are you?", "I am kvscope-mini, a very small language model. I know how to tell short stories."),
    ("What can you do?", "I can tell short stories for children and answer simple questions about them."),
    ("Hello!", "Hello! Would you like to hear a story?"),
    ("What is your name?", "My name is kvscope-mini."),
    ("Thank you!", "You are welcome! Come back for another story."),
]


def document(split: str, index: int) -> str:
    """Document `index` of `split`, the same on every machine and Python version."""
    rng = random.Random(f"kvscope-mini/{split}/{index}")
    text, qa, f = story(rng)
    kind = rng.random()
    if kind < 0.70:
        return text
    if kind < 0.85:
        return _turn("user", rng.choice(REQUESTS).format_map(f)) + _turn("assistant", text)
    if kind < 0.97:
        turns = rng.sample(qa, k=min(len(qa), rng.choice([1, 2])))
        out = _turn("user", text + "\n\n" + turns[0][0]) + _turn("assistant", turns[0][1])
        for q, a in turns[1:]:
            out += _turn("user", q) + _turn("assistant", a)
        return out
    q, a = rng.choice(SMALL_TALK)
    return _turn("user", q) + _turn("assistant", a)


def documents(split: str, n: int, start: int = 0) -> Iterator[str]:
    assert split in SPLITS, split
    for i in range(start, start + n):
        yield document(split, i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=SPLITS, default="train")
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.out, "w", encoding="utf-8") as fh:
        for doc in documents(a.split, a.docs):
            fh.write(doc + EOT + "\n")


if __name__ == "__main__":
    main()
