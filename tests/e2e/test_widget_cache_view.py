"""<kv-cache-view> against the real engine: the learner's own held request, stepped with
`next`, fills the cache by the whole prompt on the first step and by exactly one token on
every step after, with bytes = kv_bytes_per_token (hello) × tokens."""
from __future__ import annotations

from widget_checks import check_exports


def test_cache_grows_one_token_per_step(page, live_server, screenshot, assert_clean):
    page.goto(live_server + "/chapters/12-the-kv-cache")
    page.wait_for_selector("kv-cache-view[data-painted]", state="attached")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator("kv-cache-view").first
    widget.scroll_into_view_if_needed()
    hello = page.evaluate("() => window.kvscope.client.hello")
    per_token = hello["model"]["kv_bytes_per_token"]
    layers = hello["model"]["num_layers"]

    widget.get_by_label("Prompt").fill("Once upon a time, a little fox")
    widget.get_by_role("button", name="Start").click()
    page.wait_for_selector("kv-cache-view[data-state=held]")
    data = widget.evaluate("el => el.exportData()")
    assert data["tokens_in_cache"] == 0 and data["num_prompt_tokens"] > 0
    prompt = data["num_prompt_tokens"]

    counts = []
    next_button = widget.get_by_role("button", name="Next token")
    for step in range(6):
        before = len(widget.evaluate("el => el.exportData().history"))
        if step == 3:
            next_button.focus()
            page.keyboard.press("n")          # the keyboard shortcut does the same
        else:
            next_button.click()
        # the token has arrived and the (deferred) render has drawn it
        page.wait_for_function("([el, n]) => el.exportData().history.length > n && el.dataset.state !== 'waiting'"
                               " && el.querySelector('[data-figure=tokens_in_cache]').textContent"
                               " === String(el.exportData().tokens_in_cache)",
                               arg=[widget.element_handle(), before])
        data = widget.evaluate("el => el.exportData()")
        counts.append(data["tokens_in_cache"])
        assert data["bytes_used"] == data["tokens_in_cache"] * per_token
        assert data["kv_bytes_per_token"] == per_token
        # The grid: every layer's K and V rows hold exactly that many positions.
        filled = widget.locator(".kvc-grid rect[data-filled]")
        assert filled.count() == 2 * layers
        assert set(filled.evaluate_all("els => els.map(e => +e.dataset.filled)")) == {data["tokens_in_cache"]}
        assert widget.locator("[data-figure=tokens_in_cache]").inner_text() == str(data["tokens_in_cache"])
    assert counts[0] == prompt                                   # prefill: the whole prompt at once
    assert [b - a for a, b in zip(counts, counts[1:])] == [1] * 5   # then exactly one per step
    screenshot(widget, "widget-cache-view")
    check_exports(widget, "image/svg+xml")
    widget.get_by_role("button", name="Stop").click()
    page.wait_for_selector("kv-cache-view[data-state=finished]")
    assert_clean(page)
