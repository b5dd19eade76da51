"""Shared check of a widget's toolbar exports (image and JSON data)."""
from __future__ import annotations

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
