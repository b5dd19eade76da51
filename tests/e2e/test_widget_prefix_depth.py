"""Chapter 16's prefix-cache traps, as a learner sees them on the live engine: two prompts
sharing less than a block get 0 cached tokens; sharing more, the second gets whole blocks
(a multiple of the engine's block size); the same prompt under two cache salts shares
nothing, under one salt it does. The cached counts on screen are the engine's own."""
from __future__ import annotations

import json
import re
import urllib.request

from test_accessibility import UNNAMED_CONTROLS
from widget_checks import wait_idle

CHAPTER = "/chapters/16-prefix-caching"
PANEL = 'section[aria-label="Whole blocks and cache salts"]'


def rows_of(panel) -> list[dict]:
    return panel.evaluate("""el => [...el.querySelectorAll('tbody tr')].map(tr => ({
        rid: tr.dataset.request, common: Number(tr.dataset.common), cached: Number(tr.dataset.cached),
        shown: tr.querySelector('[data-cell=cached]').textContent, prompt: tr.children[1].textContent}))""")


def press(panel, name_part: str, rows: int) -> list[dict]:
    """Press a button by keyboard (focus, Enter) and wait for its rows."""
    button = panel.locator("button", has_text=name_part)
    button.focus()
    button.press("Enter")
    try:
        panel.page.wait_for_function("([el, n]) => el.querySelectorAll('tbody tr').length >= n",
                                     arg=[panel.element_handle(), rows], timeout=60000)
    except Exception:
        raise AssertionError(f"no {rows} rows after pressing {name_part!r}; the panel says:\n{panel.inner_text()}") from None
    return rows_of(panel)


def check_share_buttons(panel, bs: int) -> None:
    """Each button's name is the words it shows (no aria-label saying others), and the words
    are true of the engine's block size: the chapter asks for the one sharing "more than two blocks"."""
    short = panel.locator("button", has_text="less than a block")
    long = panel.locator("button", has_text="more than")
    for button in (short, long, panel.locator("button", has_text="Send the pair")):
        text = button.inner_text()
        assert button.get_attribute("aria-label") is None, text
        assert panel.get_by_role("button", name=text, exact=True).count() == 1, text
        assert "block" in panel.locator(f"#{button.get_attribute('aria-describedby')}").inner_text()
    n, size = map(int, re.fullmatch(r"Share (\d+) tokens \(less than a block of (\d+)\)", short.inner_text()).groups())
    assert size == bs and n < bs
    n, k, size = map(int, re.fullmatch(r"Share (\d+) tokens \(more than (\d+) blocks of (\d+)\)", long.inner_text()).groups())
    assert size == bs and k == 2 and n > k * bs


def open_chapter(new_page, url: str, **options):
    page = new_page(**options)
    page.goto(url + CHAPTER)
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    panel = page.locator(PANEL)
    page.wait_for_function("el => el.querySelector('[data-block-size]').dataset.blockSize > 0", arg=panel.element_handle())
    return page, panel


