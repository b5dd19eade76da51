"""The exported book with no server of ours running: from a static file server (under a
sub-folder, so every link must be relative) and opened straight from the disk (file://).
Every page loads styled with no failed request and no console error; replay widgets advance."""
from __future__ import annotations

import functools
import http.server
import threading

import pytest

from kvscope.server.pages import Site, export_static_site

WIDGET_CHAPTERS = ["15-paged-attention", "12-the-kv-cache"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        """No line per file served in the test output."""


@pytest.fixture(scope="module")
def book(tmp_path_factory, recordings):
    root = tmp_path_factory.mktemp("host")
    export_static_site(root / "book", Site(recordings=recordings))
    return root / "book"


@pytest.fixture(scope="module", params=["http", "file"])
def base(request, book):
    """The book's top-level URL, ending in '/', from a static host or from the disk."""
    if request.param == "file":
        yield book.as_uri() + "/"
        return
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(book.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/book/"
    finally:
        server.shutdown()
        server.server_close()


def page_urls(base: str) -> list[str]:
    return [base + "index.html", base + "glossary/index.html"] + [
        f"{base}chapters/{c.slug}/index.html" for c in Site().chapter_list()]


def test_every_page_loads_styled_and_clean(new_page, base, assert_clean):
    page = new_page()
    for url in page_urls(base):
        page.goto(url)
        page.wait_for_function("() => window.kvscope && kvscope.client.hello")
        styled = page.evaluate("""() => [getComputedStyle(document.documentElement).getPropertyValue('--kv-bg').trim(),
                                         getComputedStyle(document.querySelector('.kv-site-header')).display]""")
        assert styled[0] and styled[1] == "flex", url
        assert page.evaluate("() => kvscope.client.mode") == "replay", url
        assert page.locator("kv-connection").get_by_text("Replaying a recording").is_visible(), url
        assert_clean(page)
    # The links lead on from page to page.
    page.goto(base + "index.html")
    page.locator(".kv-toc__title").first.click()
    page.wait_for_url("**/chapters/01-*/index.html")
    page.get_by_role("link", name="Glossary").click()
    page.wait_for_url("**/glossary/index.html")
    assert_clean(page)


@pytest.mark.parametrize("slug", WIDGET_CHAPTERS)
def test_replay_widgets_advance(new_page, base, slug, assert_clean):
    page = new_page()
    page.goto(f"{base}chapters/{slug}/index.html")
    page.wait_for_selector(".kv-widget[data-painted]", state="attached", timeout=15000)
    page.wait_for_function("() => kvscope.client.stats.events > 0")
    first = page.evaluate("() => kvscope.client.stats.events")
    page.wait_for_function("(n) => kvscope.client.stats.events > n + 5", arg=first, timeout=15000)
    assert_clean(page)


def test_glossary_tip_stays_out_of_the_sentence_without_styles(new_page, book):
    page = new_page()
    page.route("**/*.css", lambda route: route.abort())
    page.goto((book / "chapters" / "12-the-kv-cache" / "index.html").as_uri())
    term = page.locator("kv-term").first
    assert term.locator(".kv-term__tip").is_hidden()
    assert term.inner_text() == term.evaluate("el => el.firstChild.textContent")
