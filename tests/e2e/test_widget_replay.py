"""With no backend (the static export on a plain file server) the widgets replay the
page's recording: the pool, the memory figures and a request's cache come from its events."""
from __future__ import annotations

import json
import urllib.request

from playwright.sync_api import expect


def assert_clean_apart_from_the_socket(page) -> None:
    """No console error or failed request, except the WebSocket that has no server to reach."""
    problems = [p for p in page.kv_problems if "WebSocket" not in p and "/ws" not in p]
    assert not problems, problems

def recording(static_site: str, page) -> list[dict]:
    name = page.evaluate("() => document.body.dataset.recording || 'default'")
    with urllib.request.urlopen(f"{static_site}/static/recordings/{name}.jsonl", timeout=10) as r:
        lines = [json.loads(line) for line in r.read().decode().splitlines() if line.strip()]
    return lines[1:]


def open_replay(new_page, static_site: str, path: str, tag: str):
    page = new_page()
    page.goto(f"{static_site}{path}")
    page.wait_for_selector(f"{tag}[data-painted]", state="attached")
    page.wait_for_function("() => kvscope.client.mode === 'replay' && kvscope.client.replay.state.loaded", timeout=15000)
    widget = page.locator(tag).first
    widget.scroll_into_view_if_needed()
    return page, widget


def pool_at(events: list[dict], step: int) -> dict:
    """The pool a viewer holds after the recording's kv events up to `step`."""
    blocks, tables = [], {}
    for e in events:
        if e["type"] != "kv" or e["step"] > step:
            continue
        if e["kind"] == "snapshot":
            blocks, tables = [dict(b) for b in e["blocks"]], dict(e["tables"])
        else:
            for b in e["blocks"]:
                blocks[b["id"]] = b
            tables.update(e["tables"])
            for rid in e["removed_tables"]:
                tables.pop(rid, None)
    return {"blocks": blocks, "tables": tables}


def test_pages_replay_the_recorded_pool(new_page, static_site, screenshot):
    page, widget = open_replay(new_page, static_site, "/chapters/15-paged-attention/", "kv-pages")
    events = recording(static_site, page)
    assert any(e["type"] == "kv" for e in events)
    page.wait_for_function("el => el.exportData().pool.num_blocks > 0", arg=widget.element_handle())
    # Step the replay (paused) and compare the pool with the recording's own events.
    page.evaluate("() => kvscope.client.replay.pause()")
    for _ in range(3):
        page.evaluate("() => kvscope.client.replay.step()")
    page.wait_for_timeout(100)
    pool = widget.evaluate("el => el.exportData().pool")
    expected = pool_at(events, pool["step"])
    assert pool["blocks"] == expected["blocks"]
    assert pool["tables"] == expected["tables"]
    assert widget.get_attribute("data-mode") == "replay"
    assert "recording" in widget.locator(".kvw-mode").first.inner_text()
    # The sandbox needs the engine: it says so instead of failing silently.
    sandbox = widget.locator(".kvp-sandbox")
    expect(sandbox.locator("[data-op=allocate]")).to_be_disabled()
    screenshot(widget, "widget-pages-replay")
    assert_clean_apart_from_the_socket(page)


def test_memory_and_cache_replay_the_recording(new_page, static_site, screenshot):
    page, widget = open_replay(new_page, static_site, "/chapters/13-gpu-memory-hierarchy/", "kv-memory")
    events = recording(static_site, page)
    hello = next(e for e in events if e["type"] == "hello")
    page.wait_for_function("el => el.exportData().memory !== null", arg=widget.element_handle())
    data = widget.evaluate("el => el.exportData()")
    assert data["device"] == hello["device"] and data["model"] == hello["model"]
    memories = [e for e in events if e["type"] == "memory"]
    assert data["memory"] in memories
    page.wait_for_function("el => el.exportData().step !== null", arg=widget.element_handle(), timeout=15000)
    step = widget.evaluate("el => el.exportData().step")
    recorded = next(e for e in events if e["type"] == "step" and e["step"] == step["step"])
    assert step["cost"] == recorded["cost"]
    screenshot(widget, "widget-memory-replay")

    # The cache view follows a recorded request; "Next token" steps the replay.
    page, widget = open_replay(new_page, static_site, "/chapters/12-the-kv-cache/", "kv-cache-view")
    page.evaluate("() => kvscope.client.replay.pause()")
    next_button = widget.get_by_role("button", name="Next token")
    counts = []
    for _ in range(40):
        next_button.click()
        data = widget.evaluate("el => el.exportData()")
        if data["history"] and (not counts or counts[-1] != data["tokens_in_cache"]):
            counts.append(data["tokens_in_cache"])
        if len(counts) >= 4 or data["finished"]:
            break
    assert len(counts) >= 3, counts
    history = data["history"]
    assert history[0]["added"] == history[0]["tokens_in_cache"] == data["num_prompt_tokens"]   # prefill
    assert all(s["added"] == 1 for s in history[1:]), history                                   # then one per step
    assert all(b - a == 1 for a, b in zip(counts, counts[1:])), counts
    screenshot(widget, "widget-cache-view-replay")
    assert_clean_apart_from_the_socket(page)


