"""<kv-roofline> (chapter 13): a log-log roofline of the engine's machine (its measured
bandwidth and FLOP/s ceilings from `hello.device`) with the engine's decode steps on it,
grouped by batch size. As the batch grows the point moves right (more FLOPs per byte: the
requests share one read of the weights) and up while it is memory-bound; the recording's
largest batch passes the ridge, so the learner sees the turn to compute-bound. From the
recording each point is the fastest of its steps; live, the learner's button runs that many
of their own requests."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from widget_checks import check_exports, check_fits, open_live_widget, recorded_views, wait_idle

REPO = Path(__file__).resolve().parents[2]
SHOWN = """el => ({batch: Number(el.dataset.batch), intensity: Number(el.dataset.intensity), flops: Number(el.dataset.flops),
  points: [...el.querySelectorAll('circle[data-batch]')].map(c => [Number(c.dataset.batch), Number(c.dataset.x), Number(c.dataset.y)]),
  lesson: el.querySelector('[data-lesson]').textContent})"""


def recorded_points() -> dict:
    """Per batch size of the recording: its median intensity and its fastest step's FLOP/s."""
    lines = (REPO / "frontend" / "recordings" / "roofline.jsonl").read_text().splitlines()[1:]
    groups: dict = {}
    for e in map(json.loads, lines):
        if e["type"] == "step" and e["seqs"] and all(s["reason"] == "decode" for s in e["seqs"]):
            c = e["cost"]
            groups.setdefault(len(e["seqs"]), []).append((c["flops"] / c["bytes"], c["achieved_flops_per_s"]))
    return {b: (statistics.median(x for x, _ in v), max(y for _, y in v)) for b, v in groups.items() if len(v) >= 3}


def recorded_ridge() -> float:
    """The ridge of the recorded machine: its peak FLOP/s over its peak bandwidth (`hello.device`)."""
    hello = json.loads((REPO / "frontend" / "recordings" / "roofline.jsonl").read_text().splitlines()[1])
    return hello["device"]["peak_flops"] / hello["device"]["peak_bandwidth_bytes_per_s"]


def test_the_recorded_recordedmove_right_and_up(new_page, static_site, screenshot):
    recorded = recorded_points()
    assert sorted(recorded) == [1, 2, 4, 8, 16, 32, 64, 128]
    ridge = recorded_ridge()
    for page, widget, view in recorded_views(new_page, static_site, "/chapters/13-gpu-memory-hierarchy/", "kv-roofline",
                                             "el => Number(el.dataset.recordedBatches) === 8 && el.dataset.intensity"):
        handle = widget.element_handle()
        slider = widget.locator("input[type=range]")
        slider.focus()
        page.keyboard.press("Home")
        shown = []
        for i in range(len(recorded)):
            if i:
                page.keyboard.press("ArrowRight")
            page.wait_for_function("([el, b]) => Number(el.dataset.batch) === b", arg=[handle, sorted(recorded)[i]])
            s = widget.evaluate(SHOWN)
            x, y = recorded[s["batch"]]
            assert abs(s["intensity"] - x) < 1e-3 and abs(s["flops"] - y) <= 1     # the engine's own steps
            shown.append(s)
        intensities = [s["intensity"] for s in shown]
        assert intensities == sorted(intensities) and intensities[-1] > 10 * intensities[0]   # right
        assert max(s["flops"] for s in shown) > 2 * shown[0]["flops"]                         # and up
        xs = [x for _, x, _ in shown[-1]["points"]]
        ys = [y for _, _, y in shown[-1]["points"]]
        assert xs == sorted(xs) and min(ys) < ys[0]         # on screen too (SVG y grows downwards)
        # the turn: the small batches left of the ridge, memory-bound; the largest right of it
        for s in shown:
            assert ("compute-bound" in s["lesson"]) == (s["intensity"] > ridge) and "ridge" in s["lesson"]
        assert "memory-bound" in shown[0]["lesson"] and "compute-bound" in shown[-1]["lesson"]
        screenshot(widget, f"roofline-recorded-{view}")
        check_fits(page, widget)


def test_the_learners_batches_live(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_live_widget(page, live_server, "/chapters/13-gpu-memory-hierarchy", "kv-roofline")
    handle = widget.element_handle()
    widget.locator("select").select_option("live")
    page.wait_for_function("el => el.dataset.source === 'live'", arg=handle)
    slider = widget.locator("input[type=range]")
    slider.focus()
    page.keyboard.press("End")
    # the most a learner's sweep may keep in flight (kvscope serve --learner-max-sweep-in-flight, 32)
    page.wait_for_function("el => Number(el.dataset.batch) === 32", arg=handle)
    most = 32
    got = {}
    for batch in (1, most):
        slider.focus()
        page.keyboard.press("Home" if batch == 1 else "End")
        page.wait_for_function("([el, b]) => Number(el.dataset.batch) === b", arg=[handle, batch])
        widget.get_by_role("button", name=f"Run {batch} of my requests together").click()
        page.wait_for_function("el => el.dataset.intensity", arg=handle, timeout=90000)
        got[batch] = widget.evaluate(SHOWN)
    assert got[most]["intensity"] > 3 * got[1]["intensity"]     # right
    assert got[most]["flops"] > got[1]["flops"]                 # and up
    screenshot(widget, "roofline-live-1280")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
