"""The page shell in a real Chromium against the real server: every page loads clean,
glossary tooltips open on keyboard focus, live numbers match `hello`, the quiz works by
keyboard, and with no backend a page replays a recording and says so."""
from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from kvscope.server.pages import Site

SITE = Site()
CHAPTERS = SITE.chapter_list()
PAGES = ["/", "/glossary"] + [c.url for c in CHAPTERS]
REPLAY_TEXT = "Replaying a recording — no live engine"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _slug(url: str) -> str:
    return url.strip("/").replace("/", "-") or "home"


@pytest.mark.parametrize("url", PAGES, ids=_slug)
def test_page_loads_without_errors(page, live_server, screenshot, assert_clean, wait_for_widgets, url):
    response = page.goto(live_server + url)
    assert response.status == 200
    page.wait_for_function("() => window.kvscope && kvscope.client.mode === 'live' && kvscope.client.hello")
    tags = wait_for_widgets(page)
    page.wait_for_timeout(300)   # late errors from a widget's first events
    assert_clean(page)
    assert page.locator(".kv-badge").inner_text().startswith("Live engine")
    for index, tag in enumerate(tags):
        widget = page.locator(tag).first
        widget.scroll_into_view_if_needed()
        screenshot(widget, f"page-{_slug(url)}-{tag}-{index}")


def test_home_lists_all_chapters_in_four_parts(page, live_server, assert_clean):
    page.goto(live_server + "/")
    parts = page.locator(".kv-toc__part")
    assert parts.count() == 4
    assert [parts.nth(i).locator("h2").inner_text() for i in range(4)] == [
        "Part 1: Foundations", "Part 2: How serving works", "Part 3: Engine internals", "Part 4: Scaling out"]
    assert [parts.nth(i).locator("li").count() for i in range(4)] == [10, 4, 4, 3]
    links = page.locator(".kv-toc__title")
    assert links.count() == 21
    assert links.nth(11).get_attribute("href") == "/chapters/12-the-kv-cache"
    assert page.locator(".kv-toc__summary").count() == 21
    assert_clean(page)


def test_previous_next_links_and_not_found(page, live_server):
    page.goto(live_server + "/chapters/12-the-kv-cache")
    assert page.locator("a[rel=prev]").get_attribute("href") == "/chapters/11-prefill-and-decode"
    assert page.locator("a[rel=next]").get_attribute("href") == "/chapters/13-gpu-memory-hierarchy"
    page.goto(live_server + "/chapters/01-what-is-an-llm")
    assert page.locator("a[rel=prev]").count() == 0
    response = page.goto(live_server + "/chapters/99-no-such-chapter")
    assert response.status == 404
    assert "There is no page here" in page.locator("h1").inner_text()


def test_glossary_tooltip_appears_on_keyboard_focus(page, live_server, screenshot, assert_clean):
    page.goto(live_server + "/chapters/12-the-kv-cache")
    page.wait_for_function("() => window.kvscope && kvscope.client.hello")
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.localName") == "kv-term":
            break
    else:
        pytest.fail("Tab never reached a glossary term")
    term = page.locator("kv-term:focus")
    name = term.get_attribute("data-term")
    tip = term.locator(".kv-term__tip")
    assert tip.is_visible()
    assert tip.get_attribute("role") == "tooltip"
    assert term.get_attribute("aria-describedby") == tip.get_attribute("id")
    expected = SITE.glossary.lookup(name).short
    assert expected in tip.inner_text()
    screenshot(page, "tooltip-on-focus")
    page.keyboard.press("Escape")
    assert not tip.is_visible()
    page.keyboard.press("Tab")
    page.keyboard.press("Shift+Tab")
    assert page.locator("kv-term:focus .kv-term__tip").is_visible()
    assert_clean(page)


def test_glossary_tooltip_appears_on_hover(page, live_server):
    page.goto(live_server + "/chapters/04-attention")
    term = page.locator("kv-term").first
    term.hover()
    assert term.locator(".kv-term__tip").is_visible()


