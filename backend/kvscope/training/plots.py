"""Story plots: each one a chain of cause and effect with alternatives for every sentence.

A plot takes the random generator and the story's fields (who, where, what) and returns the
paragraphs plus question/answer pairs about them. The answers are facts of this particular
story, so a model that answers them has to track who is who rather than recite a template.
"""
from __future__ import annotations

import random


class Teller:
    """Picks one phrasing out of several and fills in the story's fields."""

    def __init__(self, rng: random.Random, fields: dict):
        self.rng, self.f = rng, fields

    def __call__(self, *alternatives: str) -> str:
        return self.rng.choice(alternatives).format_map(self.f)

    def maybe(self, p: float, *alternatives: str) -> str:
        return self(*alternatives) if self.rng.random() < p else ""


def _para(*sentences: str) -> str:
    return " ".join(s for s in sentences if s)


def lost_object(t: Teller):
    return [
        _para(t("{A} had a {O_col} that {A_he} loved very much.",
                "{A} always carried {A_his} {O_col} everywhere.",
                "{A}'s favorite thing in the world was a {O_col}."),
              t("{time}, {A} took the {O} to {P}.", "{time}, {A} went to {P} with the {O}."),
              t("{P_Cap} had {P_d1} and {P_d2}.", "There were {P_d1} and {P_d2}."),
              t("{A} played for a long time.", "{A_He} played until the sun was low.")),
        _para(t("When it was time to go home, the {O} was gone!",
                "Suddenly, {A} saw that the {O} was not there anymore."),
              t("{A} looked everywhere, but {A_he} could not find it.",
                "{A_He} searched and searched, but the {O} was nowhere."),
              t("{A} felt very sad and began to cry.", "{A} was so worried that {A_his} eyes filled with tears.")),
        _para(t("Just then, {B}, {B_a_kind}, walked by.", "Then {B}, {B_a_kind} from next door, came along."),
              t('"Why are you crying?" asked {B}.', '"What is wrong, {A}?" asked {B}.'),
              t('"I lost my {O}," said {A}.', '"My {O} is gone," {A} said quietly.'),
              t('"Do not worry. I will help you look," said {B}.', '"Let us find it together," said {B} with a smile.')),
        _para(t("{A} and {B} looked {P_hide}.", "The two friends searched {P_hide}."),
              t("At last, {B} shouted, \"I found it!\"", "After a while, {B} saw something {O_colw} and cried, \"There it is!\""),
              t("{A} was so happy. {A_He} hugged {B} and said, \"Thank you!\"",
                "{A} jumped with joy and thanked {B} again and again.")),
        _para(t("From that day on, {A} and {B} were best friends.",
                "After that day, {A} and {B} played together every week."),
              t("{A} learned that a good friend helps when things go wrong.",
                "The moral of the story is: when you help others, you make a friend.")),
    ], [
        ("What did {A} lose?", "{A} lost {A_his} {O_col}."),
        ("Who helped {A} find the {O}?", "{B} helped {A} find the {O}."),
        ("Where was the {O} found?", "The {O} was found {P_hide}."),
        ("Where did {A} go with the {O}?", "{A} went to {P}."),
    ]


def sharing(t: Teller):
    return [
        _para(t("{A} had a basket full of {food}.", "{C_Cap} gave {A} a big basket of {food}."),
              t("{A_He} took the basket to {P}.", "{time}, {A} sat down {P_at} with the basket.")),
        _para(t("{B}, {B_a_kind}, saw the {food} and said, \"Can I have some, please?\"",
                "Soon {B} came by. {B_He} looked at the {food} and asked, \"May I have one?\""),
              t('"No," said {A}. "They are all mine."', '{A} held the basket close and said, "No, I want them all."'),
              t("{B} walked away with a sad face.", "{B} felt sad and sat alone under a tree.")),
        _para(t("{A} ate and ate, but soon {A_his} tummy hurt.", "{A} tried to eat all the {food}, but there were too many."),
              t("{A_He} looked at {B}, sitting all alone.", "Then {A_he} saw {B} sitting alone."),
              t("{A} did not feel happy at all.", "{A} felt a little sorry inside.")),
        _para(t("{A} walked over to {B} and said, \"I am sorry. Let us share.\"",
                "{A} got up, went to {B} and said, \"Here, you can have half.\""),
              t("{B} smiled a big smile.", "{B}'s face lit up."),
              t("They ate the {food} together and laughed.", "The two of them shared the {food} and told funny stories.")),
        _para(t("{A} learned that sharing makes everyone happy, even you.",
                "The moral of the story is: food tastes better when you share it.")),
    ], [
        ("What was in {A}'s basket?", "{A}'s basket was full of {food}."),
        ("Who asked {A} for some {food}?", "{B} asked for some {food}."),
        ("What did {A} do at the end?", "{A} shared the {food} with {B}."),
    ]


