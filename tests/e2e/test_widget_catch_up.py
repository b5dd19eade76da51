"""<kv-catch-up> (chapter 14): one token budget per step, one bar per request (computed
tokens out of the tokens it has). From the recording (budget 32, prompt lookup, 11 blocks)
the four buttons reach a prompt chunk (part of a prompt, the rest still missing), a decode
(a gap of one), a verify (a gap of 1 + its drafts) and a preemption (computed count back to
0); each bar is the step event's own numbers. Live, the learner's button sends a long prompt
in chunks beside two short ones (held, then released together), and the bars are the live steps'."""
from __future__ import annotations

import json
from pathlib import Path

from widget_checks import check_exports, check_fits, open_live_widget, recorded_views, wait_idle

REPO = Path(__file__).resolve().parents[2]
SHOWN = """el => ({step: Number(el.dataset.step),
  budget: [...el.querySelectorAll('[data-bar=budget] rect[data-rid]')].map(r => [r.dataset.rid, Number(r.dataset.tokens)]),
  rows: [...el.querySelectorAll('g[data-reason]')].map(g => ({rid: g.dataset.rid, reason: g.dataset.reason,
    start: Number(g.dataset.start), end: Number(g.dataset.end), total: Number(g.dataset.total),
    drafts: Number(g.dataset.drafts), lost: Number(g.dataset.lost || 0), text: g.textContent}))})"""


def check_step(shown: dict, event: dict) -> None:
    rows = [r for r in shown["rows"] if r["reason"] != "preempted"]
    assert [(r["rid"], r["reason"], r["start"], r["end"] - r["start"]) for r in rows] == \
        [(s["request_id"], s["reason"], s["start"], s["num_tokens"]) for s in event["seqs"]]
    assert shown["budget"] == [[s["request_id"], s["num_tokens"]] for s in event["seqs"]]
    assert sum(t for _, t in shown["budget"]) == event["num_batched_tokens"] <= event["token_budget"]
    assert [r["rid"] for r in shown["rows"] if r["reason"] == "preempted"] == event["preempted"]
    for r in rows:
        assert r["start"] <= r["end"] <= r["total"]
        if r["reason"] == "decode":
            assert r["end"] - r["start"] == 1 and r["end"] == r["total"]         # a gap of one, closed
        if r["reason"] == "verify drafts":
            assert r["end"] - r["start"] == 1 + r["drafts"] and r["drafts"] > 0 and "caught up" in r["text"]


