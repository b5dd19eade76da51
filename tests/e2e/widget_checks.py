"""Checks shared by the widget tests: opening a live widget or a recorded one in both themes,
the toolbar exports, the layout at a width, starting a run while the page keeps its own copy
of the events, and waiting for an idle engine."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from test_accessibility import UNNAMED_CONTROLS

# the recorded views every widget is checked in: light at 1280 px, dark and reduced motion at 768 px
RECORDED_VIEWS = ((False, 1280), (True, 768))

EXPORT_JS = """async el => {
    const image = await el.exportImage();
    const data = el.exportDataBlob();
    const text = await image.blob.text();
    return {type: image.blob.type, size: image.blob.size, head: text.slice(0, 5),
            data_type: data.blob.type, widget: JSON.parse(await data.blob.text()).widget};
}"""


def model_config() -> dict:
    """The embedded model's config.json, which the live server runs."""
    from kvscope.default_model import default_model_path
    return json.loads((Path(default_model_path()) / "config.json").read_text())


def check_exports(widget, image_type: str) -> None:
    """The toolbar's exports of the current view: an image of the given type, and JSON."""
    out = widget.evaluate(EXPORT_JS)
    assert out["type"] == image_type and out["size"] > 500, out
    assert out["data_type"] == "application/json" and out["widget"] == widget.evaluate("el => el.localName")


def wait_waiting(url: str, n: int = 1, timeout: float = 30) -> None:
    """Until at least n requests wait in the live engine's queue (a request posted while the
    engine is paused has arrived)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
            if json.load(r)["waiting"] >= n:
                return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} requests reached the engine")


def wait_idle(url: str, timeout: float = 30) -> None:
    """Until the live engine has no running or waiting request."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
            health = json.load(r)
        if health["running"] == 0 and health["waiting"] == 0:
            return
        time.sleep(0.2)
    raise AssertionError("the engine did not go idle")


def open_live_widget(page, url: str, chapter: str, tag: str):
    """A chapter's first `tag`, drawn and scrolled into view, once the page's client is live
    and has its hello (a widget's live controls need both)."""
    page.goto(url + chapter)
    page.wait_for_selector(f"{tag}[data-painted]", state="attached")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live' && window.kvscope.client.hello")
    widget = page.locator(tag).first
    widget.scroll_into_view_if_needed()
    return widget


def recorded_views(new_page, site: str, chapter: str, tag: str, ready: str, views=RECORDED_VIEWS, height: int = 1000):
    """For each (dark, width) view: the static site's (no engine) `chapter` page, such as
    "/chapters/16-prefix-caching/", with its `tag` once `ready` holds for it, scrolled into view. Yields (page, widget, view name
    such as "dark-768") and closes the page when the loop moves on."""
    for dark, width in views:
        page = new_page(viewport={"width": width, "height": height}, color_scheme="dark" if dark else "light",
                        reduced_motion="reduce" if dark else "no-preference")
        page.goto(site + chapter)
        widget = page.locator(tag)
        page.wait_for_function(ready, arg=widget.element_handle(), timeout=15000)
        widget.scroll_into_view_if_needed()
        yield page, widget, f"{'dark' if dark else 'light'}-{width}"
        page.close()


def check_fits(page, widget) -> None:
    """At the page's width the widget does not scroll sideways, and every control is named."""
    width = page.viewport_size["width"]
    assert widget.evaluate("el => el.scrollWidth - el.clientWidth") <= 1, f"the widget scrolls sideways at {width}px"
    assert page.evaluate(UNNAMED_CONTROLS) == []


def run_collecting(page, widget, collect: str, button: str, done: str, timeout: float) -> dict:
    """Starts the page's own copy of the events (`collect` fills window.seen), presses the
    widget's `button`, waits until `done` holds for the widget; returns window.seen."""
    page.evaluate(collect)
    widget.get_by_role("button", name=button).click()
    page.wait_for_function(done, arg=widget.element_handle(), timeout=timeout)
    return page.evaluate("() => window.seen")
