"""Checks shared by the widget tests: opening a live widget, the toolbar exports, and waiting
for an idle engine."""
from __future__ import annotations

import json
import time
import urllib.request

EXPORT_JS = """async el => {
    const image = await el.exportImage();
    const data = el.exportDataBlob();
    const text = await image.blob.text();
    return {type: image.blob.type, size: image.blob.size, head: text.slice(0, 5),
            data_type: data.blob.type, widget: JSON.parse(await data.blob.text()).widget};
}"""


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
