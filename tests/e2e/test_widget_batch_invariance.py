"""<kv-batch-invariance> (chapter 20): one prompt drawn greedily alone, then beside a sweep of
other requests, each token with its logprob. The learner sees both runs' tokens, each
position's logprob difference, its largest value where the texts agree (never negative) and
where, if ever, a token flips; every number is the engine's own, from the recording and live."""
from __future__ import annotations

import json
from pathlib import Path

from widget_checks import check_exports, check_fits, open_live_widget, recorded_views, wait_idle

REPO = Path(__file__).resolve().parents[2]
CHAPTER = "/chapters/20-throughput-vs-latency/"
SHOWN = """el => ({source: el.dataset.source, maxDelta: Number(el.dataset.maxDelta), flip: el.dataset.flip,
  max: el.querySelector('[data-max]').textContent, same: el.querySelector('[data-same]').textContent,
  beside: Number(el.querySelector('[data-beside]').textContent),
  rows: [...el.querySelectorAll('tbody tr')].map(tr => ({alone: Number(tr.querySelector('[data-alone]').dataset.alone),
    crowd: Number(tr.querySelector('[data-crowd]').dataset.crowd), delta: Number(tr.querySelector('[data-delta]').dataset.delta),
    aloneText: tr.querySelector('[data-alone]').textContent, cells: [...tr.querySelectorAll('td')].map(td => td.textContent)}))})"""
SHOTS = Path("/work/notes/shots")


def two_runs(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The tokens of the two requests that asked for logprobs, in order of their first token."""
    runs: dict = {}
    for e in events:
        if e["type"] == "request.token" and "logprob" in e:
            runs.setdefault(e["request_id"], []).append(e)
    alone, crowd = sorted((sorted(t, key=lambda e: e["index"]) for t in runs.values()), key=lambda t: t[0]["ts"])
    return alone, crowd


def expected(alone: list[dict], crowd: list[dict]) -> tuple[float, str]:
    """The largest |crowd − alone| logprob before the first flip, and the flip's position."""
    flip = next((i for i, (a, c) in enumerate(zip(alone, crowd)) if a["token_id"] != c["token_id"]), None)
    same = list(zip(alone, crowd))[:flip]
    return max(abs(c["logprob"] - a["logprob"]) for a, c in same), "none" if flip is None else str(flip)


def check_shown(shown: dict, alone: list[dict], crowd: list[dict]) -> None:
    assert len(shown["rows"]) == len(alone) == len(crowd) > 0               # every position, both runs
    for row, a, c in zip(shown["rows"], alone, crowd):
        assert (row["alone"], row["crowd"]) == (a["token_id"], c["token_id"])
        assert row["delta"] == c["logprob"] - a["logprob"]
        assert row["cells"][1] == f"{a['logprob']:.7f}" and row["cells"][2] == f"{c['logprob']:.7f}"
    assert "".join(r["aloneText"] for r in shown["rows"]).strip()            # the text, not ids
    assert all(("→" in r["aloneText"]) == (r["alone"] != r["crowd"]) for r in shown["rows"])   # a flip shows both
    most, flip = expected(alone, crowd)
    assert shown["maxDelta"] >= 0 and abs(shown["maxDelta"] - most) < 1e-12 and shown["flip"] == flip
    assert shown["max"] == "0 exactly" if most == 0 else abs(float(shown["max"]) - most) <= 0.005 * most
    assert shown["same"].startswith("yes") == (flip == "none")
    assert shown["beside"] >= 1                                               # the crowd was there


def test_the_recorded_runs(new_page, static_site, screenshot):
    lines = (REPO / "frontend" / "recordings" / "batch-invariance.jsonl").read_text().splitlines()[1:]
    alone, crowd = two_runs([json.loads(line) for line in lines])
    for page, widget, view in recorded_views(new_page, static_site, CHAPTER, "kv-batch-invariance",
                                             "el => Number(el.dataset.recordedPositions) > 0 && el.dataset.maxDelta",
                                             height=1100):
        check_shown(widget.evaluate(SHOWN), alone, crowd)
        path = screenshot(widget, f"batch-invariance-recorded-{view}")
        if SHOTS.is_dir():
            (SHOTS / f"invariance-recorded-{view}.png").write_bytes(path.read_bytes())
        check_fits(page, widget)


def test_the_learners_two_runs_live(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_live_widget(page, live_server, CHAPTER, "kv-batch-invariance")
    # the page's own copy of every token event with a logprob, beside the widget's
    page.evaluate("() => { window.seenTokens = []; window.kvscope.client.on('request.token', e => { if (e.logprob !== undefined) window.seenTokens.push(e); }); }")
    button = widget.get_by_role("button", name="Run it alone, then in a crowd")
    button.focus()
    page.keyboard.press("Enter")
    page.wait_for_function("el => el.dataset.liveRuns === '1' && el.dataset.source === 'live'", arg=widget.element_handle(), timeout=180000)
    alone, crowd = two_runs(page.evaluate("() => window.seenTokens"))
    shown = widget.evaluate(SHOWN)
    assert shown["source"] == "live"
    check_shown(shown, alone, crowd)
    path = screenshot(widget, "batch-invariance-live-1280")
    if SHOTS.is_dir():
        (SHOTS / "invariance-live-1280.png").write_bytes(path.read_bytes())
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
