"""<kv-pages> against the real server: the sandbox grid shows exactly what the block
manager reports (checked against the same operations replayed on a second, independent
sandbox), and the live pool equals the server's own `kv` snapshot."""
from __future__ import annotations

import json

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from widget_checks import wait_idle, wait_waiting

OPS = [
    ({"op": "reset"}, "Reset"),
    ({"op": "allocate", "seq": "A", "tokens": 6}, "Allocate"),
    ({"op": "fork", "seq": "A", "new_seq": "B"}, "Fork"),
    ({"op": "append", "seq": "B", "tokens": 3}, "Append"),
    ({"op": "allocate", "seq": "C", "tokens": 9, "prefix_of": "A"}, "Allocate"),
    ({"op": "free", "seq": "A"}, "Free"),
]


def ws_session(url: str, commands: list[dict], families: list[str] | None = None) -> list[dict]:
    """Each command's reply (and, with families, the snapshot that follows subscribing),
    over a second, independent connection. Sync client: Playwright's sync API owns this
    thread's event loop."""
    from websockets.sync.client import connect

    def events(ws) -> list[dict]:
        frame = json.loads(ws.recv(timeout=10))
        return frame if isinstance(frame, list) else [frame]

    replies = []
    with connect(url.replace("http://", "ws://") + "/ws", max_size=None) as ws:
        if families:
            ws.send(json.dumps({"ref": "sub", "type": "subscribe", "families": families}))
            while not any(e["type"] == "kv" for e in replies):
                replies += [e for e in events(ws) if e.get("type") == "kv"]
        for n, command in enumerate(commands):
            ws.send(json.dumps({"ref": n, **command}))
            while True:
                batch = events(ws)
                replies += [e for e in batch if e.get("ref") == n and e.get("type") != "ack"]
                if any(e.get("ref") == n for e in batch):
                    break
    return replies


def sandbox_replies(url: str, ops: list[dict]) -> list[dict]:
    return ws_session(url, [{"type": "sandbox", **op} for op in ops])


def grid_state(widget) -> list[dict]:
    return widget.locator(".kvp-sgrid [data-block]").evaluate_all("""els => els.map(g => ({
        id: +g.dataset.block, ref: +g.dataset.ref, filled: +g.dataset.filled,
        hash: g.dataset.hash || null, owners: g.dataset.owners ? g.dataset.owners.split(',') : []}))""")


def fill_form(sandbox, op: dict) -> None:
    if "seq" in op:
        sandbox.get_by_label("Sequence name").fill(op["seq"])
    if "tokens" in op:
        sandbox.get_by_label("Tokens", exact=True).fill(str(op["tokens"]))
    if op["op"] == "allocate":
        sandbox.get_by_label("Copy its first tokens from").select_option(op.get("prefix_of", ""))
    if "new_seq" in op:
        sandbox.get_by_label("Name of the fork").fill(op["new_seq"])


def open_pages(page, live_server):
    page.goto(live_server + "/chapters/15-paged-attention")
    page.wait_for_selector("kv-pages[data-painted]", state="attached")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator("kv-pages").first
    page.wait_for_function("el => el.exportData().sandbox !== null", arg=widget.element_handle())
    return widget


def test_sandbox_grid_is_what_the_block_manager_reports(page, live_server, screenshot, assert_clean):
    widget = open_pages(page, live_server)
    sandbox = widget.locator(".kvp-sandbox")
    sandbox.scroll_into_view_if_needed()
    expected = sandbox_replies(live_server, [op for op, _ in OPS])
    assert all(e["type"] == "sandbox" for e in expected), expected
    for (op, button), reference in zip(OPS, expected):
        before = int(widget.get_attribute("data-sandbox-replies"))
        fill_form(sandbox, op)
        sandbox.get_by_role("button", name=button, exact=True).click()
        page.wait_for_function("([el, n]) => +el.dataset.sandboxReplies > n", arg=[widget.element_handle(), before])
        shown = widget.evaluate("el => el.exportData().sandbox")
        # The widget's state is the server's reply, and the same operations on an
        # independent sandbox give the same blocks and tables.
        assert shown["blocks"] == reference["blocks"], op
        assert shown["seqs"] == reference["seqs"], op
        assert shown["fragmentation"] == reference["fragmentation"], op
        assert grid_state(widget) == reference["blocks"], op
        tables = sandbox.locator(".kvp-tables li").evaluate_all("els => els.map(li => li.dataset.seq)")
        assert tables == [s["name"] for s in reference["seqs"]]
        if op["op"] == "fork":     # the fork shares A's full block: its ref count rises to 2
            shared = reference["seqs"][0]["block_table"][0]
            assert sandbox.locator(f"[data-block='{shared}']").get_attribute("data-ref") == "2"
        if op["op"] == "free":     # A's own last block is free again but keeps its hash only if full
            freed = [b for b in reference["blocks"] if b["ref"] == 0 and b["hash"]]
            assert sandbox.locator(".kvp-cached").count() == len(freed)
    paged = sandbox.locator("[data-figure=paged]").inner_text()
    assert f"{expected[-1]['fragmentation']['paged']['reserved_slots']} reserved" in paged
    # Hover a table: its blocks stay bright, the others dim.
    sandbox.locator(".kvp-tables li[data-seq=C]").hover()
    table_c = expected[-1]["seqs"][-1]["block_table"]
    dimmed = sandbox.locator(".kvp-sgrid .kvp-dim").count()
    assert dimmed == expected[-1]["num_blocks"] - len(set(table_c))
    screenshot(widget, "widget-pages-sandbox")
    assert_clean(page)


