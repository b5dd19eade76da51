"""<kv-quant-cache> in chapter 12 against the real server: a learner ticks 8-bit cache formats
and presses Measure; the widget shows the blocks gained at the engine's own KV memory (the
ratio recomputed here from the model's facts in `hello`), a logit error that is above zero
and small, and the same numbers the `kv_quant` command replies. Also by keyboard at 768 px
in dark mode, and from the chapter's recording with no backend."""
from __future__ import annotations

import pytest

from widget_checks import check_exports, open_live_widget

CHAPTER = "/chapters/12-the-kv-cache"
SCALE_BYTES = 4   # int8_per_token_head: one float32 scale per token and KV head (layers/attention.py)




def tick_only(widget, *formats: str) -> None:
    for name in ("fp8_e4m3", "fp8_e5m2", "int8_per_token_head"):
        box = widget.locator(f"input[type=checkbox][value={name}]")
        box.set_checked(name in formats)


def measured(widget, runs: int) -> dict:
    widget.page.wait_for_function("([el, n]) => Number(el.dataset.runs || 0) >= n",
                                  arg=[widget.element_handle(), runs], timeout=30000)
    return widget.evaluate("el => el.exportData()")


def expected_blocks(hello: dict, dtype: str) -> tuple[int, int]:
    """(blocks the engine's pool holds as it is, blocks the same bytes hold in `dtype`)."""
    model, engine = hello["model"], hello["engine"]
    budget = engine["num_blocks"] * engine["block_size"] * model["kv_bytes_per_token"]
    heads = model["num_layers"] * model["num_kv_heads"]
    per_token = 2 * heads * model["head_dim"] + (2 * heads * SCALE_BYTES if dtype == "int8_per_token_head" else 0)
    return engine["num_blocks"], budget // (per_token * engine["block_size"])


def two_decimals(page, x: float) -> str:
    return page.evaluate("x => new Intl.NumberFormat('en-US', {maximumFractionDigits: 2}).format(x)", x)


def cell(widget, dtype: str, field: str) -> str:
    return widget.locator(f"tr[data-dtype={dtype}] td[data-field={field}]").inner_text()