def fear(t: Teller):
    return [
        _para(t("But {A} had one problem: {A_he} was afraid of {fear}.", "{A} was brave about many things, but {A_he} was scared of {fear}."),
              t("Every time {A_he} thought about {fear}, {A_his} knees shook.", "{A_He} did not like to talk about it.")),
        _para(t("{time}, {A} had to go to {P} with {B}.", "{time}, {B} asked {A} to come to {P}."),
              t("On the way, they had to face {fear}.", "But to get there, they had to pass {fear}."),
              t("{A} stopped and said, \"I cannot do it. I am too scared.\"", '"I want to go home," whispered {A}.')),
        _para(t("{B} held {A_his} hand.", "{B} stood next to {A}."),
              t('"It is okay to be scared," said {B}. "I am here with you."',
                '"Take a deep breath," said {B}. "We can do it together."'),
              t("{A} took a deep breath and counted to {n}.", "{A} closed {A_his} eyes for a moment and thought of something happy.")),
        _para(t("Step by step, {A} went on.", "Slowly, {A} took one step, and then another."),
              t("Soon they were at {P}, and {A} was not scared anymore.", "Before {A_he} knew it, they were safe {P_at}."),
              t("{A} felt very proud of {A_self}.", '"I did it!" cried {A}, and {B} clapped.')),
        _para(t("{A} learned that being brave does not mean you are never afraid.",
                "The moral of the story is: with a friend by your side, you can face your fears.")),
    ], [
        ("What was {A} afraid of?", "{A} was afraid of {fear}."),
        ("Who helped {A} be brave?", "{B} helped {A} be brave."),
        ("How did {A} feel at the end?", "{A} felt proud."),
    ]


def storm(t: Teller):
    return [
        _para(t("{time}, {A} and {B} went to {P} to play with {A_his} {O_col}.",
                "{A} and {B} were best friends. {time}, they went to {P}."),
              t("They saw {P_d1} and {P_d2}.", "{P_Cap} was full of {P_d1}.")),
        _para(t("Suddenly, dark clouds covered the sky.", "Then the wind began to blow, and the sky turned gray."),
              t("Big drops of rain started to fall.", "Soon it began to rain very hard."),
              t('"Quick, follow me!" said {B}.', '"We need to find a dry place," said {A}.')),
        _para(t("They ran and hid {P_shelter}.", "The two friends hurried {P_shelter}."),
              t("They waited and listened to the rain.", "They sat close together and waited."),
              t("{A} told a funny story, and {B} laughed.", "{B} sang a little song to pass the time.")),
        _para(t("After a while, the rain stopped.", "At last, the sun came out again."),
              t("A beautiful rainbow appeared in the sky.", "There was a big rainbow over {P}."),
              t('"Look!" said {A}. "The storm gave us a rainbow."', '"That was an adventure," said {B}.')),
        _para(t("They walked home happy and a little wet.", "They went home and told {C} all about it."),
              t("The moral of the story is: even a storm can end with something beautiful.",
                "{A} learned that bad moments pass, especially with a friend.")),
    ], [
        ("Where did {A} and {B} hide from the rain?", "They hid {P_shelter}."),
        ("What did they see after the rain?", "They saw a rainbow."),
        ("Where did {A} and {B} go to play?", "They went to {P}."),
    ]


