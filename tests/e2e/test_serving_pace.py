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
