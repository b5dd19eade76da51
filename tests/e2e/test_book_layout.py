"""The book's pages as a reader sees them at 1280 px: code blocks stay inside the text
column, figures are drawn (inline SVG, themed) and fit, and a chapter without a widget
is centred instead of leaving the right of the page empty. Screenshots of a few
chapters with figures, light, dark and at 768 px."""
from __future__ import annotations

import pytest

from kvscope.server.pages import Site

CHAPTERS = Site().chapter_list()
MEASURE = """() => {
  const prose = document.querySelector('.kv-prose');
  const column = prose.querySelector(':scope > p').getBoundingClientRect();
  const out = (el) => el.getBoundingClientRect().right > column.right + 1;
  const article = document.querySelector('.kv-chapter').getBoundingClientRect();
  return {
    overflowingCode: [...prose.querySelectorAll(':scope > pre')].filter(out).map((el) => el.textContent.slice(0, 40)),
    overflowingFigures: [...prose.querySelectorAll('figure.kv-figure')].filter(out).map((el) => el.id),
    figuresDrawn: [...prose.querySelectorAll('figure.kv-figure svg')].every((svg) => svg.getBBox().width > 100),
    textOnly: document.querySelector('.kv-chapter--text-only') !== null,
    leftGap: article.left, rightGap: innerWidth - article.right,
  };
}"""


def test_every_chapter_keeps_code_and_figures_in_the_column(new_page, static_site):
    page = new_page()
    for chapter in CHAPTERS:
        page.goto(f"{static_site}/chapters/{chapter.slug}/")
        layout = page.evaluate(MEASURE)
        assert layout["overflowingCode"] == [], chapter.slug
        assert layout["overflowingFigures"] == [], chapter.slug
        assert layout["figuresDrawn"], chapter.slug
        if layout["textOnly"]:
            assert abs(layout["leftGap"] - layout["rightGap"]) < 40, (chapter.slug, layout)


@pytest.mark.parametrize("slug, figure", [("14-continuous-batching", "batching-static"),
                                          ("17-chunked-prefill", "chunked-prefill-timeline"),
                                          ("21-recap-and-further-reading", "serving-processes")])
@pytest.mark.parametrize("look", ["light", "dark", "narrow"])
def test_figure_screenshots(new_page, static_site, screenshot, slug, figure, look):
    page = new_page(color_scheme="dark" if look == "dark" else "light",
                    viewport={"width": 768 if look == "narrow" else 1280, "height": 900})
    page.goto(f"{static_site}/chapters/{slug}/")
    element = page.locator(f"#figure-{figure}")
    element.scroll_into_view_if_needed()
    # The theme reaches the inline SVG: its text takes the page's foreground colour.
    colours = page.evaluate("""(id) => {
      const text = document.querySelector('#' + id + ' svg text:not(.kvf-soft):not(.kvf-on-light):not(.kvf-on-dark)');
      return [getComputedStyle(text).fill, getComputedStyle(document.body).color];
    }""", f"figure-{figure}")
    assert colours[0] == colours[1]
    box = element.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= page.viewport_size["width"]
    screenshot(page, f"figure-{figure}-{look}")