def test_the_four_moments_from_the_recording(new_page, static_site, screenshot):
    lines = (REPO / "frontend" / "recordings" / "catch-up.jsonl").read_text().splitlines()[1:]
    events = [e for e in map(json.loads, lines) if e["type"] == "step"]
    by_step = {e["step"]: e for e in events}
    first = {
        "chunk": next(e["step"] for e in events if any(s["reason"] == "prefill chunk" and not s["samples"] for s in e["seqs"])),
        "decode": next(e["step"] for e in events if any(s["reason"] == "decode" for s in e["seqs"])),
        "verify": next(e["step"] for e in events if any(s["reason"] == "verify drafts" for s in e["seqs"])),
        "preemption": next(e["step"] for e in events if e["preempted"]),
    }
    for page, widget, view in recorded_views(new_page, static_site, "/chapters/14-continuous-batching/", "kv-catch-up",
                                             "el => Number(el.dataset.recordedSteps) > 0 && el.dataset.step"):
        handle = widget.element_handle()
        assert int(widget.get_attribute("data-step")) == first["verify"]          # it opens on a verify
        for moment, step in first.items():
            widget.locator(f"button[data-moment={moment}]").click()
            page.wait_for_function("([el, s]) => Number(el.dataset.step) === s", arg=[handle, step])
            shown = widget.evaluate(SHOWN)
            check_step(shown, by_step[step])
            if moment == "chunk":
                chunk = next(r for r in shown["rows"] if r["reason"] == "prefill chunk" and r["end"] < r["total"])
                assert chunk["end"] < chunk["total"] and "still missing" in chunk["text"]
            if moment == "preemption":
                gone = next(r for r in shown["rows"] if r["reason"] == "preempted")
                assert gone["lost"] > 0 and gone["end"] == 0 and "back to 0" in gone["text"]
                screenshot(widget, f"catch-up-recorded-preemption-{view}")
        # the preempted request comes back with a gap again, and the arrow keys walk there
        victim = by_step[first["preemption"]]["preempted"][0]
        back = next(e["step"] for e in events if any(s["request_id"] == victim and s["reason"] == "resumed after preemption" for s in e["seqs"]))
        widget.locator(".kcu-plan").focus()
        while (current := int(widget.get_attribute("data-step"))) < back:
            page.keyboard.press("ArrowRight")
            page.wait_for_function("([el, s]) => Number(el.dataset.step) > s", arg=[handle, current])
        shown = widget.evaluate(SHOWN)
        check_step(shown, by_step[back])
        resumed = next(r for r in shown["rows"] if r["rid"] == victim)
        assert resumed["reason"] == "resumed after preemption" and resumed["start"] < resumed["total"]
        widget.locator("button[data-moment=verify]").click()
        page.wait_for_function("([el, s]) => Number(el.dataset.step) === s", arg=[handle, first["verify"]])
        screenshot(widget, f"catch-up-recorded-verify-{view}")
        check_fits(page, widget)


def test_live_chunks_and_decodes(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_live_widget(page, live_server, "/chapters/14-continuous-batching", "kv-catch-up")
    handle = widget.element_handle()
    page.evaluate("() => { window.steps = []; window.kvscope.client.on('step', e => window.steps.push(e)); }")
    widget.get_by_role("button", name="Send two short prompts and a long one in chunks").click()
    page.wait_for_function("el => el.dataset.lastRun", arg=handle, timeout=30000)
    mine = widget.get_attribute("data-last-run").split()
    long_rid = mine[-1]
    wait_idle(live_server, timeout=60)
    page.wait_for_timeout(500)
    # the widget keeps the last LIVE_STEPS_KEPT steps: look for the mix among those it still holds
    kept = {s["step"] for s in widget.evaluate("el => el.exportData()")["steps"]}
    every = page.evaluate("() => window.steps")
    chunks = {e["step"]: s for e in every for s in e["seqs"] if s["request_id"] == long_rid and s["reason"] == "prefill chunk"}
    # held, then released by one command: the three start in the same step
    first = next(e for e in every if any(s["request_id"] in mine for s in e["seqs"]))
    assert {s["request_id"] for s in first["seqs"]} >= set(mine)
    prompt_end = max(s["start"] + s["num_tokens"] for s in chunks.values())
    mixed = next(e for e in every if e["step"] in kept and e["step"] in chunks
                 and chunks[e["step"]]["start"] + chunks[e["step"]]["num_tokens"] < prompt_end   # a chunk, not the last
                 and any(s["request_id"] in mine and s["reason"] == "decode" for s in e["seqs"]))
    widget.locator(".kcu-plan").focus()
    page.keyboard.press("Home")
    page.wait_for_function("([el, s]) => Number(el.dataset.step) === s", arg=[handle, min(kept)])
    while (current := int(widget.get_attribute("data-step"))) < mixed["step"]:
        page.keyboard.press("ArrowRight")
        page.wait_for_function("([el, s]) => Number(el.dataset.step) > s", arg=[handle, current])
    shown = widget.evaluate(SHOWN)
    check_step(shown, mixed)
    chunk = next(r for r in shown["rows"] if r["rid"] == long_rid)
    assert chunk["end"] - chunk["start"] <= 48 and chunk["end"] < chunk["total"]   # the learner's cap, the rest missing
    screenshot(widget, "catch-up-live-1280")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
