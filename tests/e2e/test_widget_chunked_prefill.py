"""<kv-chunked-prefill>: the recorded pair and a live run on the real server; every step's
tokens stay within its budget, and the bars are the steps' own counts."""
from __future__ import annotations

from widget_checks import check_exports, wait_idle


def test_chunked_prefill_respects_the_budget_live_and_recorded(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    page.goto(live_server + "/chapters/17-chunked-prefill")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator("kv-chunked-prefill")
    handle = widget.element_handle()
    page.wait_for_function("el => el.querySelectorAll('[data-run]').length === 2", arg=handle)
    page.evaluate("() => { window.steps = []; window.kvscope.client.on('step', e => window.steps.push(e)); }")
    widget.get_by_role("button", name="Run my prompt chunked").click()
    page.wait_for_function("el => el.dataset.lastRun === 'live-chunked'", arg=handle, timeout=30000)
    data = widget.evaluate("el => el.exportData()")
    assert set(data) == {"chunked-prefill", "chunked-prefill-off", "live-chunked"}
    for name, run in data.items():
        assert run["steps"] and run["overBudget"] == 0, name
        assert all(s["tokens"] <= s["budget"] for s in run["steps"]), name
    chunked, off = data["chunked-prefill"], data["chunked-prefill-off"]
    assert max(s["prefill"] for s in chunked["steps"]) == 16 and max(s["tokens"] for s in chunked["steps"]) <= 24
    assert max(s["prefill"] for s in off["steps"]) > 64                        # the whole prompt in one step
    assert any(s["prefill"] and s["decode"] for s in chunked["steps"])          # chunks mixed with decodes
    seen = {e["step"]: e for e in page.evaluate("() => window.steps")}
    for s in data["live-chunked"]["steps"]:                                              # the live bars are the steps' counts
        assert s["tokens"] == seen[s["step"]]["num_batched_tokens"] <= seen[s["step"]]["token_budget"]
    bars = widget.locator("[data-run=live-chunked] rect[data-tokens]")
    assert bars.count() == len(data["live-chunked"]["steps"])
    widget.scroll_into_view_if_needed()
    screenshot(widget, "chunked-prefill-live")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_chunked_prefill_replays_dark_and_narrow(new_page, static_site, screenshot):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    page.goto(f"{static_site}/chapters/17-chunked-prefill/")
    widget = page.locator("kv-chunked-prefill")
    page.wait_for_function("el => el.querySelectorAll('[data-run]').length === 2", arg=widget.element_handle(), timeout=15000)
    assert widget.get_by_role("button", name="Run my prompt chunked").is_disabled()
    widget.scroll_into_view_if_needed()
    screenshot(widget, "chunked-prefill-replay-dark-768")
