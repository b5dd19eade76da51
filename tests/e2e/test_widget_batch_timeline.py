"""<kv-batch-timeline> against the real server: its columns are the `step` events the page
received, each request's cells are what its `request.*` events say, and the static-batching
comparison is computed from those same requests."""
from __future__ import annotations

from playwright.sync_api import expect
from widget_checks import check_exports, open_live_widget, run_collecting, wait_idle

MIN_CELL_PX = 18

COLLECT = """() => {
    window.seen = { steps: [], tokens: [], finished: [] };
    const c = window.kvscope.client;
    c.on('step', e => window.seen.steps.push(e.step));
    c.on('request.token', e => window.seen.tokens.push([e.request_id, e.step]));
    c.on('request.finished', e => window.seen.finished.push([e.request_id, e.num_output_tokens]));
}"""


def static_steps(requests: list[dict], batch_size: int) -> int:
    """Static batching, written again here: idle engine takes all arrived requests as one batch."""
    queue = sorted(requests, key=lambda r: r["arrival_step"])
    clock, total = (queue[0]["arrival_step"] if queue else 0), 0
    while queue:
        start = max(clock, queue[0]["arrival_step"])
        n = 0
        while n < len(queue) and n < batch_size and queue[n]["arrival_step"] <= start:
            n += 1
        batch, queue = queue[:n], queue[n:]
        steps = max(max(1, r["output_tokens"]) for r in batch)
        total += steps
        clock = start + steps
    return total


def cell_widths(widget) -> list[float]:
    return widget.evaluate("el => [...el.querySelectorAll('.kbt-grid rect[data-kind]')].map(r => r.getBoundingClientRect().width)")


def check_readable_and_keyboard(page, widget) -> None:
    """Cells at least MIN_CELL_PX wide on screen; the grid shows the newest steps, and the
    keyboard reaches the oldest kept one and comes back."""
    widths = cell_widths(widget)
    assert widths and min(widths) >= MIN_CELL_PX, min(widths or [0])
    assert widget.locator(".kbt-grid").bounding_box()["width"] <= widget.bounding_box()["width"]   # no squeeze, no overflow
    data = widget.evaluate("el => el.exportData()")
    kept = [s["step"] for s in data["steps"]]
    shown = sorted({int(s) for s in widget.evaluate("el => [...el.querySelectorAll('.kbt-grid rect[data-step]')].map(r => r.dataset.step)")})
    assert shown[-1] == kept[-1]                                               # the newest step is in view
    grid = widget.locator(".kbt-grid")
    grid.focus()
    page.keyboard.press("Home")
    page.wait_for_function("([el, s]) => el.dataset.firstShown === String(s)", arg=[widget.element_handle(), kept[0]])
    assert widget.locator(".kbt-detail").inner_text().startswith(f"step {kept[0]} ·")
    if len(kept) > len(shown):
        assert widget.get_by_role("button", name="Follow the newest").is_enabled()
    page.keyboard.press("End")   # drawn on the next frame: read it with the retrying expect
    expect(widget.locator("[data-range]")).to_contain_text("following the newest")
    expect(widget.locator(".kbt-detail")).to_contain_text(f"step {kept[-1]} ·")
    assert widget.locator(".kbt-detail").inner_text().startswith(f"step {kept[-1]} ·")


def test_timeline_columns_and_cells_match_the_events(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_live_widget(page, live_server, "/chapters/14-continuous-batching", "kv-batch-timeline")
    seen = run_collecting(page, widget, COLLECT, "Send a burst of my requests",
                          "el => Number(el.dataset.compared) >= 4 && el.load.running.size === 0", timeout=60000)
    data = widget.evaluate("el => el.exportData()")

    assert [s["step"] for s in data["steps"]] == seen["steps"][-64:]          # one column per step event
    finished = dict(seen["finished"])
    mine = [r for r in data["requests"] if r["rid"] in finished]
    assert len(mine) == 4
    for r in mine:
        cells = {c["step"]: c for c in r["cells"]}
        token_steps = [step for rid, step in seen["tokens"] if rid == r["rid"]]
        sampled = sorted(s for s, c in cells.items() if c.get("samples"))
        assert sampled == token_steps                                          # a token in exactly those steps
        assert r["output_tokens"] == finished[r["rid"]] == len(token_steps)
        assert [s for s, c in cells.items() if c["finished"]] == [token_steps[-1]]
        assert cells[token_steps[0]]["kind"] == "prefill"
        assert all(cells[s]["kind"] == "decode" for s in token_steps[1:])
    lengths = sorted(r["output_tokens"] for r in mine)
    assert lengths == [10, 16, 18, 30]                                         # they leave at different steps
    late = max(mine, key=lambda r: r["arrival_step"])
    first_done = min(mine, key=lambda r: r["output_tokens"])
    assert late["arrival_step"] > min(r["arrival_step"] for r in mine)         # joined mid-flight

    comparison = data["comparison"]
    assert {r["rid"] for r in comparison["requests"]} >= {r["rid"] for r in mine}
    assert comparison["static"]["steps"] == static_steps(comparison["requests"], comparison["batch_size"])
    assert comparison["continuous"]["tokens"] == sum(r["output_tokens"] for r in comparison["requests"])
    assert first_done["rid"] in {r["rid"] for r in comparison["requests"]}
    shown = widget.locator("[data-figure=static]").text_content()
    assert shown.startswith(f"{comparison['static']['steps']} steps")
    for width in (1280, 768):
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(300)   # the grid redraws for its new width
        check_readable_and_keyboard(page, widget)
        widget.scroll_into_view_if_needed()
        screenshot(widget, f"batch-timeline-live-{width}")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_timeline_replays_the_recording_dark_and_narrow(new_page, static_site, screenshot):
    """No backend: the grid is drawn from the recording's own events, at 768 px in dark mode."""
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    page.goto(f"{static_site}/chapters/14-continuous-batching/")
    page.wait_for_function("() => kvscope.client.mode === 'replay' && kvscope.client.replay.state.loaded", timeout=15000)
    widget = page.locator("kv-batch-timeline")
    page.wait_for_function("el => Number(el.dataset.steps) >= 5", arg=widget.element_handle(), timeout=20000)
    data = widget.evaluate("el => el.exportData()")
    assert data["requests"] and all(r["cells"] for r in data["requests"])
    assert widget.get_by_role("button", name="Send a burst of my requests").is_disabled()
    page.evaluate("() => kvscope.client.replay.seek(kvscope.client.replay.state.stepCount)")   # the whole episode
    page.wait_for_function("el => Number(el.dataset.compared) >= 7", arg=widget.element_handle(), polling=100)
    data = widget.evaluate("el => el.exportData()")
    assert any(c["kind"] == "waiting" for r in data["requests"] for c in r["cells"])       # one waited for a place
    assert len({r["arrival_step"] for r in data["requests"]}) >= 3                          # joined mid-flight
    box = widget.bounding_box()
    assert box["width"] <= 768
    check_readable_and_keyboard(page, widget)
    widget.scroll_into_view_if_needed()
    screenshot(widget, "batch-timeline-replay-dark-768")
