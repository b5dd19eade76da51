"""<kv-speculation> against a real engine started with prompt-lookup drafting, and replaying
the committed recording: every verify pass the engine reports (`spec` events) is drawn, with
the accepted and rejected drafts and the running acceptance the engine computed."""
from __future__ import annotations

import json

from widget_checks import check_exports, open_live_widget

SPEC_ARGS = ("--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 3}))


def run_story(page, url):
    widget = open_live_widget(page, url, "/chapters/18-speculative-decoding", "kv-speculation")
    widget.get_by_label("Prompt", exact=True).select_option("repetitive")
    widget.get_by_role("button", name="Generate").click()
    page.wait_for_function("el => el.dataset.requestId && el.exportData().num_passes >= 3 && el.exportData().proposed > 0",
                           arg=widget.element_handle(), timeout=30000)
    page.wait_for_timeout(1500)   # the rest of the request
    return widget


def test_live_passes_show_what_the_engine_accepted(page, own_server, tmp_path, screenshot, assert_clean):
    url, _stop = own_server(tmp_path, extra_args=SPEC_ARGS)
    widget = run_story(page, url)
    data = widget.evaluate("el => el.exportData()")
    passes = data["passes"]
    assert data["method"] == "ngram"
    assert data["accepted"] == sum(p["accepted"] for p in passes) and data["accepted"] > 0
    assert data["proposed"] == sum(len(p["proposed"]) for p in passes)
    for p in passes:
        assert p["token_ids"][:p["accepted"]] == p["proposed"][:p["accepted"]]   # accepted drafts are the output
        assert len(p["token_ids"]) == p["accepted"] + 1
    # the chart: one square per draft, crossed when rejected
    assert widget.locator(".kvs-chart rect.kvs-accepted").count() == data["accepted"]
    assert widget.locator(".kvs-chart rect.kvs-rejected").count() == data["proposed"] - data["accepted"]
    assert widget.locator("[data-figure=acceptance_rate]").inner_text() == f"{round(100 * data['acceptance_rate'])} %"
    screenshot(widget, "widget-speculation-live")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_live_dark_narrow(new_page, own_server, tmp_path, screenshot):
    url, _stop = own_server(tmp_path, extra_args=SPEC_ARGS)
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark", reduced_motion="reduce")
    widget = run_story(page, url)
    box = widget.bounding_box()
    assert box["width"] <= 768
    screenshot(widget, "widget-speculation-dark-768")


def test_replay_follows_the_recording(new_page, static_site, screenshot):
    page = new_page()
    page.goto(f"{static_site}/chapters/18-speculative-decoding/")
    page.wait_for_selector("kv-speculation[data-painted]", state="attached")
    page.wait_for_function("() => kvscope.client.mode === 'replay' && kvscope.client.replay.state.loaded", timeout=15000)
    widget = page.locator("kv-speculation").first
    widget.scroll_into_view_if_needed()
    page.wait_for_function("el => el.exportData().num_passes >= 3", arg=widget.element_handle(), timeout=30000)
    data = widget.evaluate("el => el.exportData()")
    name = page.evaluate("() => document.body.dataset.recording")
    assert name == "speculation"
    # the request drawn is the one the controls name
    assert widget.get_by_label("Prompt", exact=True).input_value() == "repetitive"
    assert widget.locator("[data-shown]").get_attribute("data-shown") == "repetitive greedy"
    screenshot(widget, "widget-speculation-replay")


def test_on_a_default_server_the_replayed_frame_matches_the_controls(page, live_server, screenshot, assert_clean):
    """A server without speculation: the widget plays the recording (a story told twice, greedy,
    then a fresh sentence, sampled) and, when it ends, still draws the request its controls name;
    choosing the other prompt draws the other recorded request, with its own decoding."""
    page.goto(live_server + "/chapters/18-speculative-decoding")
    widget = page.locator("kv-speculation").first
    page.wait_for_function("el => el.dataset.fallback === 'speculation' && el.dataset.replayEnded === 'true'",
                           arg=widget.element_handle(), timeout=60000)
    widget.scroll_into_view_if_needed()
    preset, sampling = widget.get_by_label("Prompt", exact=True), widget.get_by_label("Decoding", exact=True)
    prompt_box = widget.get_by_label("Prompt text")

    def drawn() -> dict:
        return widget.evaluate("el => el.exportData()")

    assert preset.input_value() == "repetitive" and sampling.input_value() == "greedy"
    assert prompt_box.input_value().startswith("Once upon a time") and prompt_box.input_value().count("Once upon a time") == 2
    story = drawn()
    assert story["num_passes"] >= 3 and story["acceptance_rate"] > 0.3   # a retold story: most drafts kept
    assert widget.locator("[data-shown]").get_attribute("data-shown") == "repetitive greedy"
    assert "a story told twice" in widget.locator("[data-shown]").inner_text()
    screenshot(widget, "speculation-fallback-repetitive")
    preset.select_option("free-form")
    assert prompt_box.input_value() == "The old lighthouse keeper looked at the sea and"
    assert sampling.input_value() == "sampled" and sampling.is_disabled()
    fresh = drawn()
    assert fresh["request_id"] != story["request_id"] and fresh["num_passes"] >= 1
    assert fresh["acceptance_rate"] < story["acceptance_rate"]
    assert widget.locator("[data-shown]").get_attribute("data-shown") == "free-form sampled"
    assert widget.locator("[data-figure=acceptance_rate]").inner_text() == f"{round(100 * fresh['acceptance_rate'])} %"
    screenshot(widget, "speculation-fallback-free-form")
    preset.select_option("repetitive")
    assert drawn()["request_id"] == story["request_id"] and sampling.input_value() == "greedy"
    assert_clean(page)
