"""<kv-step-plan> (chapter 14): vLLM V1's plan of each step, drawn from the engine's own
`step` events. Live on the real server the learner's button makes a mixed step (decodes of
running requests, then a chunk of a long prompt); the rows the widget shows are the event's
rows, in its order, with its numbers; the arrow keys move between steps. From the exported
book with no server, the committed recording shows the same lesson under a budget of 32."""
from __future__ import annotations

import json
from pathlib import Path

from test_accessibility import UNNAMED_CONTROLS
from widget_checks import check_exports, check_fits, recorded_views, wait_idle

REPO = Path(__file__).resolve().parents[2]
LIVE = "() => window.kvscope && window.kvscope.client.mode === 'live'"
# the rows the widget shows, in order, as numbers read from the DOM
SHOWN = """el => ({
  step: Number(el.dataset.step),
  used: Number(el.querySelector('[data-used]').dataset.used),
  budget: Number(el.querySelector('[data-budget]').dataset.budget),
  waiting: Number(el.querySelector('[data-waiting]').dataset.waiting),
  lesson: el.querySelector('[data-lesson]').textContent,
  segments: [...el.querySelectorAll('.ksp-bar [data-bar=budget] rect[data-reason]')].map(r => r.dataset.reason),
  rows: [...el.querySelectorAll('tbody tr')].map(tr => ({
    rid: tr.dataset.rid, reason: tr.dataset.reason, tokens: Number(tr.dataset.tokens), start: Number(tr.dataset.start),
    total: tr.dataset.total === '' ? null : Number(tr.dataset.total), text: tr.textContent})),
})"""


TABLE_OVERFLOW = "el => Math.max(...[...el.querySelectorAll('.kvw-scroll')].map(s => s.scrollWidth - s.clientWidth))"


def check_against_event(shown: dict, event: dict) -> None:
    """What the widget shows of a step is that step's event: rows in plan order, its numbers."""
    assert shown["step"] == event["step"]
    assert shown["used"] == event["num_batched_tokens"] and shown["budget"] == event["token_budget"]
    assert shown["waiting"] == event["queues"]["waiting"]
    assert [(r["rid"], r["reason"], r["tokens"], r["start"]) for r in shown["rows"]] == \
        [(s["request_id"], s["reason"], s["num_tokens"], s["start"]) for s in event["seqs"]]
    assert shown["segments"] == [s["reason"] for s in event["seqs"]]          # one bar segment per row
    for row in shown["rows"]:
        assert row["reason"] in row["text"]                                   # the reason in words, not colour alone
    shares = sum(r["tokens"] for r in shown["rows"])
    assert shares == event["num_batched_tokens"] <= event["token_budget"]


def is_mixed(shown: dict) -> bool:
    reasons = {r["reason"] for r in shown["rows"]}
    return "decode" in reasons and "prefill chunk" in reasons


