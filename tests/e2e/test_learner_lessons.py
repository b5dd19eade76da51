"""What a learner alone on a default `kvscope serve` sees, over time, in the widgets whose
lesson depends on a measurement (issue 25, part A): the numbers the chapter promises, and
the direction they move in.

- chapter 20: throughput rises with the number of requests in flight (the server drives the
  run, so the learner's submit limit is never what is measured); labels and columns fit;
- chapter 11: full speed by default; slowed only when asked, and then it says so;
- chapter 14: the burst of 3 starts in one step and lasts long enough to watch;
- chapter 17: the learner's own prompt, chunked and unchunked, with the decode gap of each;
- chapter 12: Enter on Start leaves focus where N works;
- slow motion survives pause and resume and shows on a learner page;
- the projector: tidy when idle, no sandbox, a burst the room can follow."""
from __future__ import annotations

import statistics

import pytest
from playwright.sync_api import expect

from widget_checks import wait_idle

LIVE = "() => window.kvscope && window.kvscope.client.mode === 'live'"
# sideways scrolling anywhere in a widget: its body and any scroller inside
ERROR = "el.querySelector('.kvw-error').textContent"
OVERFLOW = "el => [...el.querySelectorAll('.kv-widget__body, .kvw-scroll')].map(s => s.scrollWidth - s.clientWidth)"


def open_chapter(page, url: str, chapter: str, tag: str):
    page.goto(f"{url}/chapters/{chapter}")
    page.wait_for_function(LIVE)
    widget = page.locator(tag).first
    widget.scroll_into_view_if_needed()
    return widget


def overlaps(boxes: list[dict]) -> bool:
    return any(a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and
               a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]
               for i, a in enumerate(boxes) for b in boxes[i + 1:])


def fits_at_768(page, widget, screenshot, name: str) -> None:
    """On a 768 px screen the widget still fits: nothing scrolls sideways."""
    page.set_viewport_size({"width": 768, "height": 1000})
    widget.scroll_into_view_if_needed()
    assert max(widget.evaluate(OVERFLOW)) <= 1
    screenshot(widget, name)


