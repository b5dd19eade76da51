"""Accessibility checks over every page that carries widgets, in Chromium against the real
server: each control has an accessible name, each widget is a labelled region, focus is
visible, and with reduced motion asked for nothing animates."""
from __future__ import annotations

import pytest

PAGES = ["/chapters/02-tokens", "/chapters/03-embeddings", "/chapters/04-attention",
         "/chapters/05-multi-head-attention", "/chapters/06-positional-encoding", "/chapters/07-mlp",
         "/chapters/08-transformer-block", "/chapters/09-full-model", "/chapters/10-sampling", "/chapters/12-the-kv-cache",
         "/chapters/13-gpu-memory-hierarchy", "/chapters/14-continuous-batching", "/chapters/15-paged-attention",
         "/", "/glossary"]

UNNAMED_CONTROLS = """() => {
  const controls = [...document.querySelectorAll(
      'button, input:not([type=hidden]), select, textarea, [role=button], [role=slider], [tabindex="0"]')];
  const named = (el) => {
    if (el.getAttribute('aria-label')?.trim()) return true;
    const by = el.getAttribute('aria-labelledby');
    if (by && by.split(/\\s+/).some((id) => document.getElementById(id)?.textContent.trim())) return true;
    if (el.labels && [...el.labels].some((l) => l.textContent.trim())) return true;
    if (el.getAttribute('title')?.trim()) return true;
    const formField = ['INPUT', 'SELECT', 'TEXTAREA'].includes(el.tagName);
    return !formField && el.textContent.trim().length > 0;   // a button's or a term's own text
  };
  const visible = (el) => el.getClientRects().length > 0;
  return controls.filter((el) => visible(el) && !named(el))
    .map((el) => el.outerHTML.slice(0, 120));
}"""


@pytest.mark.parametrize("path", PAGES)
def test_every_control_has_an_accessible_name(page, live_server, wait_for_widgets, path):
    page.goto(live_server + path)
    page.wait_for_function("() => window.kvscope && kvscope.client.hello")
    if path.startswith("/chapters"):
        wait_for_widgets(page)
    assert page.evaluate(UNNAMED_CONTROLS) == []
    for widget in page.locator("kv-tokenizer, kv-attention, kv-cache-view, kv-pages, kv-memory, kv-embeddings, kv-heads, "
                                 "kv-rope, kv-mlp, kv-residual, kv-logit-lens, kv-sampling, kv-quant-cache, kv-step-plan").all():
        labelled = widget.evaluate("""el => !!(el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')
            || el.querySelector('[role=region][aria-label], [role=region][aria-labelledby], figure, section[aria-label]'))""")
        assert labelled, widget.evaluate("el => el.localName")


def test_focus_is_visible_on_widget_controls(page, live_server, wait_for_widgets):
    page.goto(live_server + "/chapters/15-paged-attention")
    wait_for_widgets(page)
    button = page.locator("kv-pages button").first
    button.focus()
    page.keyboard.press("Shift+Tab")
    page.keyboard.press("Tab")                     # keyboard focus, so :focus-visible applies
    style = page.evaluate("""() => { const s = getComputedStyle(document.activeElement);
        return {style: s.outlineStyle, width: parseFloat(s.outlineWidth), shadow: s.boxShadow}; }""")
    assert (style["style"] != "none" and style["width"] >= 2) or style["shadow"] not in ("none", ""), style


def test_reduced_motion_means_nothing_animates(new_page, live_server, wait_for_widgets):
    page = new_page(reduced_motion="reduce")
    page.goto(live_server + "/chapters/12-the-kv-cache")
    wait_for_widgets(page)
    page.locator("kv-cache-view button").first.click()
    page.wait_for_timeout(300)
    moving = page.evaluate("""() => [...document.querySelectorAll('*')].filter((el) => {
        const s = getComputedStyle(el);
        const longest = (v) => Math.max(...v.split(',').map((x) => parseFloat(x) || 0));
        return longest(s.transitionDuration) > 0.01 || (s.animationName !== 'none' && longest(s.animationDuration) > 0.01);
      }).map((el) => el.localName + '.' + el.className)""")
    assert moving == []
    assert page.evaluate("() => document.getAnimations().filter((a) => a.playState === 'running').length") == 0