def test_live_values_match_hello(page, live_server):
    page.goto(live_server + "/chapters/12-the-kv-cache")
    page.wait_for_function("() => window.kvscope && kvscope.client.hello")
    page.wait_for_function("() => [...document.querySelectorAll('kv-value')].every(v => v.dataset.state === 'known')")
    hello = page.evaluate("() => kvscope.client.hello")
    values = page.evaluate("""() => [...document.querySelectorAll('kv-value')].map(v => ({
        key: v.getAttribute('key'), format: v.getAttribute('format') || 'int', text: v.textContent}))""")
    assert len(values) >= 10
    for value in values:
        section, field = value["key"].split(".")
        raw = hello[section][field]
        if value["format"] == "text":
            assert value["text"] == str(raw), value
        elif value["format"] == "bytes":
            number, unit = re.fullmatch(r"([\d.,]+) (bytes|KiB|MiB|GiB|TiB)", value["text"]).groups()
            scale = {"bytes": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}[unit]
            assert abs(float(number.replace(",", "")) * scale - raw) <= 0.01 * raw + 1, value
        elif isinstance(raw, int) and not isinstance(raw, bool):
            assert value["text"] == f"{raw:,}", value
    # The page's own worked example: 2 × layers × KV heads × head_dim × bytes.
    model = hello["model"]
    assert model["kv_bytes_per_token"] == 2 * model["num_layers"] * model["num_kv_heads"] * model["head_dim"] * model["dtype_bytes"]


def test_quiz_by_keyboard_shows_every_why(page, live_server, screenshot, assert_clean):
    page.goto(live_server + "/chapters/12-the-kv-cache")
    quiz = page.locator("kv-quiz")
    assert quiz.locator(".kv-quiz__question").count() >= 3
    first = quiz.locator(".kv-quiz__question").first
    # Reach the quiz with the keyboard: focus the heading before it, then Tab into the radio group.
    page.locator("#check-yourself").evaluate("h => { h.tabIndex = -1; h.focus(); }")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.type") == "radio"
    # The choices are shuffled: find the right one, then arrow to a wrong one (the focus starts on the first).
    correct = first.locator(".kv-quiz__choice").evaluate_all(
        "items => items.findIndex(li => li.dataset.correct === 'true')")
    wrong = 1 if correct != 1 else 2
    for _ in range(wrong):
        page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")               # check
    whys = first.locator(".kv-quiz__why")
    assert whys.count() >= 2
    for i in range(whys.count()):
        assert whys.nth(i).is_visible()
    chosen = first.locator(".kv-quiz__choice[data-chosen]")
    assert chosen.get_attribute("data-correct") == "false"
    assert "Wrong (your answer)" in chosen.locator(".kv-quiz__why").inner_text()
    assert "Not quite" in first.locator(".kv-quiz__feedback").inner_text()
    # Space on the "Check answer" button works too.
    for _ in range(abs(wrong - correct)):
        page.keyboard.press("ArrowUp" if correct < wrong else "ArrowDown")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.className").startswith("kv-button kv-quiz__check")
    page.keyboard.press("Space")
    assert "Correct" in first.locator(".kv-quiz__feedback").inner_text()
    screenshot(first, "quiz-answered")
    assert_clean(page)


def test_replay_without_backend(new_page, static_site, screenshot):
    page = new_page()
    page.goto(static_site + "/chapters/15-paged-attention/")
    badge = page.get_by_role("status").filter(has_text=REPLAY_TEXT)
    badge.wait_for(state="visible", timeout=15000)
    page.wait_for_function("() => kvscope.client.hello && kvscope.client.replay.state.loaded")
    assert page.evaluate("() => kvscope.client.mode") == "replay"
    assert page.evaluate("() => kvscope.client.session.replay") is True
    # Numbers come from the recording's hello.
    page.wait_for_function("() => [...document.querySelectorAll('kv-value')].every(v => v.dataset.state === 'known')")
    # Commands that need the engine say so.
    code = page.evaluate("() => kvscope.client.command('tokenize', {text: 'hi'}).then(() => 'ok', e => e.code)")
    assert code == "replay"
    # The replay controls work from the keyboard: Pause, then Step advances one engine step.
    controls = page.get_by_role("group", name="Replay controls")
    assert controls.is_visible()
    play = controls.get_by_role("button", name=re.compile("(Pause|Play) the replay"))
    play.focus()
    if play.get_attribute("aria-label") == "Pause the replay":
        page.keyboard.press("Enter")
    assert play.get_attribute("aria-label") == "Play the replay"
    before = page.evaluate("() => kvscope.client.stats.byType.step || 0")
    page.evaluate("() => kvscope.client.subscribe(['step'])")
    page.keyboard.press("Tab")                 # to Step
    page.keyboard.press("Enter")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => (kvscope.client.stats.byType.step || 0) > {before}")
    screenshot(page, "replay-badge")
    problems = [p for p in page.kv_problems if "WebSocket" not in p and "/ws" not in p]
    assert not problems, problems


