"""The instructor console, driven in Chromium against the real server: the token makes an
instructor; pause, single-step, inject, resume and the viewers list act on the live engine;
without the token the same buttons are refused."""
from __future__ import annotations

import json
import urllib.request

from widget_checks import wait_idle


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
        return json.load(r)


def test_console_pauses_steps_injects_and_resumes(page, live_server, instructor_token, screenshot, assert_clean):
    wait_idle(live_server)
    page.goto(f"{live_server}/console?token={instructor_token}")
    page.wait_for_function("() => document.getElementById('role').textContent.includes('instructor')")
    page.click("#pause")
    page.wait_for_function("() => document.getElementById('s-paused').textContent === 'paused'")
    assert health(live_server)["paused"] is True

    page.fill("#i-n", "2")
    page.fill("#i-tokens", "6")
    page.click("#inject button[type=submit]")
    page.wait_for_function("() => document.getElementById('log').textContent.includes('inject: ok')")
    before = health(live_server)
    assert before["waiting"] + before["running"] == 2      # paused: nothing ran yet

    page.click("#step")
    page.wait_for_function(f"() => Number(document.getElementById('s-step').textContent) === {before['step'] + 1}")
    assert health(live_server)["step"] == before["step"] + 1

    page.click("#viewers")
    page.wait_for_function("() => document.querySelectorAll('#viewers-body tr').length >= 1")
    screenshot(page, "console")

    page.locator("body").press("p")                         # the keyboard shortcut resumes
    page.wait_for_function("() => document.getElementById('s-paused').textContent === 'running'")
    wait_idle(live_server)
    assert health(live_server)["paused"] is False
    assert_clean(page)


def test_console_without_the_token_is_refused(page, live_server):
    page.goto(f"{live_server}/console?token=not-the-token")
    page.wait_for_function("() => document.getElementById('role').textContent.includes('learner')")
    page.click("#pause")
    page.wait_for_function("() => document.querySelector('#log li.error') !== null")
    assert "pause" in page.locator("#log li.error").first.text_content()
    assert health(live_server)["paused"] is False


def test_projector_view_shows_pool_timeline_queues_and_big_controls(page, live_server, instructor_token, instructor,
                                                                    screenshot, assert_clean):
    wait_idle(live_server)
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(f"{live_server}/console?token={instructor_token}")
    page.wait_for_function("() => document.getElementById('role').textContent.includes('instructor')")
    page.get_by_role("button", name="Show the projector view").click()
    page.wait_for_selector("kv-batch-timeline[data-painted]", state="attached")
    page.wait_for_selector("kv-pages[data-painted]", state="attached")
    assert page.locator("#inject").is_hidden() and page.locator("#pause").is_visible()
    assert page.locator("#pause").bounding_box()["height"] >= 45            # big controls
    instructor({"type": "inject", "n": 4, "max_tokens": 24, "prompt_tokens": 40}, until="inject")
    page.wait_for_function("() => Number(document.querySelector('kv-batch-timeline').dataset.steps || 0) >= 10")
    page.wait_for_function("() => Number(document.getElementById('p-throughput').textContent) > 0")
    screenshot(page, "console-projector")
    wait_idle(live_server)
    page.get_by_role("button", name="Back to the full console").click()
    assert page.locator("#inject").is_visible()
    assert_clean(page)


def test_projector_says_paused_and_keeps_the_last_real_figures(page, live_server, instructor_token, instructor,
                                                               screenshot, assert_clean):
    """Paused, steps taken by hand are neither a rate nor a burst: the projector says paused and
    how many steps were taken by hand, and keeps the figures of the engine's last run."""
    wait_idle(live_server)
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(f"{live_server}/console?token={instructor_token}")
    page.wait_for_function("() => document.getElementById('role').textContent.includes('instructor')")
    page.get_by_role("button", name="Show the projector view").click()
    instructor({"type": "inject", "n": 3, "max_tokens": 12, "prompt_tokens": 20}, until="inject")
    wait_idle(live_server)
    burst = page.locator("#p-burst")
    page.wait_for_function("() => document.getElementById('p-burst').textContent.includes('36 tokens')")
    before = burst.inner_text()
    assert before.startswith("3 at once · 36 tokens in ") and not before.endswith(" 0.0 s")
    rate = float(page.locator("#p-throughput").get_attribute("data-rate"))
    assert rate > 0

    page.click("#pause")
    page.wait_for_function("() => document.getElementById('p-state').textContent.startsWith('paused')")
    instructor({"type": "inject", "n": 2, "max_tokens": 6, "prompt_tokens": 8}, until="inject")
    for n in range(1, 4):
        page.click("#step")
        page.wait_for_function(f"() => document.getElementById('p-state').textContent.includes('{n} step')")
    assert page.locator("#p-state").inner_text().startswith("paused, 3 steps by hand")
    assert page.locator("#p-throughput").inner_text() == f"paused (last running: {rate:.1f})"
    assert burst.inner_text() == f"{before} (before the pause)"      # the hand steps are no burst
    page.locator("#projector").scroll_into_view_if_needed()
    screenshot(page, "console-projector-paused")

    page.click("#resume")
    page.wait_for_function("() => document.getElementById('p-state').textContent.startsWith('running')")
    wait_idle(live_server)
    page.wait_for_function("() => !document.getElementById('p-burst').textContent.includes('pause')")
    assert float(page.locator("#p-throughput").inner_text()) >= 0
    assert_clean(page)
