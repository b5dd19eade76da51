"""<kv-hash-chain> (chapter 16): a prompt's blocks as a chain of hashes. With blocks of 16, a
prompt of 31 or 32 tokens can share one block with a later identical prompt and one of 33
can share two (only full blocks are hashed; at least one token is computed). The widget says
so, and the engine agrees: live, the learner's button sends the prompt twice and the second
request's cached tokens are shown; from the recording, with no server, the same three
lengths were sent, and a second salt hashes every block differently."""
from __future__ import annotations

import json
import time
from pathlib import Path

from widget_checks import check_exports, check_fits, open_live_widget, recorded_views, wait_idle

REPO = Path(__file__).resolve().parents[2]
SHOWN = """el => ({length: Number(el.dataset.length), full: Number(el.dataset.full),
  shareable: Number(el.dataset.shareable), engine: el.dataset.engineShared === undefined ? null : Number(el.dataset.engineShared),
  states: [...el.querySelectorAll('[data-block]')].map(b => b.dataset.state),
  hashes: [...el.querySelectorAll('[data-block]')].map(b => b.dataset.hash),
  verdict: el.querySelector('[data-verdict]').textContent})"""


def pick(widget, page, n: int) -> dict:
    widget.locator(f"button[data-length='{n}']").click()
    page.wait_for_function("([el, n]) => Number(el.dataset.length) === n", arg=[widget.element_handle(), n])
    return widget.evaluate(SHOWN)


def check_rule(shown: dict, n: int, block_size: int = 16) -> None:
    assert shown["full"] == n // block_size and shown["shareable"] == (n - 1) // block_size
    assert shown["states"].count("shared") == shown["shareable"]
    assert ("partial" in shown["states"]) == (n % block_size != 0)
    assert ("recomputed" in shown["states"]) == (n % block_size == 0)


def recorded_cached() -> dict:
    """Tokens the recording's second request of each prompt length found cached."""
    lines = (REPO / "frontend" / "recordings" / "hash-chain.jsonl").read_text().splitlines()[1:]
    finished = [e for e in map(json.loads, lines) if e["type"] == "request.finished"]
    return {e["num_prompt_tokens"]: e["num_cached_tokens"] for e in finished[:6][1::2]}


def test_the_recording_shows_where_sharing_stops(new_page, static_site, screenshot):
    cached = recorded_cached()
    assert cached == {31: 16, 32: 16, 33: 32}     # the engine's own answer, in the committed file
    for page, widget, view in recorded_views(new_page, static_site, "/chapters/16-prefix-caching/", "kv-hash-chain",
                                             "el => Number(el.dataset.recordedRuns) === 8"):
        counts = {}
        for n in (31, 32, 33):
            shown = pick(widget, page, n)
            check_rule(shown, n)
            assert shown["engine"] == cached[n] // 16 == shown["shareable"]     # the engine agrees with the rule
            assert f"found {cached[n]} tokens in the cache" in shown["verdict"]
            assert all(shown["hashes"][i] for i in range(shown["full"]))         # every full block has the engine's hash
            counts[n] = shown["shareable"]
        assert counts[31] == counts[32] < counts[33]
        screenshot(widget, f"hash-chain-recorded-{view}")
        # another salt: the same tokens, other hashes all along the chain
        salt_a = widget.evaluate(SHOWN)["hashes"]
        widget.locator("input[type=text]").fill("tenant-B")
        page.wait_for_function("el => el.querySelector('[data-block]').dataset.hash", arg=widget.element_handle())
        salt_b = widget.evaluate(SHOWN)
        assert salt_b["engine"] == 2 and all(a != b for a, b in zip(salt_a[:2], salt_b["hashes"][:2]))
        check_fits(page, widget)
        # the slider answers the keyboard
        widget.locator("input[type=range]").focus()
        page.keyboard.press("ArrowLeft")
        page.wait_for_function("el => Number(el.dataset.length) === 32", arg=widget.element_handle())


def test_the_live_engine_shares_whole_blocks_only(page, live_server, screenshot, assert_clean):
    wait_idle(live_server)
    widget = open_live_widget(page, live_server, "/chapters/16-prefix-caching", "kv-hash-chain")
    handle = widget.element_handle()
    widget.locator("input[type=text]").fill(f"e2e-{time.time_ns()}")     # nothing cached under it yet
    engine = {}
    for n in (31, 32, 33):
        shown = pick(widget, page, n)
        check_rule(shown, n)
        assert shown["engine"] is None and "Not sent yet" in shown["verdict"]
        widget.get_by_role("button", name="Send it twice to the engine").click()
        page.wait_for_function("el => el.dataset.engineShared !== undefined || el.querySelector('.kvw-error').textContent",
                               arg=handle, timeout=120000)
        assert not widget.locator(".kvw-error").text_content()
        shown = widget.evaluate(SHOWN)
        engine[n] = shown["engine"]
        assert shown["engine"] == shown["shareable"], shown
        assert all(len(shown["hashes"][i]) == 6 for i in range(shown["full"]))
    assert engine == {31: 1, 32: 1, 33: 2}
    screenshot(widget, "hash-chain-live-1280")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