def test_a_mixed_step_live_is_the_engines_own_plan(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(live_server + "/chapters/14-continuous-batching")
    page.wait_for_function(LIVE)
    widget = page.locator("kv-step-plan")
    handle = widget.element_handle()
    page.evaluate("""() => { window.seen = {steps: [], added: [], finished: []};
        window.kvscope.client.on('step', e => window.seen.steps.push(e));
        window.kvscope.client.on('request.finished', e => window.seen.finished.push(e));
        window.kvscope.client.on('request.added', e => window.seen.added.push(e)); }""")
    widget.scroll_into_view_if_needed()
    widget.get_by_role("button", name="Send a long prompt while two of mine decode").click()
    page.wait_for_function("el => el.dataset.lastRun", arg=handle, timeout=60000)
    # drawn (on the next frame) at the step it chose
    page.wait_for_function("el => el.dataset.source === 'live' && Number(el.dataset.step) === el.exportData().shown_step", arg=handle)
    seen = page.evaluate("() => window.seen")
    events = {e["step"]: e for e in seen["steps"]}
    long_rid = widget.evaluate("el => el.dataset.lastRun")
    prompt_tokens = next(e["num_prompt_tokens"] for e in seen["added"] if e["request_id"] == long_rid)
    # the widget opens the run on its first mixed step: the long prompt admitted beside decodes
    shown = widget.evaluate(SHOWN)
    check_against_event(shown, events[shown["step"]])
    first = {r["reason"] for r in shown["rows"] if r["rid"] == long_rid}
    assert first == {"new request"} and "decode" in {r["reason"] for r in shown["rows"]}
    # the arrow keys move to the next step: decodes first, then the prompt's next chunk
    widget.locator(".ksp-plan").focus()
    mixed = None
    for _ in range(10):
        before = shown["step"]
        page.keyboard.press("ArrowRight")
        page.wait_for_function("([el, s]) => Number(el.dataset.step) > s", arg=[handle, before])
        shown = widget.evaluate(SHOWN)
        assert shown["step"] == min(s for s in events if s > before)            # the next step the page saw
        check_against_event(shown, events[shown["step"]])
        if is_mixed(shown):
            mixed = shown
            break
    assert mixed, "no step with a decode and a prompt chunk after the long prompt arrived"
    reasons = [r["reason"] for r in mixed["rows"]]
    assert reasons.index("decode") < reasons.index("prefill chunk")          # running decodes are planned first
    chunk = next(r for r in mixed["rows"] if r["reason"] == "prefill chunk")
    assert chunk["rid"] == long_rid and chunk["tokens"] <= 64 and chunk["total"] == prompt_tokens
    assert chunk["start"] + chunk["tokens"] < prompt_tokens or "caught up" in chunk["text"]
    assert f"{chunk['start']} → {chunk['start'] + chunk['tokens']} of {prompt_tokens}" in chunk["text"]
    assert "chunk cap cut it" in mixed["lesson"]                              # 2,048 budget: the learner's cap cut it
    screenshot(widget, "step-plan-live-1280")
    # back one step, then Home and End
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("([el, s]) => Number(el.dataset.step) < s", arg=[handle, mixed["step"]])
    back = widget.evaluate(SHOWN)["step"]
    assert back == max(s for s in events if s < mixed["step"])
    assert widget.locator(".kv-widget__status").inner_text().startswith(f"Step {back}:")   # said to screen readers
    page.keyboard.press("Home")
    page.wait_for_function("el => Number(el.dataset.step) === Math.min(...el.exportData().steps.map(s => s.step))", arg=handle)
    data = widget.evaluate("el => el.exportData()")
    assert data["source"] == "live" and data["steps"]
    for plan in data["steps"]:
        if plan["step"] in events:
            assert plan["used"] == events[plan["step"]]["num_batched_tokens"] == sum(r["tokens"] for r in plan["rows"])
    check_exports(widget, "image/svg+xml")
    # the learner's two decoders are cancelled once the lesson is shown, not left to run on
    page.wait_for_function("() => window.seen.finished.length >= 3", timeout=30000)
    finished = {e["request_id"]: e for e in page.evaluate("() => window.seen.finished")}
    print({rid: (e["reason"], e["num_output_tokens"]) for rid, e in finished.items()})
    assert [e["reason"] for rid, e in finished.items() if rid != long_rid] == ["abort", "abort"]
    assert_clean(page)


def recorded_steps() -> dict:
    lines = (REPO / "frontend" / "recordings" / "step-plan.jsonl").read_text().splitlines()[1:]
    return {e["step"]: e for e in map(json.loads, lines) if e["type"] == "step"}


def test_the_recording_shows_the_plan_without_a_server(new_page, static_site, screenshot):
    events = recorded_steps()
    for page, widget, view in recorded_views(new_page, static_site, "/chapters/14-continuous-batching/", "kv-step-plan",
                                             "el => Number(el.dataset.recordedSteps) > 0 && el.dataset.step",
                                             views=((True, 768), (False, 1280))):
        handle = widget.element_handle()
        assert widget.get_by_role("button", name="Send a long prompt while two of mine decode").is_disabled()
        shown = widget.evaluate(SHOWN)
        check_against_event(shown, events[shown["step"]])           # opens on the first step mixing decodes and a prompt
        assert shown["used"] == shown["budget"] == 32 and shown["waiting"] == 1
        widget.locator(".ksp-plan").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function("([el, s]) => Number(el.dataset.step) === s + 1", arg=[handle, shown["step"]])
        shown = widget.evaluate(SHOWN)
        check_against_event(shown, events[shown["step"]])
        assert is_mixed(shown) and "budget ran out" in shown["lesson"]
        chunk = next(r for r in shown["rows"] if r["reason"] == "prefill chunk")
        assert chunk["tokens"] == shown["budget"] - sum(r["tokens"] for r in shown["rows"] if r["reason"] == "decode")
        widget.scroll_into_view_if_needed()
        screenshot(widget, f"step-plan-recorded-{view}")
        check_fits(page, widget)
        # later the pool runs out: a request is preempted, then comes back recomputing all it had
        preempting = next(s for s, e in events.items() if e["preempted"])
        resumed = next(s for s, e in events.items() if any(r["reason"] == "resumed after preemption" for r in e["seqs"]))
        victim = events[preempting]["preempted"][0]
        for target in (preempting, resumed):
            while (current := int(widget.get_attribute("data-step"))) < target:   # one key, one step
                page.keyboard.press("ArrowRight")
                page.wait_for_function("([el, s]) => Number(el.dataset.step) > s", arg=[handle, current])
            assert current == target
            shown = widget.evaluate(SHOWN)
            check_against_event(shown, events[target])
            if target == preempting:
                assert f"Preempted: {victim}" in shown["lesson"]
        back = next(r for r in shown["rows"] if r["reason"] == "resumed after preemption")
        assert back["rid"] == victim and back["start"] == 0 and back["tokens"] == back["total"]   # recomputed from 0
        assert widget.evaluate(TABLE_OVERFLOW) <= 1, "the resumed row pushes the table sideways"
        assert page.evaluate(UNNAMED_CONTROLS) == []
        # the progress bars slide from step to step, unless reduced motion is asked for (dark here)
        moving = widget.evaluate("""el => [...el.querySelectorAll('*')].filter(x =>
            parseFloat(getComputedStyle(x).transitionDuration) > 0.01).length""")
        assert (moving == 0) if view.startswith("dark") else (moving > 0)
