"""<kv-ring-allreduce> (chapter 19): a ring all-reduce round by round. For N GPUs it takes
2(N − 1) rounds; after the first N − 1 (reduce-scatter) each GPU holds one piece summed over
all, after all of them every GPU holds every piece summed; each GPU sends 2(N − 1)/N of the
vector, which grows with N but stays under twice the vector. Beside it, the engine's own
bytes between ranks (`allreduce_bytes`), equal to the sum worked out from the model's shape:
live on a server with two ranks, and from the recording with no server."""
from __future__ import annotations

import json
from pathlib import Path

from widget_checks import check_exports, check_fits, open_live_widget, recorded_views

REPO = Path(__file__).resolve().parents[2]
PIECES = "el => [...el.querySelectorAll('[data-rank]')].map(g => g.dataset.pieces.split(',').map(Number))"
TABLE = "el => [...el.querySelectorAll('tr[data-n]')].map(r => [Number(r.dataset.n), Number(r.dataset.rounds), Number(r.dataset.perGpu)])"
ENGINE = "el => [...el.querySelectorAll('tr[data-measured]')].map(r => [Number(r.dataset.step), Number(r.dataset.measured), Number(r.dataset.computed)])"


def check_ring(widget, page) -> None:
    handle = widget.element_handle()
    ring = widget.locator(".kra-ring")
    for n in range(2, 9):
        widget.locator("select").select_option(str(n))
        page.wait_for_function("([el, n]) => Number(el.dataset.n) === n && el.dataset.round === '0'", arg=[handle, n])
        assert int(widget.get_attribute("data-rounds")) == 2 * (n - 1)
        assert widget.evaluate(PIECES) == [[1] * n] * n                 # each GPU: only its own values
        ring.focus()
        for _ in range(n - 1):                                           # reduce-scatter, one key a round
            page.keyboard.press("ArrowRight")
        page.wait_for_function("([el, r]) => Number(el.dataset.round) === r", arg=[handle, n - 1])
        pieces = widget.evaluate(PIECES)
        assert all(row.count(n) == 1 for row in pieces)                  # one piece summed over all, per GPU
        assert sorted(row.index(n) for row in pieces) == list(range(n))  # a different piece on each
        page.keyboard.press("End")
        page.wait_for_function("([el, r]) => Number(el.dataset.round) === r", arg=[handle, 2 * (n - 1)])
        assert widget.evaluate(PIECES) == [[n] * n] * n                  # every GPU holds the whole sum
    table = widget.evaluate(TABLE)
    payload = int(widget.get_attribute("data-payload"))
    assert [r for _, r, _ in table] == [2 * (n - 1) for n in range(2, 9)]   # rounds grow with N
    per_gpu = [b for _, _, b in table]
    assert per_gpu[0] == payload and per_gpu == sorted(per_gpu) and per_gpu[-1] < 2 * payload   # bytes hardly do


def test_the_ring_and_the_recorded_ranks(new_page, static_site, screenshot):
    lines = (REPO / "frontend" / "recordings" / "ring.jsonl").read_text().splitlines()[1:]
    steps = {e["step"]: e for e in map(json.loads, lines) if e["type"] == "step"}
    for page, widget, view in recorded_views(new_page, static_site, "/chapters/19-tensor-and-pipeline-parallelism/",
                                             "kv-ring-allreduce", "el => Number(el.dataset.recordedSteps) > 0"):
        check_ring(widget, page)
        rows = widget.evaluate(ENGINE)
        assert len(rows) == 2
        for step, measured, computed in rows:
            assert measured == steps[step]["allreduce_bytes"] == computed   # the engine's count, taken apart exactly
        widget.locator("select").select_option("4")
        widget.locator(".kra-ring").focus()
        for _ in range(2):
            page.keyboard.press("ArrowRight")
        page.wait_for_function("el => el.dataset.round === '2'", arg=widget.element_handle())
        screenshot(widget, f"ring-allreduce-recorded-{view}")
        check_fits(page, widget)


def test_the_live_ranks_bytes(page, own_server, tmp_path, screenshot, assert_clean):
    url, _ = own_server(tmp_path, extra_args=("--tensor-parallel-size", "2"))
    widget = open_live_widget(page, url, "/chapters/19-tensor-and-pipeline-parallelism", "kv-ring-allreduce")
    page.evaluate("() => { window.steps = []; window.kvscope.client.on('step', e => window.steps.push(e)); }")
    widget.get_by_role("button", name="Send a request to the ranks").click()
    page.wait_for_function("el => Number(el.dataset.liveSteps) >= 8", arg=widget.element_handle(), timeout=120000)
    seen = {e["step"]: e for e in page.evaluate("() => window.steps")}
    rows = widget.evaluate(ENGINE)
    assert rows
    for step, measured, computed in rows:
        assert measured == seen[step]["allreduce_bytes"] == computed
    check_ring(widget, page)
    screenshot(widget, "ring-allreduce-live-1280")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