def test_blocks_gained_and_logit_error_live(page, live_server, screenshot, assert_clean):
    widget = open_live_widget(page, live_server, CHAPTER, "kv-quant-cache")
    hello = page.evaluate("() => window.kvscope.client.hello")
    assert hello["engine"].get("kv_cache_dtype", "auto") == "auto"   # the pool as the model stores it
    tick_only(widget, "fp8_e4m3", "int8_per_token_head")
    widget.get_by_role("button", name="Measure").click()
    data = measured(widget, 1)
    replies = {m["kv_cache_dtype"]: m for m in data["measurements"]}
    assert set(replies) == {"fp8_e4m3", "int8_per_token_head"}
    prompt = widget.get_by_label("Prompt to decode with each cache").input_value()
    for dtype, reply in replies.items():
        auto_blocks, blocks = expected_blocks(hello, dtype)
        ratio = blocks / auto_blocks
        # 8 bits instead of the model's dtype: 2x for a 16-bit model, 4x for the embedded fp32 one
        assert reply["auto"]["num_blocks"] == auto_blocks and reply["quantized"]["num_blocks"] == blocks
        assert reply["blocks_gained"] == pytest.approx(ratio)
        if dtype == "fp8_e4m3":
            assert ratio == pytest.approx(hello["model"]["dtype_bytes"])
        else:
            assert hello["model"]["dtype_bytes"] * 0.8 < ratio < hello["model"]["dtype_bytes"]
        # the cost: above zero, small, and none on the first token (the prompt's fresh keys)
        assert 0 < reply["max_abs_logit_error"] < 5 and reply["max_kl"] < 1
        assert reply["step_errors"][0] == 0 and reply["greedy_agree"] >= 1
        # what the learner reads is the reply
        assert cell(widget, dtype, "num_blocks") == f"{blocks:,}"
        gained = two_decimals(page, reply["blocks_gained"])
        assert cell(widget, dtype, "blocks_gained") == f"×{gained}"
        assert f"{dtype}: {gained}× the blocks ({blocks:,})" in widget.locator(".kv-widget__status").inner_text()
        assert cell(widget, dtype, "bytes_per_block") == f"{reply['quantized']['bytes_per_block']:,}"
        assert float(cell(widget, dtype, "max_abs_logit_error")) == pytest.approx(reply["max_abs_logit_error"], abs=5e-4)
        assert float(cell(widget, dtype, "mean_abs_logit_error")) == pytest.approx(reply["mean_abs_logit_error"], abs=5e-4)
        assert cell(widget, dtype, "greedy") == f"{reply['greedy_agree']}/{reply['greedy_total']}"
        # ... and the command, asked again by the test, says the same
        again = page.evaluate("([p, d]) => window.kvscope.client.command('kv_quant', {prompt: p, kv_cache_dtype: d, max_tokens: 16})",
                              [prompt, dtype])
        assert again["quantized"] == reply["quantized"] and again["token_ids"] == reply["token_ids"]
        assert again["max_abs_logit_error"] == pytest.approx(reply["max_abs_logit_error"], rel=1e-3)
        # the bar of blocks is `ratio` times the unquantized one
        widths = {d: float(widget.locator(f"rect[data-bar=blocks][data-dtype^='{d}']").get_attribute("width"))
                  for d in ("auto", dtype)}
        assert widths[dtype] / widths["auto"] == pytest.approx(ratio, rel=0.02)
    assert cell(widget, "auto", "num_blocks") == f"{hello['engine']['num_blocks']:,}"
    # the chapter's claim on the embedded model: a scale per token and head errs less than fp8's per-layer one
    assert replies["int8_per_token_head"]["max_abs_logit_error"] < replies["fp8_e4m3"]["max_abs_logit_error"]
    screenshot(widget, "widget-quant-cache-1280")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_by_keyboard_at_768_dark(new_page, live_server, screenshot, assert_clean):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = open_live_widget(page, live_server, CHAPTER, "kv-quant-cache")
    assert widget.bounding_box()["width"] <= 768
    tick_only(widget, "fp8_e5m2")
    page.locator("body").focus()
    for _ in range(300):   # Tab to Measure (the chapter's links come first)
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement && document.activeElement.textContent === 'Measure'"
                         " && document.activeElement.closest('kv-quant-cache') !== null"):
            break
    else:
        raise AssertionError("Measure cannot be reached with Tab")
    page.keyboard.press("Enter")
    data = measured(widget, 1)
    assert [m["kv_cache_dtype"] for m in data["measurements"]] == ["fp8_e5m2"]
    assert page.evaluate("() => document.activeElement.textContent") == "Measure"   # focus stays
    hello = page.evaluate("() => window.kvscope.client.hello")
    auto_blocks, blocks = expected_blocks(hello, "fp8_e5m2")
    assert cell(widget, "fp8_e5m2", "num_blocks") == f"{blocks:,}"
    assert data["measurements"][0]["max_abs_logit_error"] > 0
    screenshot(widget, "widget-quant-cache-768-dark")
    assert_clean(page)


def test_replays_the_recorded_measurements(new_page, static_site, screenshot):
    page = new_page()
    page.goto(f"{static_site}{CHAPTER}/")
    page.wait_for_selector("kv-quant-cache[data-painted]", state="attached")
    widget = page.locator("kv-quant-cache").first
    page.wait_for_function("el => el.dataset.shown === 'recorded'", arg=widget.element_handle(), timeout=15000)
    widget.scroll_into_view_if_needed()
    data = widget.evaluate("el => el.exportData()")
    assert [m["kv_cache_dtype"] for m in data["measurements"]] == ["fp8_e4m3", "fp8_e5m2", "int8_per_token_head"]
    for m in data["measurements"]:
        assert cell(widget, m["kv_cache_dtype"], "num_blocks") == f"{m['quantized']['num_blocks']:,}"
    assert widget.get_by_role("button", name="Measure").is_disabled()
    screenshot(widget, "widget-quant-cache-replay")