def test_server_stopped_while_page_open_replays(page, recordings, own_server, tmp_path):
    """A page open on a live server keeps working when the server stops: the client
    falls back to the page's recording (fetched quietly while live) and says so."""
    frontend = tmp_path / "frontend"
    shutil.copytree(SITE.frontend, frontend)
    shutil.copytree(recordings, frontend / "recordings", dirs_exist_ok=True)
    url, stop = own_server(tmp_path, {"KVSCOPE_FRONTEND_DIR": str(frontend)})
    page.goto(url + "/chapters/12-the-kv-cache")
    page.wait_for_function("() => window.kvscope && kvscope.client.mode === 'live'")
    page.wait_for_function("() => kvscope.client._recordingText !== null", timeout=15000)
    stop()
    stopped = time.monotonic()
    page.get_by_role("status").filter(has_text=REPLAY_TEXT).wait_for(state="visible", timeout=15000)
    page.wait_for_function("() => kvscope.client.replay.state.loaded && kvscope.client.session.replay")
    print(f"replaying {time.monotonic() - stopped:.2f} s after the server stopped")
    assert page.locator("kv-value[data-state=known]").count() > 0


def test_layout_at_768px_and_dark_mode(new_page, live_server, screenshot, assert_clean, wait_for_widgets):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark", reduced_motion="reduce")
    page.goto(live_server + "/chapters/15-paged-attention")
    page.wait_for_function("() => window.kvscope && kvscope.client.hello")
    wait_for_widgets(page)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 768
    background = page.evaluate("() => getComputedStyle(document.documentElement).backgroundColor")
    assert background == "rgb(21, 23, 27)"
    assert page.evaluate("() => getComputedStyle(document.querySelector('.kv-button') || document.body).transitionDuration") in ("0s", "")
    screenshot(page, "chapter-15-768px-dark")
    assert_clean(page)


def test_first_widget_paint_and_update_rate(page, live_server, instructor, assert_clean):
    """Measures what the note reports: time to first widget paint on localhost, and the
    events/s the client handles (and widget renders/s) under a live stream."""
    page.goto(live_server + "/chapters/15-paged-attention")
    page.wait_for_function("() => performance.getEntriesByName('kv:first-widget-paint').length > 0", timeout=15000)
    paint_ms = page.evaluate("() => performance.getEntriesByName('kv:first-widget-paint')[0].startTime")
    dom_ms = page.evaluate("() => performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
    page.evaluate("() => kvscope.client.subscribe(['step', 'kv', 'request', 'memory'])")
    page.wait_for_timeout(500)
    start = page.evaluate("() => ({events: kvscope.client.stats.events, renders: kvscope.client.stats.renders, t: performance.now()})")
    instructor({"type": "inject", "n": 16, "max_tokens": 48, "prompt_tokens": 32}, until="inject")
    page.wait_for_timeout(5000)
    end = page.evaluate("() => ({events: kvscope.client.stats.events, renders: kvscope.client.stats.renders, t: performance.now()})")
    seconds = (end["t"] - start["t"]) / 1000
    result = {
        "first_widget_paint_ms": round(paint_ms, 1),
        "dom_content_loaded_ms": round(dom_ms, 1),
        "events_per_s": round((end["events"] - start["events"]) / seconds, 1),
        "widget_renders_per_s": round((end["renders"] - start["renders"]) / seconds, 1),
        "window_s": round(seconds, 2),
    }
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "page-performance.json").write_text(json.dumps(result, indent=2))
    print("page performance:", result)
    assert paint_ms < 5000
    assert result["events_per_s"] > 1
    assert_clean(page)
