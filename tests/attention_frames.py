"""Version-3 attention events (one a watched request and step, every layer it watches) read
back one layer at a time, for the tests that compare layers against a reference. Needs
nothing beyond the standard library (tests/test_gpu.py runs on bare GPU machines)."""
from __future__ import annotations


def per_layer(attention: list[dict]) -> list[dict]:
    """Decoded attention events (one a request and step, every layer it watches) as one dict
    a layer, `layer` set and its `weights` [heads, rows, context] and `mean` [rows, context]
    cut out, after checking each event's arrays have the shape its header says."""
    out = []
    for a in attention:
        shape = (len(a["layers"]), len(a["heads"]), len(a["query_positions"]), a["context_len"])
        assert _shape(a["weights"]) == shape and _shape(a["mean"]) == shape[:1] + shape[2:], (a["layers"], a["step"])
        out += [{**a, "layer": layer, "weights": a["weights"][i], "mean": a["mean"][i]}
                for i, layer in enumerate(a["layers"])]
    return out


def _shape(nested) -> tuple[int, ...]:
    if hasattr(nested, "shape"):
        return tuple(nested.shape)
    return (len(nested),) + (_shape(nested[0]) if nested and isinstance(nested[0], list) else ())
