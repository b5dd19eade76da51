"""<kv-throughput> against the real server: a learner runs the sweep from the page and sees
the trade-off chapter 20 describes (throughput rises, then flattens, while inter-token latency
and time to first token climb), each level's point exactly what its own request events
report; the instructor's cap on a learner's sweep is stated, never silently applied; and
without an engine the widget plots the recorded sweep."""
from __future__ import annotations

import math

from widget_checks import check_exports, open_live_widget, run_collecting, wait_idle

COLLECT = """() => {
    window.seen = { added: [], finished: [] };
    const c = window.kvscope.client;
    c.on('request.added', e => window.seen.added.push(e));
    c.on('request.finished', e => window.seen.finished.push(e));
}"""


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]


def test_a_learner_sweeps_to_the_knee_and_sees_latency_rise(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    page.set_viewport_size({"width": 1280, "height": 1100})
    widget = open_live_widget(page, live_server, "/chapters/20-throughput-vs-latency", "kv-throughput")
    page.wait_for_function("() => window.kvscope.client.session")
    cap = page.evaluate("() => window.kvscope.client.session.limits.max_sweep_in_flight")
    assert cap == 32   # the default server: --learner-max-sweep-in-flight 32, within a share of 64 / 2
    # more than the cap: the widget says so, and which levels it will run
    widget.get_by_label("Most requests in flight").fill("64")
    notice = widget.locator(".ktp-cap")
    assert notice.is_visible()
    assert "stops at 32" in notice.inner_text() and "--learner-max-sweep-in-flight" in notice.inner_text()
    assert widget.locator("[data-levels]").get_attribute("data-levels") == "1,2,4,8,16,32"
    widget.get_by_label("Tokens each").fill("12")
    seen = run_collecting(page, widget, COLLECT, "Run the sweep",
                          "el => Number(el.dataset.points || 0) === 6 && !el.querySelector('[aria-disabled=true]')",
                          timeout=240_000)
    points = widget.evaluate("el => el.exportData().points")
    finished = {e["request_id"]: e for e in seen["finished"]}
    added = iter(seen["added"])
    for point, (level, requests) in zip(points, ((1, 4), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64))):
        mine = [next(added) for _ in range(requests)]
        done = [finished[e["request_id"]] for e in mine]
        tokens = sum(e["num_output_tokens"] for e in done)
        seconds = max(e["ts"] for e in done) - min(e["ts"] for e in mine)
        itl = [g for e in done for g in e["itl_s"]]
        assert (point["concurrency"], point["requests"], tokens) == (level, requests, 12 * requests)
        assert point["throughput"] == tokens / seconds
        assert (point["itl_p50"], point["itl_p90"]) == (pct(itl, 0.5), pct(itl, 0.9))
        assert point["ttft_p50"] == pct([e["ttft_s"] for e in done], 0.5)
    tput = [p["throughput"] for p in points]
    # the shape the chapter claims, with room for a busy 2-core machine: throughput rises a lot
    # over the sweep, but its last doubling buys far less than a doubling; latency climbs
    assert tput[-1] > 2 * tput[0]
    assert tput[-1] < 1.7 * tput[-2]
    assert points[-1]["itl_p50"] > points[0]["itl_p50"]
    assert points[-1]["ttft_p50"] > points[0]["ttft_p50"]
    assert widget.locator("circle[data-series=itl_p50]").count() == 6
    summary = widget.locator(".ktp-summary").inner_text()
    assert "From 1 to 32 in flight" in summary and "inter-token p50" in summary
    widget.scroll_into_view_if_needed()
    screenshot(widget, "throughput-live")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_the_recorded_sweep_shows_the_same_shape(new_page, static_site, screenshot):
    page = new_page()
    page.set_viewport_size({"width": 1280, "height": 1100})
    page.goto(f"{static_site}/chapters/20-throughput-vs-latency/")
    widget = page.locator("kv-throughput")
    page.wait_for_function("el => el.dataset.shown === 'recorded' && el.exportData().recorded.length > 0",
                           arg=widget.element_handle(), timeout=15000)
    recorded = widget.evaluate("el => el.exportData().recorded")
    assert [p["concurrency"] for p in recorded] == [1, 2, 4, 8, 16, 32]
    assert recorded[-1]["throughput"] > 2 * recorded[0]["throughput"]
    assert recorded[-1]["itl_p50"] > recorded[0]["itl_p50"]
    assert widget.get_by_role("button", name="Run the sweep").is_disabled()
    # the controls say what the recorded sweep ran, and cannot be changed: nothing would run
    tokens, top = widget.get_by_label("Tokens each"), widget.get_by_label("Most requests in flight")
    assert tokens.input_value() == str(max(p["max_tokens"] for p in recorded)) and tokens.is_disabled()
    assert top.input_value() == "32" and top.is_disabled()
    widget.scroll_into_view_if_needed()
    screenshot(widget, "throughput-recorded")
