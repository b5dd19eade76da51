"""<kv-request-timeline> (chapter 11) and <kv-pipeline> (chapter 1) against the real server:
what they show is what the engine's events for that one request say."""
from __future__ import annotations

from widget_checks import check_exports, wait_idle

COLLECT = """() => {
    window.seen = { steps: [], tokens: [], finished: [] };
    const c = window.kvscope.client;
    c.on('step', e => window.seen.steps.push(e));
    c.on('request.token', e => window.seen.tokens.push(e));
    c.on('request.finished', e => window.seen.finished.push(e));
}"""


def open_live(page, live_server, path, tag):
    wait_idle(live_server)
    page.goto(live_server + path)
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    page.wait_for_selector(f"{tag}[data-painted]", state="attached")
    page.evaluate(COLLECT)
    return page.locator(tag)


def test_request_timeline_shows_its_steps_costs_and_clocks(page, live_server, screenshot, assert_clean):
    widget = open_live(page, live_server, "/chapters/11-prefill-and-decode", "kv-request-timeline")
    widget.get_by_label("slow it down", exact=False).uncheck()
    widget.get_by_role("button", name="Run").click()
    page.wait_for_function("el => el.dataset.state === 'finished'", arg=widget.element_handle(), timeout=20000)
    data = widget.evaluate("el => el.exportData()")
    seen = page.evaluate("() => window.seen")
    rid = data["request_id"]
    finished = next(e for e in seen["finished"] if e["request_id"] == rid)
    mine = [e for e in seen["steps"] if any(s["request_id"] == rid for s in e["seqs"])]
    assert [s["step"] for s in data["steps"]] == [e["step"] for e in mine]
    assert [s["cost"]["flops"] for s in data["steps"]] == [e["cost"]["flops"] for e in mine]
    assert data["steps"][0]["kind"] == "prefill" and all(s["kind"] == "decode" for s in data["steps"][1:])
    assert data["ttft_s"] == finished["ttft_s"] and data["itl_s"] == finished["itl_s"]
    rows = widget.locator("tbody tr:not(.krt-skipped)")
    assert rows.count() == min(len(mine), 8)
    skipped = widget.locator("tbody tr.krt-skipped")                           # the rows left out are counted, not hidden
    assert skipped.count() == (len(mine) > 8) and (len(mine) <= 8 or int(skipped.get_attribute("data-skipped")) == len(mine) - 8)
    assert int(rows.first.locator("[data-flops]").get_attribute("data-flops")) == mine[0]["cost"]["flops"]
    # prefill does more arithmetic per byte than decode: the lesson of the table
    assert mine[0]["cost"]["arithmetic_intensity"] > mine[-1]["cost"]["arithmetic_intensity"]
    screenshot(widget, "request-timeline-live")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_pipeline_lights_every_stage_with_measured_times(page, live_server, screenshot, assert_clean):
    widget = open_live(page, live_server, "/chapters/01-what-is-an-llm", "kv-pipeline")
    widget.get_by_role("button", name="Send it through").click()
    handle = widget.element_handle()
    page.wait_for_function("el => el.querySelector('[data-stage=prefill]').dataset.state === 'done' && el.dataset.state !== 'finished'",
                           arg=handle, timeout=20000)
    widget.scroll_into_view_if_needed()
    screenshot(widget, "pipeline-mid-flight")           # paced: decode still lit while we look
    page.wait_for_function("el => el.dataset.state === 'finished'", arg=handle, timeout=20000)
    states = widget.locator(".kpl-stage").evaluate_all("els => els.map(e => e.dataset.state)")
    assert states == ["done"] * 7
    data = widget.evaluate("el => el.exportData()")
    trace = data["trace"]
    seen = page.evaluate("() => window.seen")
    finished = next(e for e in seen["finished"] if e["request_id"] == trace["request_id"])
    assert len(trace["tokens"]) == finished["num_output_tokens"] == 12
    prefill = [s for s in trace["steps"] if s["kind"] == "prefill"]
    assert sum(s["tokens"] for s in prefill) == finished["num_prompt_tokens"] - finished["num_cached_tokens"]
    assert data["tokenize"]["ids"] == finished["num_prompt_tokens"]
    gaps = finished["itl_s"]
    assert min(gaps) >= 0.19                              # the page's own pace, 0.2 s per step
    assert widget.locator(".kpl-text").text_content() == finished["text"]
    assert_clean(page)


def test_request_views_replay_dark_and_narrow(new_page, static_site, screenshot):
    """No backend, 768 px, dark: the timeline and the pipeline follow the recording's first
    request; the throughput chart plots the sweep the project recorded."""
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    for path, tag, ready in (
            ("/chapters/11-prefill-and-decode/", "kv-request-timeline", "el => Number(el.dataset.steps || 0) >= 2"),
            ("/chapters/01-what-is-an-llm/", "kv-pipeline", "el => el.dataset.state === 'finished'"),
            ("/chapters/20-throughput-vs-latency/", "kv-throughput", "el => el.exportData().recorded.length === 6")):
        page.goto(f"{static_site}{path}")
        page.wait_for_function("() => kvscope.client.mode === 'replay'", timeout=15000)
        widget = page.locator(tag)
        page.wait_for_function(ready, arg=widget.element_handle(), timeout=30000)
        assert widget.bounding_box()["width"] <= 768
        widget.scroll_into_view_if_needed()
        screenshot(widget, f"{tag[3:]}-replay-dark-768")
    recorded = page.locator("kv-throughput").evaluate("el => el.exportData().recorded")
    assert [(p["concurrency"], p["requests"]) for p in recorded] == [(1, 4), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64)]
    assert page.locator("kv-throughput [data-series=itl_p50]").count() == 6      # plotted, from the recording
