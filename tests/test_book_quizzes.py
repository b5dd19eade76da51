"""The end-of-chapter quizzes cannot be passed without reading: over all chapters the
correct choice is shown at no favoured position, and it is not usually the longest."""
from __future__ import annotations

import re
from collections import Counter
from html import unescape

import pytest

pytest.importorskip("markdown_it")

from kvscope.server.pages import Site, make_markdown, render_markdown  # noqa: E402

QUESTION = re.compile(r'<fieldset class="kv-quiz__question".*?</fieldset>', re.S)
CHOICE = re.compile(r'<li class="kv-quiz__choice" data-correct="(true|false)">.*?<span>(.*?)</span></label>', re.S)
TAG = re.compile(r"<[^>]+>")


def rendered_questions() -> list[list[tuple[bool, str]]]:
    """Every question as rendered: its choices in page order, (is correct, visible text)."""
    site, md = Site(), make_markdown()
    questions = []
    for chapter in site.chapter_list():
        html = render_markdown(md, chapter.body, site.glossary, chapter.path.name).html
        for block in QUESTION.findall(html):
            questions.append([(flag == "true", unescape(TAG.sub("", text)).strip())
                              for flag, text in CHOICE.findall(block)])
    return questions


QUESTIONS = rendered_questions()


def test_every_question_has_one_correct_choice():
    assert len(QUESTIONS) >= 21 * 3
    assert all(sum(correct for correct, _ in q) == 1 and len(q) >= 2 for q in QUESTIONS)


def test_correct_choice_position_is_spread():
    positions = Counter(next(i for i, (correct, _) in enumerate(q) if correct) for q in QUESTIONS)
    worst_position, worst = positions.most_common(1)[0]
    assert worst / len(QUESTIONS) <= 0.40, f"position {worst_position} holds {worst} of {len(QUESTIONS)}"
    assert len(positions) >= 3


def test_correct_choice_is_not_usually_the_longest():
    """Ties count against the book: a correct choice as long as the longest one is 'longest'."""
    longest = sum(1 for q in QUESTIONS
                  if len(next(text for correct, text in q if correct)) >= max(len(text) for _, text in q))
    assert longest <= len(QUESTIONS) / 2, f"the correct choice is the longest in {longest} of {len(QUESTIONS)}"


def test_order_is_stable_between_renders():
    assert rendered_questions() == QUESTIONS


QUIZ = re.compile(r"^```quiz\n(.*?)^```", re.S | re.M)


def quiz_items() -> list[tuple[str, dict]]:
    """Every question as written, with where it is: ("chNN Qk", the YAML item)."""
    import yaml
    items = []
    for chapter in Site().chapter_list():
        for block in QUIZ.findall(chapter.body):
            items += [(f"ch{chapter.number} Q{i}", item) for i, item in enumerate(yaml.safe_load(block), 1)]
    return items


def test_correct_choice_is_never_much_longer_than_every_distractor():
    """A right answer that is the one long, careful choice gives itself away; no right answer
    may be more than 1.3 times as long (as shown) as the longest wrong one."""
    too_long = []
    for where, choices in zip((where for where, _ in quiz_items()), QUESTIONS, strict=True):
        right = len(next(text for correct, text in choices if correct))
        longest_wrong = max(len(text) for correct, text in choices if not correct)
        if right > 1.3 * longest_wrong:
            too_long.append(f"{where}: {right} against {longest_wrong} characters")
    assert not too_long, too_long


def test_every_choice_explains_itself():
    """The right choice says why it is right; each wrong one opens by naming the learner's
    mistake it stands for ("That confuses ...", "That forgets ..."), then corrects it."""
    unexplained = [f"{where}: {choice['text']!r}" for where, item in quiz_items() for choice in item["choices"]
                   if len(str(choice.get("why") or "").split()) < 5]
    assert not unexplained, unexplained
    unnamed = [f"{where}: {choice['text']!r}" for where, item in quiz_items() for choice in item["choices"]
               if not choice.get("correct") and not str(choice["why"]).startswith("That ")]
    assert not unnamed, unnamed
