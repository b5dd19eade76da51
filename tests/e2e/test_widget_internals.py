"""The inside-the-model widgets against the real engine: each runs a learner's prompt as a
watched request and draws the live model's tensors, also when the prompt is already in
the prefix cache (the second run), in light mode, and in dark mode at 768 px."""
from __future__ import annotations

import pytest

from widget_checks import check_exports


def open_widget(page, live_server, chapter: str, tag: str):
    page.goto(f"{live_server}/chapters/{chapter}")
    page.wait_for_selector(f"{tag}[data-painted]", state="attached")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    widget = page.locator(tag).first
    widget.scroll_into_view_if_needed()
    return widget


def run_prompt(page, widget, prompt: str) -> dict:
    widget.get_by_label("Prompt", exact=True).fill(prompt)
    page.wait_for_function("el => !el.querySelector('.kvw-btn--primary').disabled", arg=widget.element_handle())
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.finished === 'true'", arg=widget.element_handle(), timeout=30000)
    page.wait_for_timeout(100)
    return widget.evaluate("el => el.exportData()")


@pytest.fixture
def dark_page(new_page):
    return new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")


def test_logit_lens_last_layer_is_the_engine_output(page, new_page, live_server, screenshot, assert_clean):
    widget = open_widget(page, live_server, "09-full-model", "kv-logit-lens")
    prompt = "The little cat sat on the"
    for _ in range(2):    # the second run's prompt comes from the prefix cache
        data = run_prompt(page, widget, prompt)
        positions = data["positions"]
        assert [p["position"] for p in positions] == list(range(len(positions)))
        assert len(positions) >= 7
        for p in positions:
            assert len(p["layers"]) == 4 and all(len(top) == 5 for top in p["layers"])
            for top in p["layers"]:
                probs = [t["prob"] for t in top]
                assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
    assert widget.locator("rect[data-layer]").count() == 4 * len(positions)
    widget.locator(".kvl-grid").focus()
    page.keyboard.press("Home")
    page.wait_for_function("el => el.exportData().position === 0", arg=widget.element_handle())
    screenshot(widget, "widget-logit-lens")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