def keep_trying(t: Teller):
    return [
        _para(t("{A} wanted to build {build} {P_at}.", "{time}, {A} decided to build {build}."),
              t("{A_He} worked very hard.", "{A_He} gathered everything {A_he} needed and began.")),
        _para(t("But the {build_noun} fell down.", "But when {A_he} was almost done, the {build_noun} fell over."),
              t("{A} tried again, and again it fell.", "{A_He} tried a second time, but it fell again."),
              t('"I will never do it," said {A}, and {A_he} sat down.', "{A} felt angry and wanted to give up.")),
        _para(t("{C_Cap} saw {A} and came over.", "Just then, {C} came by."),
              t('"Do not give up," said {C}. "Try to make the bottom strong first."',
                '"Every builder fails sometimes," {C} said. "Start with a wide, strong base."'),
              t("{A} listened carefully.", "{A} thought about it and nodded.")),
        _para(t("{A} tried one more time, slowly and carefully.", "This time, {A} started with a strong base."),
              t("The {build_noun} stood tall and did not fall!", "At last, the {build_noun} was finished, and it stood tall."),
              t("{A} smiled from ear to ear.", '"I did it!" shouted {A}.')),
        _para(t("{A} learned that if you keep trying, you can do hard things.",
                "The moral of the story is: never give up, and listen to good advice.")),
    ], [
        ("What did {A} want to build?", "{A} wanted to build {build}."),
        ("Who gave {A} advice?", "{C} gave {A} advice."),
        ("Did {A} give up?", "No. {A} tried again and finished the {build_noun}."),
    ]


def honesty(t: Teller):
    return [
        _para(t("{B} had a {O_col} that {B_he} loved.", "{B} had a beautiful {O_col}."),
              t("{time}, {A} visited {B} {P_at}.", "{time}, {A} and {B} were playing {P_at}.")),
        _para(t("When {B} was not looking, {A} picked up the {O}.", "{A} wanted to try the {O}, so {A_he} took it without asking."),
              t("Oops! The {O} fell and broke.", "But {A_he} dropped it, and it broke."),
              t("{A} was scared and hid the {O} {P_hide}.", "{A} quickly hid the broken {O} {P_hide}.")),
        _para(t("{B} looked for the {O} everywhere.", "Soon {B} asked, \"Have you seen my {O}?\""),
              t('"No," said {A}, but {A_his} face turned red.', "{A} shook {A_his} head, but {A_he} felt terrible inside."),
              t("That night, {A} could not sleep.", "All evening, {A} felt a heavy feeling in {A_his} heart.")),
        _para(t("The next day, {A} went to {B} and told the truth.", "In the morning, {A} said, \"{B}, I broke your {O}. I am sorry.\""),
              t("{B} was sad, but {B_he} said, \"Thank you for telling me the truth.\"",
                "{B} was quiet for a moment. Then {B_he} said, \"I forgive you.\""),
              t("Together they fixed the {O} with glue.", "{C_Cap} helped them fix the {O}.")),
        _para(t("{A} learned that telling the truth is hard, but it makes you feel light again.",
                "The moral of the story is: always tell the truth, even when it is hard.")),
    ], [
        ("What did {A} break?", "{A} broke {B}'s {O}."),
        ("Where did {A} hide the {O}?", "{A} hid the {O} {P_hide}."),
        ("What did {B} say when {A} told the truth?", "{B} forgave {A}."),
    ]


def new_friend(t: Teller):
    return [
        _para(t("{A} and {A_his} family moved to a new town.", "{A} was new in town and did not know anyone."),
              t("{A_He} felt lonely.", "Every day, {A_he} played alone {P_at}.")),
        _para(t("{time}, {A} saw {B}, {B_a_kind}, {P_at}.", "{time}, {B} was {hobby} {P_at}."),
              t("{A} wanted to say hello, but {A_he} was too shy.", "{A} wanted to join, but {A_he} did not know what to say.")),
        _para(t('{B} looked up and said, "Hi! I am {B}. What is your name?"', '{B} waved and called, "Hello! Do you want to play?"'),
              t('"I am {A}," said {A} softly.', '"Yes, please," said {A}, "I am {A}."'),
              t("{B} showed {A} how {B_he} liked {hobby}.", "They spent the whole afternoon {hobby}.")),
        _para(t("{A} was not lonely anymore.", "When the sun went down, {A} did not want to go home."),
              t('"See you tomorrow?" asked {B}. "Yes!" said {A}.', "They promised to meet again the next day.")),
        _para(t("The moral of the story is: a kind word can turn a stranger into a friend.",
                "{A} learned that new places can feel like home when you find a friend.")),
    ], [
        ("Why was {A} lonely?", "{A} was new in town and did not know anyone."),
        ("Who became {A}'s friend?", "{B} became {A}'s friend."),
        ("What did {A} and {B} do together?", "They spent the afternoon {hobby}."),
    ]


