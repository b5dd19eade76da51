"""The chapter renderer over the real content: every chapter renders, every glossary
mark resolves, every quiz is complete, and the pages route as documented."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("markdown_it")
pytest.importorskip("jinja2")
pytest.importorskip("frontmatter")

from kvscope.server.pages import (PARTS, ContentError, RenderError, Site, load_glossary,  # noqa: E402
                                      make_markdown, render_markdown)
from kvscope.server.pages.markdown import VALUE_KEYS, WIDGET_TAGS  # noqa: E402

SITE = Site()
CHAPTERS = SITE.chapter_list()


def render(text: str):
    return render_markdown(make_markdown(), text, SITE.glossary, "test.md")


def test_twenty_one_chapters_in_four_parts():
    assert [c.number for c in CHAPTERS] == list(range(1, 22))
    for chapter in CHAPTERS:
        assert chapter.number in PARTS[chapter.part][1], chapter.slug
        assert chapter.title and chapter.summary


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.slug)
def test_chapter_renders(chapter):
    rendered = render_markdown(make_markdown(), chapter.body, SITE.glossary, chapter.path.name)
    html = rendered.html
    assert "[[" not in html, "an unrendered glossary mark"
    assert rendered.terms_used, "a chapter marks its glossary terms"
    assert rendered.has_quiz
    quiz = re.search(r"<kv-quiz .*?</kv-quiz>", html, re.S).group(0)
    questions = quiz.count('class="kv-quiz__question"')
    assert questions >= 3
    assert quiz.count('data-correct="true"') == questions
    assert quiz.count('class="kv-quiz__why"') == quiz.count('class="kv-quiz__choice"')
    assert rendered.headings[-1][1] == "Check yourself"
    for tag in rendered.widgets:
        assert tag in WIDGET_TAGS
        assert f"<p><{tag}" not in html, "a widget must not sit inside a paragraph"
    for key in re.findall(r'<kv-value key="([^"]+)"', html):
        assert key in VALUE_KEYS


def test_every_widget_is_placed_somewhere():
    used = set()
    for chapter in CHAPTERS:
        used.update(render_markdown(make_markdown(), chapter.body, SITE.glossary, chapter.path.name).widgets)
    assert used == WIDGET_TAGS


def test_term_lookup_is_case_insensitive_and_knows_aliases():
    html = render("[[KV Cache]] and [[the cache|kv cache]] and [[Throughput]]").html
    assert html.count("<kv-term") == 3
    assert 'data-term="KV cache"' in html
    assert ">the cache<span" in html
    assert 'tabindex="0"' in html and 'role="tooltip"' in html
    ids = re.findall(r'aria-describedby="([^"]+)"', html)
    assert len(set(ids)) == 3 and all(f'id="{i}"' in html for i in ids)


def test_unknown_term_is_an_error():
    with pytest.raises(RenderError, match="unknown glossary term"):
        render("Some [[flux capacitor]] here.")


def test_terms_are_not_marked_inside_code():
    assert "<kv-term" not in render("`[[KV cache]]`").html


def test_term_text_is_escaped():
    html = render("[[<b>x</b>|KV cache]]").html
    assert "<b>" not in html and "&lt;b&gt;" in html


def test_bad_quiz_is_an_error():
    two_questions = "```quiz\n" + "- q: Q?\n  choices:\n    - {text: a, correct: true, why: w}\n    - {text: b, why: w}\n" * 2 + "```\n"
    with pytest.raises(RenderError, match="at least 3"):
        render(two_questions)
    no_why = "```quiz\n" + "- q: Q?\n  choices:\n    - {text: a, correct: true}\n    - {text: b, why: w}\n" * 3 + "```\n"
    with pytest.raises(RenderError, match="needs `text` and `why`"):
        render(no_why)


def test_unknown_value_key_and_widget_are_errors():
    with pytest.raises(RenderError, match="not a key"):
        render('<kv-value key="model.colour"></kv-value>')
    with pytest.raises(RenderError, match="unknown widget"):
        render("<kv-flux></kv-flux>\n")


def test_widget_line_becomes_a_block_with_its_attributes():
    html = render('Text.\n\n<kv-cache-view prompt="The cat"></kv-cache-view>\n\nMore.').html
    assert '<kv-cache-view class="kv-widget" prompt="The cat"></kv-cache-view>' in html


def test_duplicate_glossary_names_are_an_error(tmp_path):
    (tmp_path / "glossary").mkdir()
    (tmp_path / "glossary" / "a.yaml").write_text(
        "- {term: token, short: a}\n- {term: piece, aliases: [Token], short: b}\n")
    with pytest.raises(ContentError, match="names both"):
        load_glossary(tmp_path)


def test_pages_route():
    fastapi = pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from kvscope.server.pages.routes import mount_pages
    app = fastapi.FastAPI()
    mount_pages(app, SITE)
    client = TestClient(app)
    home = client.get("/")
    assert home.status_code == 200
    assert home.text.count('class="kv-toc__title"') == 21
    chapter = client.get("/chapters/12-the-kv-cache")
    assert chapter.status_code == 200
    assert '<kv-cache-view class="kv-widget"' in chapter.text
    assert 'rel="prev"' in chapter.text and 'rel="next"' in chapter.text
    assert 'data-recording="' in chapter.text
    assert client.get("/chapters/12", follow_redirects=False).headers["location"] == "/chapters/12-the-kv-cache"
    missing = client.get("/chapters/99-nothing")
    assert missing.status_code == 404 and "There is no page here" in missing.text
    glossary = client.get("/glossary")
    assert glossary.status_code == 200
    assert glossary.text.count("<dt id=") == len(SITE.glossary.terms)
    assert 'href="/chapters/12-the-kv-cache"' in glossary.text


def test_pages_module_imports_no_engine():
    import subprocess
    import sys
    code = ("import sys, kvscope.server.pages.routes; "
            "heavy = [m for m in ('torch', 'kvscope.engine', 'transformers') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_static_export(tmp_path):
    from kvscope.server.pages import export_static_site
    out = export_static_site(tmp_path / "site", SITE)
    assert (out / "index.html").exists()
    assert (out / "chapters" / "12-the-kv-cache" / "index.html").exists()
    assert (out / "glossary" / "index.html").exists()
    assert (out / "static" / "js" / "client.js").exists()
    assert not (out / "static" / "templates").exists()
