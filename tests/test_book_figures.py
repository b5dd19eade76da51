"""Diagrams are figures, not text art: no chapter draws with characters in a code block,
every figure a chapter places exists and is accessible (title and desc) and themed."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("markdown_it")

from kvscope.server.pages import Site, frontend_dir  # noqa: E402

SITE = Site()
CHAPTERS = SITE.chapter_list()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# Text art: box drawing (U+2500–257F), block elements and geometric shapes (U+2580–25FF),
# arrows (U+2190–21FF, U+27F0–27FF), ASCII arrows, and matrix or table bars (two "|" on a line).
ART = re.compile(r"[\u2500-\u25ff\u2190-\u21ff\u27f0-\u27ff]|->|<-|=>|\+--|--\+|\|.*\|")
CODE_LANGUAGES = {"bash", "sh", "console", "python", "json", "http", "text", "quiz"}


def text_art_blocks(body: str) -> list[str]:
    return [code for lang, code in FENCE.findall(body) if lang not in CODE_LANGUAGES and ART.search(code)]


def test_the_heuristic_catches_text_art():
    assert text_art_blocks("```\nA -> B\n```\n")
    assert text_art_blocks("```\n  A   ■  ■\n```\n")
    assert text_art_blocks("```\nW = | 1  0 |\n    | 0  1 |\n```\n")
    assert text_art_blocks("```\n┌──┐\n```\n")
    assert not text_art_blocks("```\nslot = block_table[9 ÷ 4] × 4 + (9 mod 4)\n```\n")
    assert not text_art_blocks("```bash\nkvscope generate | head\n```\n")


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.slug)
def test_no_text_diagram_in_a_code_block(chapter):
    assert text_art_blocks(chapter.body) == []


def test_figures_are_placed_accessible_and_themed():
    figures = sorted((frontend_dir() / "figures").glob("*.svg"))
    assert len(figures) >= 10
    placed = set()
    for chapter in CHAPTERS:
        placed.update(re.findall(r"^!\[[^\]]+\]\(figures/([a-z0-9-]+)\.svg\)\s*$", chapter.body, re.M))
    assert placed == {f.stem for f in figures}, "every figure is placed, and every placed figure exists"
    for figure in figures:
        svg = figure.read_text(encoding="utf-8")
        assert re.search(r"<title id=\"[^\"]+\">[^<]{8,}</title>", svg), figure.name
        assert re.search(r"<desc id=\"[^\"]+\">[^<]{40,}</desc>", svg), figure.name
        assert 'role="img"' in svg and "aria-labelledby" in svg
        assert "var(--kv-fg" in svg and "var(--kv-bg" in svg, "colours come from the theme"
        assert not re.search(r'(fill|stroke)="#', svg), "no fixed colour attributes: dark mode must reach them"


def test_figure_is_inlined_in_the_page():
    chapter = next(c for c in CHAPTERS if c.number == 14)
    html = SITE.chapter(chapter)
    figure = re.search(r'<figure class="kv-figure" id="figure-batching-static"><svg .*?</svg><figcaption>[^<]+</figcaption></figure>',
                       html, re.S)
    assert figure and "<title id=" in figure.group(0)


def test_make_figures_is_up_to_date(tmp_path, monkeypatch):
    """The committed SVGs are what scripts/make_figures.py draws now."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_figures", Path(__file__).parents[1] / "scripts" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_figures", module)   # dataclasses look their module up
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path)
    module.main()
    for drawn in tmp_path.glob("*.svg"):
        assert drawn.read_text() == (frontend_dir() / "figures" / drawn.name).read_text(), drawn.name
