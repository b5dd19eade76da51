"""<kv-throughput> against the real server: each run's point is exactly what that run's own
request events report (throughput over the run, TTFT and inter-token percentiles)."""
from __future__ import annotations

import math

from widget_checks import check_exports, wait_idle

COLLECT = """() => {
    window.seen = { added: [], finished: [] };
    const c = window.kvscope.client;
    c.on('request.added', e => window.seen.added.push(e));
    c.on('request.finished', e => window.seen.finished.push(e));
}"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]


def test_throughput_points_equal_what_each_run_reported(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    page.goto(live_server + "/chapters/20-throughput-vs-latency")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator("kv-throughput")
    handle = widget.element_handle()
    page.evaluate(COLLECT)
    runs = []
    for concurrency, total in ((1, 2), (3, 3)):           # 5 submits: within a learner's burst allowance
        widget.get_by_label("Requests in flight").fill(str(concurrency))
        widget.get_by_label("Requests in the run").fill(str(total))
        widget.get_by_label("Tokens each").fill("12")
        before = len(page.evaluate("() => window.seen.finished"))
        widget.get_by_role("button", name="Run", exact=True).click()
        page.wait_for_function("([el, n]) => Number(el.dataset.points || 0) === n", arg=[handle, len(runs) + 1], timeout=30000)
        seen = page.evaluate("() => window.seen")
        finished = seen["finished"][before:]
        ids = {e["request_id"] for e in finished}
        added = [e for e in seen["added"] if e["request_id"] in ids]
        runs.append((concurrency, total, added, finished))
    points = widget.evaluate("el => el.exportData().points")
    assert len(points) == 2
    for point, (concurrency, total, added, finished) in zip(points, runs):
        tokens = sum(e["num_output_tokens"] for e in finished)
        seconds = max(e["ts"] for e in finished) - min(e["ts"] for e in added)
        itl = [g for e in finished for g in e["itl_s"]]
        ttft = [e["ttft_s"] for e in finished]
        assert point["concurrency"] == concurrency and point["requests"] == total and tokens == 12 * total
        assert not point.get("throttled")
        assert point["tokens"] == tokens and point["seconds"] == seconds and point["throughput"] == tokens / seconds
        assert (point["ttft_p50"], point["ttft_p90"]) == (pct(ttft, 0.5), pct(ttft, 0.9))
        assert (point["itl_p50"], point["itl_p90"]) == (pct(itl, 0.5), pct(itl, 0.9))
    assert widget.locator("[data-series=ttft_p50]").count() == 2
    widget.scroll_into_view_if_needed()
    screenshot(widget, "throughput-live")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