def test_live_pool_equals_the_engine_snapshot(page, live_server, screenshot, assert_clean):
    widget = open_pages(page, live_server)
    # Real traffic: a prompt long enough to fill whole blocks; it finishes and leaves cached blocks.
    page.evaluate("""() => window.kvscope.client.command('submit', {prompt: 'Once upon a time there was a fox who liked to run in the forest with her friends every day.', params: {max_tokens: 24, temperature: 0, ignore_eos: true}})""")
    page.wait_for_function("el => el.exportData().pool.num_cached > 0 || el.exportData().pool.prefix_hits > 0", arg=widget.element_handle(), timeout=30000)
    wait_idle(live_server)
    snapshot = next(e for e in ws_session(live_server, [], families=["kv"]) if e["type"] == "kv")
    page.wait_for_function("([el, s]) => el.exportData().pool.step >= s", arg=[widget.element_handle(), snapshot["step"]])
    pool = widget.evaluate("el => el.exportData().pool")
    assert pool["num_blocks"] == snapshot["num_blocks"]
    assert pool["blocks"] == snapshot["blocks"]
    assert pool["tables"] == snapshot["tables"]
    for key in ("num_free", "num_cached", "prefix_hits", "evictions"):
        assert pool[key] == snapshot[key], key
        assert widget.locator(f"[data-figure={key}]").inner_text().replace(",", "") == str(snapshot[key])
    # Keyboard: the pool canvas takes focus and arrow keys read blocks out.
    widget.locator("canvas.kvp-pool").focus()
    page.keyboard.press("ArrowRight")
    assert widget.locator(".kvp-detail").inner_text().startswith("block 1:")
    screenshot(widget, "widget-pages-pool")
    # The toolbar's "Export image" saves the pool canvas as a PNG; "Export data" its JSON.
    with page.expect_download() as download:
        widget.get_by_role("button", name="Export image").click()
    assert download.value.suggested_filename.endswith(".png")
    with page.expect_download() as download:
        widget.get_by_role("button", name="Export data").click()
    saved = json.loads(open(download.value.path()).read())
    assert saved["widget"] == "kv-pages" and saved["data"]["pool"]["num_blocks"] == snapshot["num_blocks"]
    assert_clean(page)


def test_live_pool_shows_a_parallel_sampling_fork(page, live_server, instructor, instructor_token, screenshot,
                                                  assert_clean):
    """OpenAI n = 3, stepped by hand: after the prompt step the three choices' tables are
    the same blocks (ref count 3); after the first decode step the partly filled last block
    has been copied for two of them (copy-on-write) and the full blocks are still shared."""
    import threading

    import httpx
    widget = open_pages(page, live_server)
    wait_idle(live_server)
    body = {"prompt": "The fox ran into the forest and met a bear. " * 2, "max_tokens": 4, "n": 3,
            "temperature": 1.0, "seed": 5, "ignore_eos": True}
    handle = widget.element_handle()
    instructor({"type": "pause"}, until="pause")
    try:
        request = threading.Thread(target=lambda: httpx.post(
            f"{live_server}/v1/completions", json=body, timeout=60,
            headers={"Authorization": f"Bearer {instructor_token}"}))
        request.start()
        wait_waiting(live_server)      # the request reaches the paused engine
        instructor({"type": "step"}, until="step")
        page.wait_for_function("el => Object.keys(el.exportData().pool.tables).length === 3", arg=handle)
        tables = list(widget.evaluate("el => el.exportData().pool.tables").values())
        assert tables[0] == tables[1] == tables[2]
        refs = widget.evaluate("el => el.exportData().pool.blocks.filter(b => b.ref === 3).map(b => b.id)")
        assert sorted(refs) == sorted(tables[0])
        assert widget.locator(".kvp-tables .kvp-chip--shared").count() == 3 * len(tables[0])
        instructor({"type": "step"}, until="step")
        page.wait_for_function("el => el.querySelector('.kvp-events').textContent.includes('cow')", arg=handle)
        after = list(widget.evaluate("el => el.exportData().pool.tables").values())
        last = len(tables[0]) - 1
        assert all(t[:last] == tables[0][:last] for t in after)      # full blocks: still shared
        assert len({t[last] for t in after}) == 3                   # last block: one kept, two copies
        screenshot(widget, "widget-pages-fork")
    finally:
        instructor({"type": "resume"}, until="resume")
    request.join(30)
    wait_idle(live_server)


