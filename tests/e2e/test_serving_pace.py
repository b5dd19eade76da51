"""Pace a room can follow: the instructor's pause shows on every learner page (with the
step it stopped at), and the console's slow-motion control reaches the engine."""
from __future__ import annotations

from test_console import health
from widget_checks import wait_idle

BANNER = ".kv-paused-banner"


def test_pause_shows_on_a_learner_page(page, live_server, instructor, screenshot, assert_clean):
    wait_idle(live_server)
    page.goto(live_server + "/chapters/15-paged-attention")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    assert page.locator(BANNER).is_hidden()
    instructor({"type": "pause"}, until="pause")
    try:
        step = health(live_server)["step"]
        page.wait_for_function("() => !document.querySelector('.kv-paused-banner').hidden")
        assert page.locator(BANNER).text_content() == f"Paused by the instructor · step {step}"
        screenshot(page.locator("header.kv-site-header"), "paused-banner")
    finally:
        instructor({"type": "resume"}, until="resume")
    page.wait_for_function("() => document.querySelector('.kv-paused-banner').hidden")
    assert_clean(page)


def test_console_sets_slow_motion(page, live_server, instructor_token, assert_clean):
    page.goto(f"{live_server}/console?token={instructor_token}")
    page.wait_for_function("() => document.getElementById('role').textContent.includes('instructor')")
    page.select_option("#slow-interval", "0.25")
    page.click("#slow button[type=submit]")
    try:
        page.wait_for_function("() => document.getElementById('s-slow').textContent === '0.25 s between steps'")
    finally:
        page.select_option("#slow-interval", "0")
        page.click("#slow button[type=submit]")
    page.wait_for_function("() => document.getElementById('s-slow').textContent === 'off'")
    assert_clean(page)


PACE_S = 0.15   # the pace kv-request-timeline asks for when "slow it down" is ticked
DONE = "el => el.dataset.state === 'finished'"


def run_request_timeline(page, live_server, slow: bool):
    page.goto(live_server + "/chapters/11-prefill-and-decode")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator("kv-request-timeline")
    widget.wait_for(state="attached")
    page.wait_for_selector("kv-request-timeline[data-painted]", state="attached")
    box = widget.get_by_label("slow it down", exact=False)
    box.check() if slow else box.uncheck()
    widget.get_by_role("button", name="Run").click()
    return widget


def test_a_learners_pace_slows_only_their_own_request(page, new_page, live_server, assert_clean):
    """Two learners on one server: the one who ticked "slow it down" gets steps at least
    PACE_S apart; the other's request, sent while the paced one runs, is not held back."""
    wait_idle(live_server)
    paced = run_request_timeline(page, live_server, slow=True)
    page.wait_for_function("el => Number(el.dataset.steps || 0) >= 2", arg=paced.element_handle(), timeout=20000)
    other_page = new_page()
    fast = run_request_timeline(other_page, live_server, slow=False)
    other_page.wait_for_function(DONE, arg=fast.element_handle(), timeout=20000)
    assert paced.get_attribute("data-state") == "running"   # the paced one is still going
    page.wait_for_function(DONE, arg=paced.element_handle(), timeout=30000)

    paced_ts = [s["ts"] for s in paced.evaluate("el => el.exportData()")["steps"]]
    fast_ts = [s["ts"] for s in fast.evaluate("el => el.exportData()")["steps"]]
    assert len(paced_ts) >= 8 and len(fast_ts) >= 8
    paced_gaps = [b - a for a, b in zip(paced_ts, paced_ts[1:])]
    fast_gaps = sorted(b - a for a, b in zip(fast_ts, fast_ts[1:]))
    assert min(paced_gaps) >= PACE_S * 0.98, paced_gaps
    assert fast_gaps[len(fast_gaps) // 2] < PACE_S / 2, fast_gaps   # median: full speed
    assert fast_ts[-1] < paced_ts[-1]
    assert_clean(page)
    assert_clean(other_page)
