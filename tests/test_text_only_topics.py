"""Topics kvscope's engine does not run are marked "Text only" where the book explains them
(issue 28), and topics it does run, with a widget, are never marked so."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("markdown_it")
pytest.importorskip("jinja2")
pytest.importorskip("frontmatter")

from kvscope.server.pages import Site, make_markdown, render_markdown  # noqa: E402

SITE = Site()
MARKER = re.compile(r'<aside class="kv-aside kv-text-only" aria-label="Text only: ([^"]+)">(.*?)</aside>', re.S)

# (chapter, section id, a word of the topic the marker must name, a vLLM setting it points to)
TEXT_ONLY = [
    (12, "when-the-formula-does-not-hold", "latent", "kv_lora_rank"),
    (12, "hybrid-models-a-state-instead-of-a-cache", "hybrid", "--mamba-cache-dtype"),
    (14, "overlapping-the-cpus-work-with-the-gpus", "asynchronous", "--async-scheduling"),
    (15, "one-long-sequence-many-programs-flash-decoding", "flash-decoding", "flash_attn_max_num_splits_for_cuda_graph"),
    (15, "layers-with-different-needs", "hybrid", "--disable-hybrid-kv-cache-manager"),
    (19, "mixture-of-experts-expert-parallelism", "expert", "--enable-expert-parallel"),
    (20, "separating-prefill-from-decode", "disaggregated", "--kv-transfer-config"),
    (20, "the-same-prompt-alone-or-in-a-crowd-batch-invariance", "batch-invariant", "VLLM_BATCH_INVARIANT=1"),
    (21, "the-wider-landscape", "LoRA", "--enable-lora"),
    (21, "one-process-or-several", "processes", "--api-server-count"),
]

# (chapter, widget, words that name the topic the widget shows live)
LIVE = [
    (10, "kv-sampling", ("structured", "grammar", "mask")),
    (12, "kv-quant-cache", ("quantiz", "kv_cache_dtype", "8-bit")),
    (14, "kv-step-plan", ("step plan", "token budget", "scheduler's plan")),
    (16, "kv-pages", ("prefix cach", "hit rate", "cache_salt isolat")),
]


def rendered(number: int) -> str:
    chapter = next(c for c in SITE.chapter_list() if c.number == number)
    return render_markdown(make_markdown(), chapter.body, SITE.glossary, chapter.path.name).html


def sections(html: str) -> dict[str, str]:
    """Each h2 section's HTML, by the heading's id."""
    parts = re.split(r'<h2 id="([^"]+)">', html)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("number, section, topic, setting", TEXT_ONLY, ids=lambda v: str(v))
def test_topic_without_an_engine_is_marked_text_only_at_its_section(number, section, topic, setting):
    html = sections(rendered(number))[section]
    marks = MARKER.findall(html)
    assert len(marks) == 1, f"chapter {number}, #{section}: {len(marks)} text-only markers"
    label, body = marks[0]
    assert topic.lower() in label.lower(), f"the marker's accessible name does not name the topic: {label!r}"
    assert "<strong>Text only" in body
    assert "kvscope" in body, "the marker says why kvscope's engine does not show it"
    assert f"<code>{setting}</code>" in body, "the marker says where to see it for real"


def test_no_other_section_is_marked_text_only():
    marked = set()
    for chapter in SITE.chapter_list():
        for section, html in sections(rendered(chapter.number)).items():
            if "kv-text-only" in html:
                marked.add((chapter.number, section))
    assert marked == {(number, section) for number, section, _, _ in TEXT_ONLY}


@pytest.mark.parametrize("number, widget, words", LIVE, ids=lambda v: str(v))
def test_topic_with_a_widget_is_not_marked_text_only(number, widget, words):
    html = rendered(number)
    assert f"<{widget}" in html, f"chapter {number} no longer places <{widget}>"
    for label, body in MARKER.findall(html):
        text = (label + " " + body).lower()
        assert not [w for w in words if w.lower() in text], f"a text-only marker in chapter {number} names a live topic"
    # A marker sharing the widget's section is about the text above: a paragraph separates it from the widget.
    before = html[:html.index(f"<{widget}")]
    if "kv-text-only" in before[before.rfind("<h2"):]:
        assert "<p>" in before[before.rindex("kv-text-only"):].split("</aside>", 1)[1], \
            f"<{widget}> sits directly under a text-only marker"