# -- chapter 20 ----------------------------------------------------------------------------
def test_throughput_rises_with_concurrency(page, new_page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_chapter(page, live_server, "20-throughput-vs-latency", "kv-throughput")
    handle = widget.element_handle()
    assert "one submit" in widget.locator(".ktp-measured").inner_text()
    widget.get_by_label("Most requests in flight").fill("8")
    assert widget.locator(".ktp-cap").is_hidden()   # 8 is within a learner's cap: nothing to say
    widget.get_by_label("Tokens each").fill("16")
    run = widget.get_by_role("button", name="Run the sweep")
    run.focus()
    page.keyboard.press("Enter")
    page.wait_for_function(f"el => Number(el.dataset.points || 0) === 4 || {ERROR}", arg=handle, timeout=120000)
    assert not widget.locator(".kvw-error").inner_text()
    assert page.evaluate("() => document.activeElement.textContent") == "Run the sweep"   # focus stayed on Run
    points = widget.evaluate("el => el.exportData().points")
    assert [(p["concurrency"], p["requests"]) for p in points] == [(1, 4), (2, 4), (4, 8), (8, 16)]
    # A batch of 8 decodes costs the engine little more than a batch of 1 (step times swing by
    # 2x and more on a loaded machine, so only the ends of the sweep are compared)
    assert points[-1]["throughput"] > 1.5 * points[0]["throughput"], points
    labels = widget.locator("svg text[data-label]")
    assert labels.count() == 4 and not overlaps([labels.nth(i).bounding_box() for i in range(4)])
    assert max(widget.evaluate(OVERFLOW)) <= 1            # chart and table fit: no hidden column
    screenshot(widget, "lesson-throughput-1280")
    fits_at_768(page, widget, screenshot, "lesson-throughput-768")
    assert_clean(page)


# -- chapter 11 ----------------------------------------------------------------------------
def test_request_timeline_runs_at_full_speed_unless_slowed_and_says_so(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_chapter(page, live_server, "11-prefill-and-decode", "kv-request-timeline")
    handle = widget.element_handle()
    slow = widget.get_by_label("slow it down", exact=False)
    assert not slow.is_checked()
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.state === 'finished'", arg=handle, timeout=30000)
    page.wait_for_function("el => el.exportData().steps.length >= 16", arg=handle, timeout=10000)
    assert widget.get_attribute("data-slowed") == "false" and widget.locator(".krt-slowed").is_hidden()
    steps = widget.evaluate("el => el.exportData().steps.length")
    marker = widget.locator("tr.krt-skipped")
    assert marker.count() == 1 and int(marker.get_attribute("data-skipped")) == steps - 8
    assert "not shown" in marker.inner_text()
    for column in ("FLOPs per byte", "on an H100"):       # the comparison the text asks for, on screen
        cell = widget.locator("th", has_text=column)
        box, scroller = cell.bounding_box(), widget.locator("table").locator("xpath=..").bounding_box()
        assert box["x"] + box["width"] <= scroller["x"] + scroller["width"] + 1
    assert max(widget.evaluate(OVERFLOW)) <= 1
    screenshot(widget, "lesson-request-timeline-full-speed")

    slow.check()
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.state === 'finished'", arg=handle, timeout=30000)
    note = widget.locator(".krt-slowed")
    expect(widget).to_have_attribute("data-slowed", "true")
    expect(note).to_be_visible()
    assert "150 ms" in note.inner_text() and "decode step took" in note.inner_text()
    screenshot(widget, "lesson-request-timeline-slowed")
    fits_at_768(page, widget, screenshot, "lesson-request-timeline-768")
    assert_clean(page)


# -- chapter 14 ----------------------------------------------------------------------------
WATCH_TOKENS = """el => {
    window.tokenTimes = [];
    window.kvscope.client.on('request.token', e => window.tokenTimes.push(e.ts));
}"""


def test_burst_of_three_starts_together_and_lasts(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_chapter(page, live_server, "14-continuous-batching", "kv-batch-timeline")
    widget.evaluate(WATCH_TOKENS)
    button = widget.get_by_role("button", name="Send a burst of my requests")
    button.focus()
    page.keyboard.press("Enter")
    page.wait_for_function("el => el.exportData().requests.filter(r => r.cells.some(c => c.kind !== 'waiting')).length >= 3",
                           arg=widget.element_handle(), timeout=20000)
    page.wait_for_timeout(3000)
    screenshot(widget, "lesson-burst-midway")
    assert page.evaluate("() => document.activeElement.textContent").startswith("Send a burst")
    page.wait_for_function("el => el.exportData().comparison && el.exportData().comparison.requests.length >= 4",
                           arg=widget.element_handle(), timeout=60000)
    data = widget.evaluate("el => el.exportData()")
    first = sorted(min(c["step"] for c in r["cells"] if c["kind"] != "waiting") for r in data["requests"])
    assert first[0] == first[1] == first[2] and first[3] > first[0]   # three together, the fourth later
    times = page.evaluate("() => window.tokenTimes")
    assert max(times) - min(times) > 6.5, max(times) - min(times)
    screenshot(widget, "lesson-burst-done")
    assert_clean(page)


# -- chapter 17 ----------------------------------------------------------------------------
def test_my_prompt_chunked_and_unchunked(page, new_page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_chapter(page, live_server, "17-chunked-prefill", "kv-chunked-prefill")
    handle = widget.element_handle()
    widget.get_by_label("Chunks of", exact=True).select_option("32")
    for button, name in (("Run my prompt chunked", "live-chunked"), ("Run it unchunked", "live-unchunked")):
        widget.get_by_role("button", name=button).click()
        page.wait_for_function("([el, n]) => el.dataset.lastRun === n", arg=[handle, name], timeout=30000)
    runs = widget.evaluate("el => el.exportData()")
    chunked, whole = runs["live-chunked"], runs["live-unchunked"]
    chunks = [s["prefill"] for s in chunked["steps"] if s["prefill"]]
    assert max(chunks) == 32 and len(chunks) >= 9                       # ~350 tokens, 32 a step
    assert max(s["prefill"] for s in whole["steps"]) >= 300   # the whole prompt in one step
    assert all(s["decode"] for s in chunked["steps"] if s["prefill"] == 32)  # the decoder ran beside every chunk
    # The spike: the whole prompt's step costs many chunk steps (medians: the machine's load makes
    # single steps swing), and the decoder's worst wait unchunked contains that one step.
    big = max(s["durationS"] for s in whole["steps"] if s["prefill"] >= 300)
    chunk_step = statistics.median(s["durationS"] for s in chunked["steps"] if s["prefill"] == 32)
    assert big > 2.5 * chunk_step, (big, chunk_step)
    assert whole["worst"]["seconds"] >= big > 2 * statistics.median(chunked["gaps"]), (whole["worst"], chunked["gaps"])
    bars = widget.locator("[data-run=live-unchunked] rect[data-tokens]")
    assert max(int(bars.nth(i).get_attribute("data-tokens")) for i in range(bars.count())) >= 300
    assert max(widget.evaluate(OVERFLOW)) <= 1
    screenshot(widget, "lesson-chunked-prefill-live")
    dark = new_page(color_scheme="dark", viewport={"width": 768, "height": 1000})
    dark_widget = open_chapter(dark, live_server, "17-chunked-prefill", "kv-chunked-prefill")
    dark_widget.get_by_role("button", name="Run my prompt chunked").click()
    dark.wait_for_function("el => el.dataset.lastRun === 'live-chunked'", arg=dark_widget.element_handle(), timeout=30000)
    screenshot(dark_widget, "lesson-chunked-prefill-dark-768")
    assert_clean(page)


# -- chapter 12 ----------------------------------------------------------------------------
def test_enter_on_start_keeps_focus_where_n_works(page, live_server, assert_clean):
    wait_idle(live_server)
    widget = open_chapter(page, live_server, "12-the-kv-cache", "kv-cache-view")
    handle = widget.element_handle()
    widget.get_by_role("button", name="Start").focus()
    page.keyboard.press("Enter")
    page.wait_for_function("el => el.dataset.state === 'held'", arg=handle, timeout=20000)
    assert page.evaluate("() => document.activeElement.textContent") == "Next token"
    for n in (1, 2):
        page.keyboard.press("n")
        page.wait_for_function("([el, n]) => el.exportData().history.length === n", arg=[handle, n], timeout=20000)
        assert page.evaluate("el => el.contains(document.activeElement)", handle)
    page.keyboard.press("Enter")                              # Enter on Next token: still there afterwards
    page.wait_for_function("el => el.exportData().history.length === 3", arg=handle, timeout=20000)
    assert page.evaluate("() => document.activeElement.textContent") == "Next token"
    widget.get_by_role("button", name="Stop").click()
    assert_clean(page)


# -- slow motion ---------------------------------------------------------------------------
def test_slow_motion_survives_resume_and_shows_on_learner_pages(page, live_server, instructor, instructor_token,
                                                                new_page, screenshot, assert_clean):
    wait_idle(live_server)
    console = new_page()
    console.goto(f"{live_server}/console?token={instructor_token}")
    console.wait_for_function("() => document.getElementById('role').textContent.includes('instructor')")
    try:
        console.select_option("#slow-interval", "0.5")
        console.click("#slow button[type=submit]")
        console.click("#pause")
        console.wait_for_function("() => document.getElementById('s-paused').textContent === 'paused'")
        console.click("#resume")
        console.wait_for_function("() => document.getElementById('s-paused').textContent === 'running'")
        assert console.locator("#s-slow").inner_text() == "0.5 s between steps"
        assert console.locator("#slow-interval").input_value() == "0.5"

        page.goto(f"{live_server}/chapters/11-prefill-and-decode")   # a learner arriving after the resume
        page.wait_for_function(LIVE)
        banner = page.locator(".kv-slow-banner")
        banner.wait_for(state="visible")
        assert "0.5 s between engine steps" in banner.inner_text()
        widget = page.locator("kv-request-timeline")
        widget.get_by_role("button", name="Run", exact=True).click()
        page.wait_for_function("el => el.exportData().tokens.length >= 4", arg=widget.element_handle(), timeout=30000)
        times = [t["ts"] for t in widget.evaluate("el => el.exportData().tokens")]
        assert min(b - a for a, b in zip(times, times[1:])) >= 0.45   # still slow after the resume
        assert "instructor's slow motion" in widget.locator(".krt-slowed").inner_text()   # said beside the figure
        screenshot(page, "lesson-slow-motion-banner")
    finally:
        instructor({"type": "slow_motion", "interval_s": 0}, until="slow_motion")
    page.wait_for_function("() => document.querySelector('.kv-slow-banner').hidden")
    assert_clean(page)


# -- the projector -------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_projector_is_tidy_idle_and_holds_a_burst(new_page, live_server, instructor, instructor_token, screenshot,
                                                   assert_clean, scheme):
    wait_idle(live_server)
    console = new_page(color_scheme=scheme, viewport={"width": 1280, "height": 800})
    console.goto(f"{live_server}/console?token={instructor_token}")
    console.wait_for_function("() => document.getElementById('role').textContent.includes('instructor')")
    console.click("#projector-toggle")
    console.wait_for_selector("kv-pages[data-painted]", state="attached")
    console.wait_for_selector("kv-batch-timeline[data-painted]", state="attached")
    assert console.locator("kv-pages .kvp-sandbox, kv-pages [aria-label='Load of your own']").count() == 0
    steps = console.evaluate("() => document.querySelector('kv-batch-timeline').exportData().steps.length")
    assert steps or console.locator("kv-batch-timeline .kbt-grid").is_hidden(), steps   # idle: no giant empty axes
    assert "no step yet" not in console.locator("#projector").inner_text()
    screenshot(console, f"lesson-projector-idle-{scheme}")
    try:
        console.click("#room-burst")
        console.wait_for_function("() => document.getElementById('s-slow').textContent.startsWith('0.25')")
        console.wait_for_function("() => Number(document.querySelector('kv-batch-timeline').dataset.steps || 0) >= 8", timeout=20000)
        screenshot(console, f"lesson-projector-burst-{scheme}")
        wait_idle(live_server, timeout=60)
        console.wait_for_timeout(600)
        assert "6 at once" in console.locator("#p-burst").inner_text()            # held after the burst ended
        assert console.locator("kv-batch-timeline .kbt-grid").is_visible()
    finally:
        instructor({"type": "slow_motion", "interval_s": 0}, until="slow_motion")
    assert_clean(console)