def test_attention_replays_the_watched_request(new_page, static_site, screenshot):
    page, widget = open_replay(new_page, static_site, "/chapters/04-attention/", "kv-attention")
    events = recording(static_site, page)
    attention = [e for e in events if e["type"] == "attention"]
    if not attention:
        import pytest
        pytest.skip("this page's recording holds no watched request")
    rid = attention[0]["request_id"]
    ours = [e for e in attention if e["request_id"] == rid]
    n = max(p for e in ours for p in e["query_positions"]) + 1
    page.wait_for_function("([el, n]) => el.exportData().matrix && el.exportData().matrix.length === n",
                           arg=[widget.element_handle(), n], timeout=20000)
    data = widget.evaluate("el => el.exportData()")
    assert data["request_id"] == rid and data["num_heads"] == ours[0]["num_heads"]
    layer = data["layer"]
    matrix = widget.evaluate("(el, l) => el.matrix(l, 'mean')", layer)
    for e in (e for e in ours if layer in e["layers"]):   # one event a step, every watched layer
        for r, q in enumerate(e["query_positions"]):
            assert matrix[q][: e["context_len"]] == e["mean"][e["layers"].index(layer)][r]   # as recorded, drawn
            assert all(w == 0 for w in matrix[q][q + 1:])
    screenshot(widget, "widget-attention-replay")
    assert_clean_apart_from_the_socket(page)


def test_inside_the_model_widgets_replay_the_internals_recording(new_page, static_site, screenshot):
    """Chapters 3, 5-10: each inside-the-model widget draws the recorded watched request."""
    cases = [("03-embeddings", "kv-embeddings", "el => el.exportData().tokens.length > 0"),
             ("05-multi-head-attention", "kv-heads", "el => el.exportData().rows > 0"),
             ("06-positional-encoding", "kv-rope", "el => el.exportData().inv_freq.length > 0"),
             ("07-mlp", "kv-mlp", "el => el.exportData().mlp !== null"),
             ("08-transformer-block", "kv-residual", "el => el.exportData().stream.length > 0"),
             ("09-full-model", "kv-logit-lens", "el => el.exportData().positions.length > 0"),
             ("10-sampling", "kv-sampling", "el => el.exportData().sum !== null")]
    for chapter, tag, ready in cases:
        page, widget = open_replay(new_page, static_site, f"/chapters/{chapter}/", tag)
        page.wait_for_function(ready, arg=widget.element_handle(), timeout=20000)
        assert widget.locator(".kvw-btn--primary").is_disabled()          # Run needs the live engine
        screenshot(widget, f"{tag[3:]}-replay")
        assert_clean_apart_from_the_socket(page)
        page.close()


def step_counts(events: list[dict]) -> list[int]:
    """`step` events sent after each step group (the rule of kvscope.instrumentation.recording)."""
    from kvscope.instrumentation.recording import step_group_ends
    return [sum(1 for e in events[:end] if e["type"] == "step") for end in step_group_ends(events)]


def test_replay_advances_by_steps_and_the_scrubber_goes_back(new_page, static_site, screenshot):
    page, widget = open_replay(new_page, static_site, "/chapters/14-continuous-batching/", "kv-batch-timeline")
    events = recording(static_site, page)
    hello = next(i for i, e in enumerate(events) if e["type"] == "hello")
    counts = step_counts(events[hello + 1:])
    state = lambda: page.evaluate("() => kvscope.client.replay.state")   # noqa: E731
    page.evaluate("() => { kvscope.client.replay.seek(0); }")
    assert state()["stepIndex"] == 0 and state()["stepCount"] == len(counts) >= 20
    handle = widget.element_handle()
    for n in (1, 2, 3):                                   # one engine step per press of Step
        page.locator("kv-connection").get_by_role("button", name="Step", exact=False).click()
        assert state()["stepIndex"] == n
        page.wait_for_function("([el, k]) => Number(el.dataset.steps || 0) === k", arg=[handle, counts[n - 1]])
    scrubber = page.locator(".kv-replay-scrubber")
    move = "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', {bubbles: true})); }"
    far = len(counts) - 2
    scrubber.evaluate(move, far)                          # forwards
    assert state()["stepIndex"] == far
    page.wait_for_function("([el, k]) => Number(el.dataset.steps) === Math.min(k, 60)", arg=[handle, counts[far - 1]])
    assert page.locator(".kv-replay-counter").text_content() == f"step {far} / {len(counts)}"
    scrubber.evaluate(move, 5)                            # and back
    assert state()["stepIndex"] == 5
    page.wait_for_function("([el, k]) => Number(el.dataset.steps) === k", arg=[handle, counts[4]])
    screenshot(page.locator("kv-connection"), "replay-controls")
    page.select_option("#kv-replay-speed", label="16")   # paced by steps: 16 a second
    page.evaluate("() => kvscope.client.replay.play()")
    page.wait_for_timeout(1000)
    page.evaluate("() => kvscope.client.replay.pause()")
    advanced = state()["stepIndex"] - 5
    assert 8 <= advanced <= 20, advanced
    assert_clean_apart_from_the_socket(page)