def figure(widget, key: str) -> int:
    return int(widget.locator(f"[data-figure={key}]").text_content().replace(",", ""))


def test_pool_load_control_fills_and_frees_the_pool(page, live_server, screenshot, assert_clean):
    """The widget's own control makes load (no other page, no instructor): blocks in use,
    block tables for the learner's requests; stopping frees them."""
    wait_idle(live_server)
    widget = open_pages(page, live_server)
    assert figure(widget, "used") == 0
    widget.get_by_role("button", name="Keep 3 requests running").click()
    handle = widget.element_handle()
    page.wait_for_function("el => el.load.running.size === 3", arg=handle)
    page.wait_for_function("el => Number(el.querySelector('[data-figure=used]').textContent) > 0", arg=handle)
    mine = widget.evaluate("el => [...el.load.running]")
    page.wait_for_function("([el, ids]) => ids.every(id => el.querySelector(`.kvp-tables [data-seq='${id}']`))",
                           arg=[handle, mine])
    tables = widget.evaluate("el => el.exportData().pool.tables")
    assert set(mine) <= set(tables) and all(len(tables[r]) >= 1 for r in mine)
    widget.locator("canvas.kvp-pool").scroll_into_view_if_needed()
    screenshot(widget, "pages-own-load")
    widget.get_by_role("button", name="Stop my requests").click()
    page.wait_for_function("el => Number(el.querySelector('[data-figure=used]').textContent) === 0", arg=handle)
    assert not widget.locator(".kvp-tables [data-seq]").count()
    assert_clean(page)


def test_prefix_demo_shares_blocks_and_computes_less(page, live_server, screenshot, assert_clean):
    """Chapter 16: one click, two held requests with the same system prompt; the pool shows
    blocks with ref count 2, and the second request computed fewer prefill tokens (the
    engine's own `step` counts)."""
    wait_idle(live_server)
    page.goto(live_server + "/chapters/16-prefix-caching")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator("kv-pages").first
    widget.get_by_role("button", name="Send two requests with this prompt").click()
    rows = widget.locator(".kvp-prefix-results li")
    page.wait_for_function("""el => {
        const rows = el.querySelectorAll('.kvp-prefix-results li[data-computed]');
        return rows.length === 2 && el.querySelector('.kvp-prefix-results + .kvw-note').textContent !== '';
    }""", arg=widget.element_handle())
    first, second = (rows.nth(i) for i in (0, 1))
    computed = [int(r.get_attribute("data-computed")) for r in (first, second)]
    cached = [int(r.get_attribute("data-cached")) for r in (first, second)]
    assert computed[1] < computed[0] and cached[0] == 0 and cached[1] > 0
    assert computed[1] + cached[1] == computed[0]          # same prompt length, split differently
    try:
        page.wait_for_function("el => el.exportData().pool.blocks.some(b => b.ref === 2)", arg=widget.element_handle())
    except PlaywrightTimeout:   # say what the page's pool held instead (CI saw this once, never again here)
        pool = widget.evaluate("el => el.exportData().pool")
        rids = [r.get_attribute("data-request") for r in (first, second)]
        held = {rid: pool["tables"].get(rid) for rid in rids}
        shared = [b for b in pool["blocks"] if b["ref"] > 1 or set(b["owners"]) & set(rids)]
        raise AssertionError(f"no block with ref 2 in the page's pool at step {pool['step']}: tables {held}, "
                             f"their blocks {shared[:12]}, totals {[pool[k] for k in ('num_free', 'prefix_hits')]}")
    shared = widget.evaluate("el => el.exportData().pool.blocks.filter(b => b.ref === 2).length")
    assert shared * int(widget.evaluate("el => el.exportData().pool.block_size")) == cached[1]
    widget.scroll_into_view_if_needed()
    screenshot(widget, "pages-prefix-demo")
    widget.get_by_role("button", name="Let them finish").click()
    page.wait_for_function("el => el.querySelectorAll('.kvp-prefix-results li').length === 2 && "
                           "[...el.querySelectorAll('.kvp-prefix-results li')].every(li => li.textContent.includes('Finished'))",
                           arg=widget.element_handle())
    assert_clean(page)
