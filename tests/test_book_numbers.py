"""Every figure in the book is live, computed or cited (issue 28). The ledger, what each
figure is and how it is covered, is tests/book_ledger.py; these tests recompute the worked
figures, check the measured ones against docs/benchmarks.md, and fail on any figure in a
chapter, quiz or glossary entry that nothing covers."""
from __future__ import annotations

import math
import re

import pytest

pytest.importorskip("markdown_it")

from book_ledger import (BENCHMARKS, CHAPTERS, FIGURE, GLOSSARY_NOT_CLAIMS, GLOSSARY_WORKED, LIVE,  # noqa: E402
                         MEASURED, NOT_CLAIMS, NUMBER, Q, Q06_PARAMS, Q_LAYER_ATTENTION, Q_LAYER_MLP,
                         Q_LAYER_NORMS, SITE, WORKED, covered_in, masked, normal, pattern, uncovered, value,
                         written_as)


@pytest.mark.parametrize("measured", MEASURED, ids=lambda m: f"ch{m.chapter}:{m.template[:40]}")
def test_measured_figure_is_what_the_benchmarks_say(measured):
    source = re.search(measured.source, BENCHMARKS)
    assert source, f"docs/benchmarks.md no longer has {measured.source!r}"
    values = [value(v) for v in source.groups()]
    values = [values[i] for i in measured.order] if measured.order else values
    found = measured.matches()
    assert found, f"chapter {measured.chapter} no longer says {measured.template!r}"
    for match in found:
        for text, expected in zip(match.groups(), values):
            assert written_as(expected, text), f"chapter {measured.chapter}: {text} written, {expected} measured"


@pytest.mark.parametrize("worked", WORKED, ids=lambda w: f"ch{w.chapter}:{w.template[:40]}")
def test_worked_figure_recomputes(worked):
    found = worked.matches()
    assert found, f"chapter {worked.chapter} no longer says {worked.template!r}"
    for match in found:
        for text, expected in zip(match.groups(), worked.expected):
            assert written_as(expected, text), f"chapter {worked.chapter}: {text} written, {expected} computed"


def test_written_as_rounds_the_way_the_text_does():
    assert written_as(270_336, "270,000") and written_as(1.1921, "1.19") and written_as(610_351, "610,000")
    assert not written_as(270_336, "271,000") and not written_as(1.1921, "1.18") and not written_as(0.36, "0.3")
    assert written_as(-0.21, "−0.21") and written_as(3.15, "3.2") and written_as(2.25, "2.3")


def f3(x: float) -> str:
    return f"{x:.3f}".replace("-", "−")