def test_zero_hit_its_fix_and_salts(new_page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    page, panel = open_chapter(new_page, live_server, viewport={"width": 1280, "height": 800})
    bs = page.evaluate("window.kvscope.client.hello.engine.block_size")
    assert panel.locator("[data-block-size]").inner_text().count(f"hold {bs} tokens") == 1
    check_share_buttons(panel, bs)
    assert page.get_by_text("more than two blocks").count() == 1   # the chapter's step 6 names that button

    # the 0 % hit: a shared beginning shorter than a block
    short = press(panel, "less than a block", 2)
    assert 0 < short[1]["common"] < bs
    assert [r["cached"] for r in short] == [0, 0] and [r["shown"] for r in short] == ["0", "0"]
    assert "0 % hit" in panel.locator(f'.kvp-lessons-verdict [data-request="{short[1]["rid"]}"]').inner_text()

    # the fix: a shared beginning longer than a block; whole blocks only, the rest recomputed
    long = press(panel, "more than", 4)[2:]
    first, second = long
    assert first["cached"] == 0 and first["shown"] == "0" and second["common"] > bs
    assert second["cached"] > 0 and second["cached"] % bs == 0
    assert second["cached"] == second["common"] // bs * bs
    assert second["shown"] == str(second["cached"])
    verdict = panel.locator(f'.kvp-lessons-verdict [data-request="{second["rid"]}"]').inner_text()
    assert f"{second['cached'] // bs} × {bs}" in verdict and "recomputes" in verdict
    row = panel.locator(f'tr[data-request="{second["rid"]}"]')
    assert row.locator(".kvp-cell--cached").count() == second["cached"] // bs
    assert row.locator(".kvp-cell--recomputed").count() == 1
    screenshot(panel, "prefix-depth-fix-1280")

    # cache_salt: one prompt as tenant A, tenant B, then A again
    a, b, a2 = press(panel, "tenant A, tenant B", 7)[4:]
    length = int(a["prompt"])
    assert b["common"] == a2["common"] == length            # the very same tokens each time
    assert a["cached"] == 0 and b["cached"] == 0            # different salts share nothing
    assert a2["cached"] > 0 and a2["cached"] % bs == 0      # equal salts share whole blocks
    assert "cache_salt differs" in panel.locator(f'.kvp-lessons-verdict [data-request="{b["rid"]}"]').inner_text()
    panel.scroll_into_view_if_needed()
    screenshot(page, "prefix-depth-page-1280x800")
    screenshot(panel, "prefix-depth-salts-1280")
    assert_clean(page)


def test_panel_fits_768_and_dark(new_page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    page, panel = open_chapter(new_page, live_server, viewport={"width": 768, "height": 900}, color_scheme="dark")
    press(panel, "less than a block", 2)
    fits = panel.evaluate("el => el.scrollWidth <= el.clientWidth + 1 && el.getBoundingClientRect().right <= innerWidth")
    assert fits, "the panel overflows a 768 px page"
    assert page.evaluate(UNNAMED_CONTROLS) == []                 # every button and the number box are named
    assert panel.get_by_label("or share").count() == 1
    panel.scroll_into_view_if_needed()
    screenshot(panel, "prefix-depth-768-dark")
    assert_clean(page)


def test_recording_replays_the_same_lessons(new_page, static_site, screenshot):
    """With no engine, the chapter's recording plays the same runs: every row's cached count
    is the recorded engine's, and the three traps are there."""
    page = new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{static_site}{CHAPTER}/")
    page.wait_for_function("() => kvscope.client.mode === 'replay' && kvscope.client.replay.state.loaded", timeout=15000)
    page.evaluate("() => kvscope.client.replay.setSpeed(16)")
    name = page.evaluate("() => document.body.dataset.recording")
    with urllib.request.urlopen(f"{static_site}/static/recordings/{name}.jsonl", timeout=10) as r:
        events = [json.loads(line) for line in r.read().decode().splitlines()[1:] if line.strip()]
    finished = {e["request_id"]: e["num_cached_tokens"] for e in events if e["type"] == "request.finished"}
    bs = next(e for e in events if e["type"] == "hello")["engine"]["block_size"]
    panel = page.locator(PANEL)
    page.wait_for_function("([el, n]) => el.querySelectorAll('tbody tr').length >= n",
                           arg=[panel.element_handle(), len(finished)], timeout=60000)
    rows = rows_of(panel)
    assert {r["rid"]: r["cached"] for r in rows} == finished                    # the engine's counts, as recorded
    assert all(r["shown"] == str(r["cached"]) for r in rows)
    assert any(0 < r["common"] < bs and r["cached"] == 0 for r in rows)         # the 0 % hit
    assert any(r["common"] > bs and r["cached"] == r["common"] // bs * bs > 0 for r in rows)   # its fix
    salted = [r for r in rows if r["common"] == int(r["prompt"])]               # the same prompt again
    assert [r["cached"] > 0 for r in salted] == [False, True]                   # tenant B, then A again
    assert panel.locator("button", has_text="less than a block").is_disabled()
    check_share_buttons(panel, bs)
    panel.scroll_into_view_if_needed()
    screenshot(panel, "prefix-depth-replay-1280")


def test_eviction_order_in_the_sandbox(new_page, live_server, screenshot, assert_clean):
    """Under pressure the block manager evicts the least recently freed cached blocks first,
    so the unique tails go before the shared prefix: the panel's account of each step
    agrees with the sandbox state the server returned."""
    page, _ = open_chapter(new_page, live_server, viewport={"width": 1280, "height": 800})
    panel = page.locator('section[aria-label="Eviction order under pressure"]')
    widget = page.locator("kv-pages").first
    button = panel.locator("button")
    states = []
    for n in range(1, 8):
        expect_label = button.get_attribute("aria-label")
        assert expect_label.startswith(f"Eviction step {n} of 7")
        button.focus()
        button.press("Enter")
        page.wait_for_function("([el, n]) => el.querySelectorAll('li').length >= n", arg=[panel.element_handle(), n])
        states.append(widget.evaluate("el => el.exportData().sandbox"))
    table = lambda st, name: next(s["block_table"] for s in st["seqs"] if s["name"] == name)   # noqa: E731
    a, b = table(states[2], "A"), table(states[2], "B")
    prefix, a_tail, b_tail = a[:2], a[2], b[2]
    assert b[:2] == prefix and a_tail != b_tail
    after_c = states[5]
    c = table(after_c, "C")
    assert c[-2:] == [a_tail, b_tail]                                     # the tails, A's (freed first) first
    assert sorted(x["id"] for x in after_c["blocks"] if x["ref"] == 0 and x["hash"]) == sorted(prefix)
    log = panel.locator("li")
    assert f"the cached {a_tail} (A’s own block), {b_tail} (B’s own block)" in log.nth(5).inner_text()
    assert "shared prefix outlived the tails" in log.nth(5).inner_text()
    d = table(states[6], "D")
    assert d == prefix[::-1]                                              # B freed its prefix last block first
    assert "Nothing is cached any more" in log.nth(6).inner_text()
    assert button.inner_text() == "Start again"
    panel.scroll_into_view_if_needed()
    screenshot(panel, "prefix-depth-eviction-1280")
    assert_clean(page)


def test_recording_replays_the_eviction_steps(new_page, static_site, screenshot):
    """Replaying, the eviction steps are the recording's own sandbox replies, and the panel
    tells the same story: the tails evicted first, the shared prefix last."""
    page = new_page(viewport={"width": 1280, "height": 800})
    page.goto(f"{static_site}{CHAPTER}/")
    page.wait_for_function("() => kvscope.client.mode === 'replay' && kvscope.client.replay.state.loaded", timeout=15000)
    panel = page.locator('section[aria-label="Eviction order under pressure"]')
    button = panel.locator("button")
    for n in range(1, 8):
        button.focus()
        button.press("Enter")
        page.wait_for_function("([el, n]) => el.querySelectorAll('li').length >= n", arg=[panel.element_handle(), n])
    log = [panel.locator("li").nth(i).inner_text() for i in range(7)]
    assert "A’s own block" in log[5] and "B’s own block" in log[5] and "shared prefix outlived the tails" in log[5]
    assert "Nothing is cached any more" in log[6]
    shown = page.locator("kv-pages").first.evaluate("el => el.exportData().sandbox")
    assert [s["name"] for s in shown["seqs"]] == ["C", "D"] and shown["num_cached"] == 0   # the grid shows the last reply
    panel.scroll_into_view_if_needed()
    screenshot(panel, "prefix-depth-eviction-replay-1280")