def gift(t: Teller):
    return [
        _para(t("Tomorrow was {B}'s birthday.", "{A}'s best friend {B} was going to have a birthday."),
              t("{A} wanted to give {B} a present, but {A_he} had no money.", "{A} looked in {A_his} pocket, but it was empty.")),
        _para(t("{A} went to ask {C}.", "{A} asked {C} for help."),
              t('"The best gifts come from the heart," said {C}.', '"Why not make something yourself?" said {C}.'),
              t("{A} thought and thought.", "{A} had an idea.")),
        _para(t("{A} worked all afternoon and made {made}.", "{A_He} sat at the table and carefully made {made}."),
              t("It was not perfect, but {A} put all {A_his} love into it.", "{A_He} was a little worried that {B} would not like it.")),
        _para(t("At the party, {A} gave {B} the present.", "The next day, {A} brought the present to {B}'s party."),
              t('{B} smiled and said, "This is the best present ever!"', '{B} hugged {A} and said, "You made it just for me!"'),
              t("{A} felt warm and happy.", "{A}'s heart was full of joy.")),
        _para(t("The moral of the story is: a gift made with love is worth more than gold.",
                "{A} learned that you do not need money to make someone happy.")),
    ], [
        ("Whose birthday was it?", "It was {B}'s birthday."),
        ("What did {A} make?", "{A} made {made}."),
        ("Who told {A} to make a present?", "{C} told {A} to make a present."),
    ]


def rescue(t: Teller):
    return [
        _para(t("{time}, {A} was walking {P_at}.", "{time}, {A} went to {P} to look for pretty stones."),
              t("{A_He} heard a tiny sound.", "Suddenly, {A_he} heard a soft cry.")),
        _para(t("It was a little bird with a hurt wing.", "A baby bird was lying {P_hide}. Its wing was hurt."),
              t("{A} picked it up very gently.", "{A} held the bird in {A_his} hands, very carefully."),
              t('"Do not be afraid," said {A}. "I will take care of you."', "{A} decided to help it.")),
        _para(t("{A} took the bird home and showed it to {C}.", "At home, {C} helped {A} make a soft bed in a box."),
              t("Every day, {A} gave the bird water and seeds.", "{A} fed the bird and kept it warm."),
              t("{A_He} named the bird {bird}.", "{A} called the bird {bird}.")),
        _para(t("After {n} days, the wing was strong again.", "Soon {bird} could flap its wings."),
              t("{A} opened the window, and {bird} flew up into the sky.", "{A} took {bird} outside, and it flew away."),
              t("{A} felt sad and happy at the same time.", "{A} waved goodbye with tears in {A_his} eyes.")),
        _para(t("The next morning, {bird} came back and sang at {A}'s window.",
                "Every spring after that, {bird} came back to visit {A}."),
              t("The moral of the story is: kindness always comes back to you.",
                "{A} learned that taking care of others makes the world a better place.")),
    ], [
        ("What did {A} find?", "{A} found a little bird with a hurt wing."),
        ("What was the bird's name?", "The bird's name was {bird}."),
        ("Who helped {A} take care of the bird?", "{C} helped {A}."),
    ]


def race(t: Teller):
    return [
        _para(t("{A} and {B} loved to race.", "{A} was very fast, and so was {B}."),
              t("{time}, they decided to race to the end of {P}.", '{time}, {B} said, "Let us race to the other side of {P}!"')),
        _para(t('"Ready, set, go!" shouted {C}.', "{C_Cap} counted to three, and they ran."),
              t("{A} ran ahead of {B}.", "At first, {A} was in front."),
              t("But then {A} tripped over a stone and fell.", "Then {A} slipped and hurt {A_his} knee.")),
        _para(t("{B} could have won the race.", "{B} was about to run past."),
              t("But {B} stopped and helped {A} stand up.", "Instead, {B} turned around and helped {A}."),
              t('"Are you okay?" asked {B}.', '"Winning is not important," said {B}. "Are you hurt?"')),
        _para(t("They walked to the finish together, side by side.", "{A} leaned on {B}, and they crossed the line together."),
              t("{C_Cap} said, \"You are both winners today.\"", "Everyone cheered for them.")),
        _para(t("The moral of the story is: kindness matters more than winning.",
                "{A} learned that a true friend stops to help.")),
    ], [
        ("Who fell during the race?", "{A} fell during the race."),
        ("What did {B} do when {A} fell?", "{B} stopped and helped {A}."),
        ("Who won the race?", "{A} and {B} crossed the line together."),
    ]


PLOTS = [lost_object, sharing, fear, storm, keep_trying, honesty, new_friend, gift, rescue, race]
OUTDOOR_PLOTS = {storm, rescue, race}