def test_toy_examples_recompute():
    """The small examples worked by hand in chapters 3 to 9, from the inputs they show."""
    silu = lambda x: x / (1 + math.exp(-x))  # noqa: E731
    cat, dog, car, kitten = [0.9, 0.8, 0.1, 0.0], [0.8, 0.9, 0.0, 0.1], [0.1, 0.0, 0.9, 0.8], [0.9, 0.7, 0.0, 0.2]
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    norm = lambda a: math.sqrt(dot(a, a))  # noqa: E731
    ch3 = " ".join(CHAPTERS[3].split())
    assert f"cosine(cat, dog) = 1.44 / (1.208 × 1.208) ≈ {f3(dot(cat, dog) / norm(cat) / norm(dog))}" in ch3
    assert f"cosine(cat, car) = 0.18 / (1.208 × 1.208) ≈ {f3(dot(cat, car) / norm(cat) / norm(car))}" in ch3
    assert f"a dot product of {dot(cat, kitten):.2f}, a length of about {f3(norm(kitten))}" in ch3
    assert f"a cosine of about {f3(dot(cat, kitten) / norm(cat) / norm(kitten))}" in ch3
    assert f"is about {dot(cat, car) / norm(cat) / norm(car):.2f}, and of \" cat\" and \" dog\" about " \
           f"{dot(cat, dog) / norm(cat) / norm(dog):.2f}" in ch3
    # Chapter 4: the query of "sat" against three keys, scaled by √2, softmax, weighted values.
    scores = [s / math.sqrt(2) for s in (1, 2, 3)]
    weights = [math.exp(s) / sum(map(math.exp, scores)) for s in scores]
    ch4 = CHAPTERS[4]
    assert "   ".join(f"e^{s:.3f} = {math.exp(s):.3f}" for s in scores) in " ".join(ch4.split()).replace(" e^", "   e^")
    assert f"{weights[0]:.3f}" in ch4 and f"{weights[1]:.3f}" in ch4 and f"{weights[2]:.3f}" in ch4
    out = [round(weights[0], 3) * 10 + round(weights[2], 3) * 5, round(weights[1], 3) * 10 + round(weights[2], 3) * 5]
    assert f"= [{out[0]:.2f}, {out[1]:.2f}]" in ch4
    # Chapter 6: the same score after both vectors turn, at positions (3, 1) and (10, 8).
    ch6 = CHAPTERS[6]
    for q, k in ((1.5, 0.5), (5.0, 4.0)):
        assert f"[{f3(math.cos(q))}, {f3(math.sin(q))}]" in ch6.replace("[ ", "[")
        assert f"[{f3(math.cos(k))}, {f3(math.sin(k))}]" in ch6.replace("[ ", "[")
    assert ch6.count(f"= {math.cos(1.0):.3f}") == 2
    ch6 = " ".join(ch6.split())
    assert f"at distance 3 it is cos 1.5 ≈ {math.cos(1.5):.3f}" in ch6 and f"a radian is about {math.degrees(1):.0f} degrees" in ch6
    assert f"a full turn takes about {2 * math.pi / 0.5:.1f} positions, so at distance 12 the score is cos 6.0 ≈ {math.cos(6):.3f}" in ch6
    assert f"a full turn about every {2 * math.pi:.1f} tokens" in ch6
    # Chapter 2: a two-emoji glyph joined by an invisible joiner.
    astronaut = "\U0001F469\u200D\U0001F680"
    assert (len(astronaut), len(astronaut.encode())) == (3, 11) and "three characters, eleven bytes" in CHAPTERS[2]
    assert len("\U0001F642".encode()) == 4 and "is four bytes in UTF-8" in CHAPTERS[2]
    # Chapter 7: silu at a few points and the SwiGLU example.
    ch7 = " ".join(CHAPTERS[7].split())
    assert f"silu(g) = [{f3(silu(2))}, {f3(silu(-1))}, {f3(silu(2))}]" in ch7
    assert f"[0, {f3(round(silu(-1), 3) * 2)}, {f3(-round(silu(2), 3))}]" in ch7
    assert f"[{f3(-round(silu(2), 3))}, {f3(round(silu(-1), 3) * 2 - round(silu(2), 3))}]" in ch7
    assert f"silu(3) is about {silu(3):.2f}" in ch7
    # Chapter 19: a row times a matrix, whole and split by rows over two GPUs.
    x, w = [1, 2, 3, 4], [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]]
    y = [sum(x[i] * w[i][j] for i in range(4)) for j in range(4)]
    halves = [[sum(x[i] * w[i][j] for i in rows) for j in range(4)] for rows in ((0, 1), (2, 3))]
    ch19 = CHAPTERS[19]
    assert f"the answer is y = {y}" in ch19 and f"GPU 0 gets {y[:2]}, GPU 1 gets {y[2:]}" in ch19
    assert f"= {halves[0]}" in ch19 and f"= {halves[1]}" in ch19 and f"sum:{' ' * 42}{y}" in ch19
    # Chapter 8: RMSNorm of [3, −4, 0, 0] with gains [1, 0.5, 2, 1].
    rms = math.sqrt((9 + 16) / 4)
    assert f"RMS              √{rms ** 2} = {rms}" in CHAPTERS[8]
    assert f"= [{3 / rms}, {-4 / rms}, 0, 0]".replace("-", "−") in CHAPTERS[8]
    # Chapter 9: softmax ignores a constant added to every logit.
    probs = [math.exp(x) / sum(map(math.exp, (3.2, 1.0, -0.5))) for x in (3.2, 1.0, -0.5)]
    assert CHAPTERS[9].count(f"[{', '.join(f'{p:.3f}' for p in probs)}]") == 2


def test_chapter_9_parameter_table_recomputes():
    """The table that adds up Qwen3-0.6B's parameters, row by row."""
    h, i, d, heads, kv = Q["hidden_size"], Q["intermediate_size"], Q["head_dim"], Q["num_attention_heads"], Q["num_key_value_heads"]
    rows = {"embedding table": Q["vocab_size"] * h, "attention W_Q": h * heads * d, "W_K": h * kv * d, "W_V": h * kv * d,
            "W_O": heads * d * h, "MLP": Q_LAYER_MLP, "norms": Q_LAYER_NORMS,
            "one layer": Q_LAYER_ATTENTION + Q_LAYER_MLP + Q_LAYER_NORMS,
            "28 layers": Q["num_hidden_layers"] * (Q_LAYER_ATTENTION + Q_LAYER_MLP + Q_LAYER_NORMS), "final norm": h,
            "total": Q06_PARAMS}
    table = dict(re.findall(r"^[ ]*(embedding table|attention W_Q|W_K|W_V|W_O|MLP|norms|one layer|28 layers|final norm|total)"
                            r"\b.*[ ]{2,}(\d[\d,]*)[ ]*$", CHAPTERS[9], re.M))
    assert {k: value(v) for k, v in table.items()} == rows


