"""<kv-spec-sampling> (chapter 18): the exact sampling rule of speculative decoding on a real
verify pass. The bars are the engine's own p and q for the draft that decided the pass (the
`spec` event's `distribution`, sent for watched requests), the leftover is max(p − q, 0)
scaled to 1, and the rule run many times in the page produces a histogram whose distance to
p shrinks as the draws add up. Live on a server that speculates, the learner's own request;
from the recording, with no server, the same."""
from __future__ import annotations

import json
from pathlib import Path

from widget_checks import check_exports, check_fits, open_live_widget, recorded_views

REPO = Path(__file__).resolve().parents[2]
NGRAM = ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}')
SHOWN = """el => ({step: Number(el.dataset.step), draws: Number(el.dataset.draws),
  distance: el.dataset.distance === '' ? null : Number(el.dataset.distance),
  head: el.querySelector('[data-head]').textContent,
  col: Object.fromEntries(['p', 'q', 'left', 'seen'].map(k => [k,
    [...el.querySelectorAll(`rect[data-col=${k}]`)].map(r => Number(r.dataset.value))])),
  kept: el.querySelector('[data-kept]').textContent, expected: el.querySelector('[data-expected]').textContent})"""


def check_pass(shown: dict, event: dict) -> None:
    """The bars are the event's p and q (then the rest), the leftover max(p − q, 0) scaled to 1."""
    d = event["distribution"]
    assert shown["col"]["p"] == [round(v, 4) for v in d["p"] + [d["p_rest"]]]
    assert shown["col"]["q"] == [round(v, 4) for v in d["q"] + [d["q_rest"]]]
    over = [max(p - q, 0) for p, q in zip(d["p"] + [d["p_rest"]], d["q"] + [d["q_rest"]])]
    assert all(abs(a - b / sum(over)) < 1e-3 for a, b in zip(shown["col"]["left"], over))
    draft = d["ids"].index(event["checks"][d["check"]]["token_id"])
    assert shown["col"]["left"][draft] == 0            # the draft's share is taken out
    assert event["proposed_text"][d["check"]].strip() in shown["head"]


def converge(widget, page) -> list[float]:
    """Run the rule 100, then 1,000, then 10,000 more times: the distance after each."""
    handle = widget.element_handle()
    distances = []
    for n in (100, 1000, 10000):
        before = widget.evaluate(SHOWN)["draws"]
        widget.locator(f"button[data-draws='{n}']").click()
        page.wait_for_function("([el, n]) => Number(el.dataset.draws) === n", arg=[handle, before + n])
        shown = widget.evaluate(SHOWN)
        assert abs(sum(shown["col"]["seen"]) - 1) < 1e-3
        distances.append(shown["distance"])
    return distances


def test_the_recording_converges_to_p(new_page, static_site, screenshot):
    lines = (REPO / "frontend" / "recordings" / "spec-sampling.jsonl").read_text().splitlines()[1:]
    passes = {e["step"]: e for e in map(json.loads, lines) if e["type"] == "spec" and e.get("distribution")}
    assert passes
    for page, widget, view in recorded_views(new_page, static_site, "/chapters/18-speculative-decoding/",
                                             "kv-spec-sampling", "el => Number(el.dataset.recordedPasses) > 0 && el.dataset.step"):
        handle = widget.element_handle()
        shown = widget.evaluate(SHOWN)
        event = passes[shown["step"]]
        check_pass(shown, event)
        d = event["distribution"]
        draft_p = d["p"][d["ids"].index(event["checks"][d["check"]]["token_id"])]
        assert 0.02 < draft_p < 0.98                        # it opens on a pass whose draft could go either way
        distances = converge(widget, page)
        assert distances[0] > distances[1] > distances[2] and distances[2] < 0.03, distances
        shown = widget.evaluate(SHOWN)
        kept, expected = (float(shown[k].rstrip(" %")) for k in ("kept", "expected"))
        assert abs(kept - expected) <= 2                    # kept drafts: Σ min(p, q), within 2 points
        screenshot(widget, f"spec-sampling-recorded-{view}")
        # the arrow keys move to another real pass, and its draws start afresh
        widget.locator(".kss-figure").focus()
        page.keyboard.press("ArrowRight" if shown["step"] != max(passes) else "ArrowLeft")
        page.wait_for_function("([el, s]) => Number(el.dataset.step) !== s", arg=[handle, shown["step"]])
        moved = widget.evaluate(SHOWN)
        assert moved["draws"] == 0
        check_pass(moved, passes[moved["step"]])
        # Home and End: the first and the last pass (the buttons say where the ends are); D draws there
        order = list(passes)   # the recording's order
        page.keyboard.press("End")
        page.wait_for_function("([el, s]) => Number(el.dataset.step) === s", arg=[handle, order[-1]])
        assert widget.get_by_role("button", name="Later pass ▶").is_disabled()
        page.keyboard.press("Home")
        page.wait_for_function("([el, s]) => Number(el.dataset.step) === s", arg=[handle, order[0]])
        assert widget.get_by_role("button", name="◀ Earlier pass").is_disabled()
        page.keyboard.press("d")
        page.wait_for_function("el => el.dataset.draws === '1000'", arg=handle)
        check_fits(page, widget)


def test_the_learners_own_pass_live(page, own_server, tmp_path, screenshot, assert_clean):
    url, _ = own_server(tmp_path, extra_args=NGRAM)
    widget = open_live_widget(page, url, "/chapters/18-speculative-decoding", "kv-spec-sampling")
    handle = widget.element_handle()
    page.evaluate("() => { window.specs = []; window.kvscope.client.on('spec', e => window.specs.push(e)); }")
    widget.get_by_role("button", name="Sample a story with speculation").click()
    page.wait_for_function("el => el.dataset.source === 'live' && Number(el.dataset.livePasses) > 0 && el.dataset.step",
                           arg=handle, timeout=120000)
    specs = page.evaluate("() => window.specs")
    mine = [e for e in specs if e.get("distribution")]
    assert mine and all(sum(e["distribution"]["p"]) + e["distribution"]["p_rest"] > 0.99 for e in mine)
    shown = widget.evaluate(SHOWN)
    check_pass(shown, next(e for e in mine if e["step"] == shown["step"]))
    distances = converge(widget, page)
    assert distances[2] < distances[0] and distances[2] < 0.03, distances
    screenshot(widget, "spec-sampling-live-1280")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
