"""What a learner sees on arrival and over time (issue 25, part B): a widget whose live
feature the server lacks plays its recording at once and says why; chapter 10's sliders
visibly reshape the default prompt's distribution; the internals widgets draw a recorded
example before the first Run; chapter 8's RMSNorm panel follows the chosen token; replays
keep token text and stop at the end instead of wiping; the exported book does not claim
a model is running."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

RAW_ID = re.compile(r"#\d+")


def open_chapter(page, base: str, chapter: str, tag: str, mode: str):
    page.goto(f"{base}/chapters/{chapter}/")
    page.wait_for_selector(f"{tag}[data-painted]", state="attached")
    page.wait_for_function(f"() => window.kvscope && window.kvscope.client.mode === '{mode}'", timeout=20000)
    widget = page.locator(tag).first
    widget.scroll_into_view_if_needed()
    return widget


# -- the fallback line -----------------------------------------------------------------------
def check_speculation_fallback(page, live_server):
    widget = open_chapter(page, live_server, "18-speculative-decoding", "kv-speculation", "live")
    line = widget.locator(".kv-widget__fallback")
    line.wait_for(state="visible", timeout=3000)   # at once, not after a wait for a verify pass
    text = line.inner_text()
    assert "does not speculate" in text and "--speculative-config" in text and "Playing the recording" in text
    assert widget.get_attribute("data-fallback") == "speculation"
    assert widget.get_attribute("data-mode") == "replay"
    assert page.evaluate("() => kvscope.client.mode") == "live"     # the rest of the page stays live
    page.wait_for_function("el => el.exportData().num_passes >= 2", arg=widget.element_handle(), timeout=20000)
    expect(widget).not_to_contain_text("Waiting for the first verify pass")   # drawn on the next frame
    return widget


def test_speculation_plays_its_recording_on_a_default_server(page, live_server, screenshot, assert_clean):
    widget = check_speculation_fallback(page, live_server)
    first = widget.evaluate("el => el.exportData().num_passes")
    page.wait_for_function("([el, n]) => el.exportData().num_passes > n", arg=[widget.element_handle(), first], timeout=20000)
    screenshot(widget, "learner-ch18-fallback-1280")
    # the widget's own replay stops at its end and keeps every pass; the learner replays it
    page.wait_for_function("el => el.dataset.replayEnded === 'true'", arg=widget.element_handle(), timeout=30000)
    passes = widget.evaluate("el => el.exportData().num_passes")
    page.wait_for_timeout(3500)
    assert widget.evaluate("el => el.exportData().num_passes") == passes >= 1
    again = widget.locator(".kv-widget__fallback").get_by_role("button", name="Replay from the start")
    again.click()
    page.wait_for_function("el => el.dataset.replayEnded === 'false' && Number(el.dataset.replayStep) < 10",
                           arg=widget.element_handle())
    assert_clean(page)


def test_speculation_fallback_dark_768(new_page, live_server, screenshot):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = check_speculation_fallback(page, live_server)
    assert widget.bounding_box()["width"] <= 768
    screenshot(widget, "learner-ch18-fallback-dark-768")


# -- chapter 10: the sliders reshape what is drawn ---------------------------------------------
def shaped_bars(widget) -> list[float]:
    """The blue bars of the ten most likely tokens (the last bar, "all other tokens", left out)."""
    return widget.evaluate("el => [...el.querySelectorAll('rect[data-shaped]')].map(r => Number(r.dataset.shaped))")[:-1]


def set_slider(widget, key: str, value: float) -> None:
    widget.locator(f"input[data-param={key}]").evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', { bubbles: true })); }", value)


def draws(page, widget, n: int = 12) -> list[str]:
    for _ in range(n):
        widget.get_by_role("button", name="Draw", exact=True).click()
    page.wait_for_function("([el, n]) => el.exportData().drawn.length === n", arg=[widget.element_handle(), n])
    return widget.evaluate("el => el.exportData().drawn")


def check_sliders(page, widget):
    page.wait_for_function("el => el.querySelectorAll('rect[data-shaped]').length >= 11", arg=widget.element_handle(), timeout=30000)
    base = shaped_bars(widget)
    assert base[0] < 0.5, f"the default prompt's first next token is {base[0]:.0%} likely: no spread to reshape"
    kept = int(widget.get_attribute("data-kept"))
    set_slider(widget, "temperature", 0.3)
    page.wait_for_timeout(100)
    cold = shaped_bars(widget)
    # the ten bars drawn gain probability as the temperature falls, and lose it as it rises
    assert sum(cold) > sum(base) + 0.1 and cold[0] > base[0], (base[:3], cold[:3])
    set_slider(widget, "temperature", 1.8)
    page.wait_for_timeout(100)
    hot = shaped_bars(widget)
    assert sum(hot) < sum(base) - 0.1 and hot[0] < base[0], (base[:3], hot[:3])
    hot_draws = draws(page, widget)
    set_slider(widget, "temperature", 0.05)
    page.wait_for_timeout(100)
    cold_draws = draws(page, widget)
    assert len(set(hot_draws)) > len(set(cold_draws)), (hot_draws, cold_draws)
    assert not [t for t in hot_draws if RAW_ID.search(t)], hot_draws     # every draw has its text
    set_slider(widget, "temperature", 1)
    set_slider(widget, "top_p", 0.5)
    page.wait_for_timeout(100)
    assert int(widget.get_attribute("data-kept")) < min(kept, 20)
    assert sum(1 for p in shaped_bars(widget) if p > 0) < sum(1 for p in base if p > 0)
    # chapter 10's text: the first token under 10 %, token 3 near 100 %
    set_slider(widget, "top_p", 1)
    assert base[0] < 0.1
    widget.get_by_label("Next token after").select_option("2")
    page.wait_for_timeout(100)
    assert shaped_bars(widget)[0] > 0.9


def test_sampling_sliders_reshape_the_default_prompt_live(page, live_server, screenshot, assert_clean):
    widget = open_chapter(page, live_server, "10-sampling", "kv-sampling", "live")
    page.wait_for_function("el => !el.querySelector('.kvw-btn--primary').disabled", arg=widget.element_handle())
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.finished === 'true' && !el.dataset.example", arg=widget.element_handle(), timeout=30000)
    check_sliders(page, widget)
    screenshot(widget, "learner-ch10-sliders-live-1280")
    assert_clean(page)


def test_sampling_sliders_reshape_the_recording(new_page, static_site, screenshot):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = open_chapter(page, static_site, "10-sampling", "kv-sampling", "replay")
    check_sliders(page, widget)
    screenshot(widget, "learner-ch10-sliders-replay-dark-768")


# -- internals widgets: an example on arrival; chapter 8's panel follows the choice ------------
INTERNALS = [("03-embeddings", "kv-embeddings"), ("06-positional-encoding", "kv-rope"), ("07-mlp", "kv-mlp"),
             ("08-transformer-block", "kv-residual"), ("09-full-model", "kv-logit-lens")]


@pytest.mark.parametrize("chapter,tag", INTERNALS, ids=[t for _, t in INTERNALS])
def test_internals_widgets_draw_an_example_on_arrival(page, live_server, screenshot, chapter, tag):
    widget = open_chapter(page, live_server, chapter, tag, "live")
    page.wait_for_function("el => el.dataset.example === 'true'", arg=widget.element_handle(), timeout=5000)
    page.wait_for_function("el => el.querySelector('.kv-widget__body svg, .kv-widget__body canvas')",
                           arg=widget.element_handle(), timeout=5000)
    note = widget.locator(".kvw-example")
    assert note.is_visible() and "press Run" in note.inner_text()
    assert "Press Run" not in widget.locator(".kv-widget__body").inner_text()
    screenshot(widget, f"learner-{tag}-on-arrival-1280")


def test_rmsnorm_example_dark_768(new_page, live_server, screenshot):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = open_chapter(page, live_server, "08-transformer-block", "kv-residual", "live")
    page.wait_for_function("el => el.dataset.example === 'true'", arg=widget.element_handle(), timeout=5000)
    check_rmsnorm_follows(page, widget)
    assert widget.bounding_box()["width"] <= 768
    screenshot(widget, "learner-ch8-example-dark-768")


def check_rmsnorm_follows(page, widget):
    select = widget.get_by_label("Token", exact=True)
    options = select.evaluate("el => [...el.options].map(o => [o.value, o.textContent])")
    assert len(options) >= 5
    for value, text in options:
        select.select_option(value)
        page.wait_for_function("([el, v]) => el.dataset.normPosition === v", arg=[widget.element_handle(), value])
        token = text.split(": ", 1)[1]
        heading = widget.locator(".kvw-panel h4").inner_text()
        assert f"“{token}” entering layer 0" in heading, (text, heading)
        rms = widget.evaluate("el => el.exportData().rmsnorm")
        assert rms["position"] == int(value) and len(rms["output"]) == len(rms["input"])


def test_rmsnorm_panel_follows_the_chosen_token(page, live_server, screenshot, assert_clean):
    widget = open_chapter(page, live_server, "08-transformer-block", "kv-residual", "live")
    page.wait_for_function("el => el.dataset.example === 'true'", arg=widget.element_handle(), timeout=5000)
    check_rmsnorm_follows(page, widget)                          # the example
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.finished === 'true' && !el.dataset.example", arg=widget.element_handle(), timeout=30000)
    check_rmsnorm_follows(page, widget)                          # the learner's own run
    select = widget.get_by_label("Token", exact=True)
    cat = next(v for v, t in select.evaluate("el => [...el.options].map(o => [o.value, o.textContent])") if "cat" in t)
    select.select_option(cat)
    # the panel redraws after the choice: wait for it rather than read it in the same instant
    page.wait_for_function("el => [...el.querySelectorAll('.kvw-panel h4')].some(h => h.textContent.includes('cat'))",
                           arg=widget.element_handle(), timeout=10000)
    assert "cat" in widget.locator(".kvw-panel h4").first.inner_text()
    screenshot(widget, "learner-ch8-rmsnorm-cat-1280")
    assert_clean(page)


# -- replays: token text, and the end keeps what was drawn --------------------------------------
def svg_texts(widget) -> list[str]:
    return widget.evaluate("el => [...el.querySelectorAll('svg text')].map(t => t.textContent)")


def test_replays_label_tokens_with_text(new_page, static_site, screenshot):
    page = new_page()
    widget = open_chapter(page, static_site, "12-the-kv-cache", "kv-cache-view", "replay")
    page.evaluate("() => kvscope.client.replay.setSpeed(4)")
    page.wait_for_function("el => Number(el.dataset.tokensInCache || 0) >= 10", arg=widget.element_handle(), timeout=20000)
    page.wait_for_timeout(300)
    labels = svg_texts(widget)
    assert len([t for t in labels if t.strip()]) >= 10
    assert not [t for t in labels if RAW_ID.search(t)], labels
    screenshot(widget, "learner-ch12-replay-labels-1280")
    page = new_page()
    widget = open_chapter(page, static_site, "04-attention", "kv-attention", "replay")
    page.wait_for_function("el => el.querySelectorAll('svg text').length >= 10", arg=widget.element_handle(), timeout=20000)
    page.wait_for_timeout(500)
    labels = svg_texts(widget)
    assert not [t for t in labels if RAW_ID.search(t)], labels
    screenshot(widget, "learner-ch4-replay-labels-1280")


def test_a_replay_stops_at_the_end_and_keeps_what_it_drew(new_page, static_site, screenshot):
    page = new_page()
    widget = open_chapter(page, static_site, "15-paged-attention", "kv-pages", "replay")
    page.evaluate("() => kvscope.client.replay.setSpeed(4)")   # 16 steps a second
    page.wait_for_function("() => { const s = kvscope.client.replay.state; return s.loaded && !s.playing && s.stepIndex === s.stepCount; }",
                           timeout=30000)
    steps = page.evaluate("() => kvscope.client.replay.state.stepCount")
    assert steps >= 30
    drawn = widget.locator(".kv-widget__body").inner_html()
    page.wait_for_timeout(4000)     # longer than the old loop's pause: nothing restarts or wipes
    assert widget.locator(".kv-widget__body").inner_html() == drawn
    assert page.evaluate("() => kvscope.client.replay.state.stepIndex") == steps
    text = widget.inner_text()
    for button in widget.locator("button[disabled]").all():
        assert f"Press “{button.inner_text()}”" not in text and f"Press '{button.inner_text()}'" not in text
    play = page.get_by_role("button", name="Replay the recording from the start")
    assert play.is_visible()
    screenshot(page, "learner-ch15-replay-ended-1280")
    play.click()
    page.wait_for_function("() => kvscope.client.replay.state.playing && kvscope.client.replay.state.stepIndex < 10")


def test_the_exported_index_claims_no_running_model(new_page, static_site, screenshot):
    page = new_page()
    page.goto(f"{static_site}/")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'replay'")
    intro = page.locator(".kv-intro").inner_text()
    assert "running on" not in intro and "no engine behind it" in intro
    screenshot(page, "learner-export-index-1280")