def test_chapter_10_running_example_recomputes():
    """The four-token example: softmax, temperature rows, the cumulative line, top-p and min-p."""
    body = CHAPTERS[10]
    logits = [2.0, 1.0, 0.5, -1.0]

    def softmax(xs):
        e = [math.exp(x) for x in xs]
        return [v / sum(e) for v in e]

    def row(values, digits=3):
        return ", ".join((f"{v:.{digits}f}" if digits else str(v)).replace("-", "−") for v in values)

    p = softmax(logits)
    assert f"7.389 / {sum(math.exp(x) for x in logits):.3f} = {p[0]:.3f}" in body
    for t in (1, 0.5, 2):
        scaled = [x / t for x in logits]
        assert f"| {t} | {row(scaled, 0)} | {row(softmax(scaled))} |" in body, t
    edges = [sum(round(v, 3) for v in p[:i + 1]) for i in range(4)]   # the chapter adds the rounded figures
    assert f"0.000 to {edges[0]:.3f}" in body and f"{edges[0]:.3f} to {edges[1]:.3f}" in body
    assert f"{edges[1]:.3f} to {edges[2]:.3f}" in body and f"{edges[2]:.3f} to 1.000" in body
    assert f"+ 0.224 = {edges[1]:.3f} (enough)" in body and f"+ 0.136 = {edges[2]:.3f} (enough)" in body
    assert f"rescale to 0.609 / 0.833 = {p[0] / (p[0] + p[1]):.3f} and 0.224 / 0.833 = {p[1] / (p[0] + p[1]):.3f}" in body
    kept = p[:3]
    assert f"the other three rescale to {row([v / sum(kept) for v in kept])}".replace(", 0.140", " and 0.140") \
        in " ".join(body.split())
    hot = softmax([x / 2 for x in logits])
    assert f"At temperature 2 the top probability is {hot[0]:.3f}, so the bar drops to {0.1 * hot[0]:.3f}" \
        in " ".join(body.split()) and f"(now {hot[3]:.3f})" in body



@pytest.mark.parametrize("number", sorted(CHAPTERS))
def test_every_figure_is_live_computed_or_cited(number):
    missing = uncovered(number)
    assert not missing, "figures neither computed (WORKED), cited (a link in the paragraph) nor listed in NOT_CLAIMS:\n" + \
        "\n".join(map(str, missing))


def test_glossary_figures_are_their_chapters():
    """A glossary entry's tooltip repeats figures; each must be one its chapter computes or cites."""
    missing = []
    for entry in SITE.glossary.terms:
        text = masked(entry.short)
        found = [m.group(0) for m in FIGURE.finditer(text)]
        if found:
            covered = covered_in(entry.chapter)
            missing += [(entry.term, entry.chapter, f) for f in found if normal(f) not in covered
                        and (entry.term, f) not in GLOSSARY_NOT_CLAIMS and (entry.term, f) not in GLOSSARY_WORKED]
    assert not missing, missing
    for (term, figure), expected in GLOSSARY_WORKED.items():
        assert figure in SITE.glossary.lookup(term).short, (term, figure)
        assert written_as(expected, re.match(NUMBER, figure).group(0)), (term, figure, expected)


def test_the_check_can_fail():
    """An invented figure with no link, no recomputation and no reason is caught."""
    CHAPTERS[0] = ("A decode step on this GPU reads 7.7 GB/s and saves 12 % of the time.\n\n"
                   "Cited: 3 TB/s ([datasheet](https://example.com/sheet)).\n\n```python\nx = 5 ms\n```\n\n"
                   "- a list item with a link: 80 GB ([sheet](https://example.com/sheet));\n"
                   "- the next item is its own paragraph: 132 SMs, and again 3 TB/s.\n")
    try:
        assert [f.text for f in uncovered(0)] == ["7.7 GB/s", "12 %", "132"]
    finally:
        del CHAPTERS[0]


def test_every_allowed_phrase_is_still_in_its_chapter():
    for ch, phrase, reason in NOT_CLAIMS:
        assert reason and pattern(phrase).search(CHAPTERS[ch]), (ch, phrase)


def test_live_figures_sit_beside_their_widget():
    for ch, phrase, widget in LIVE:
        assert pattern(phrase).search(CHAPTERS[ch]) and f"<{widget}" in CHAPTERS[ch], (ch, phrase, widget)
