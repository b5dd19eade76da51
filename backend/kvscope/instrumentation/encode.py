"""Events to what goes on the wire (docs/events.md, "Binary frames").

Most events are JSON text, compact. orjson (when installed) is several times faster than
the standard library, which matters when every step's events are serialised for hundreds
of viewers; the output is the same JSON either way.

Events that carry arrays (TENSOR_FIELDS: a watched request's attention weights, every
layer it watches in one event a step) travel as one binary WebSocket frame each: a
little-endian uint32 N, N bytes of a JSON header (the event without its arrays, plus
`tensors`: each array's name, dtype and shape; padded with spaces so the payload starts
8-byte aligned), then the arrays' bytes, little-endian float16, row-major, one after the
other (`weights` [layers, heads, rows, context], then `mean` [layers, rows, context]). A
recording (JSON lines) keeps the same header with the payload in base64 (`payload`).
Reading an array waits for its copy to the host, so encoding belongs off the engine thread."""
from __future__ import annotations

import base64
import json
import struct

import numpy as np

try:
    import orjson

    def dump_bytes(event: dict) -> bytes:
        return orjson.dumps(event)

    def dumps(event: dict) -> str:
        return orjson.dumps(event).decode()
except ImportError:   # pragma: no cover - the standard library is the fallback
    def dumps(event: dict) -> str:
        return json.dumps(event, separators=(",", ":"), ensure_ascii=False)

    def dump_bytes(event: dict) -> bytes:
        return dumps(event).encode()

TENSOR_FIELDS = {"attention": ("weights", "mean")}   # event type -> its array fields, in payload order
WIRE_DTYPE = np.dtype("<f2")
ALIGN = 8
_LENGTH = struct.Struct("<I")


def has_tensors(event: dict) -> bool:
    """True for an event whose arrays are still arrays (not lists, as converted recordings hold
    them, nor bytes already in a recorded `payload`)."""
    names = TENSOR_FIELDS.get(event.get("type"))
    return names is not None and event.get(names[0]) is not None and not isinstance(event[names[0]], list)


def _parts(event: dict) -> tuple[dict, list[np.ndarray]]:
    """(the JSON header, the arrays as they go on the wire): each event's arrays are small,
    so what costs here is per call; nothing is copied that is already float16 in order."""
    names = TENSOR_FIELDS[event["type"]]
    header = event.copy()
    arrays = [np.ascontiguousarray(header.pop(name), WIRE_DTYPE) for name in names]
    header["tensors"] = [{"name": name, "dtype": "float16", "shape": a.shape} for name, a in zip(names, arrays)]
    return header, arrays


def split(event: dict) -> tuple[dict, bytes]:
    """(the JSON header, the payload) of an event with arrays."""
    header, arrays = _parts(event)
    return header, b"".join(arrays)


def binary_frame(event: dict) -> bytes:
    header, arrays = _parts(event)
    text = dump_bytes(header)
    pad = -(4 + len(text)) % ALIGN
    return b"".join((_LENGTH.pack(len(text) + pad), text, b" " * pad, *arrays))


def cut_attention(event: dict, layers: frozenset[int] | None, heads: frozenset[int] | None) -> dict:
    """A live attention event (its arrays still arrays) cut to the layers and heads one
    viewer asked for (None: all of them); the event itself when it has nothing else."""
    keep_layers = [k for k, n in enumerate(event["layers"]) if layers is None or n in layers]
    keep_heads = [k for k, h in enumerate(event["heads"]) if heads is None or h in heads]
    if len(keep_layers) == len(event["layers"]) and len(keep_heads) == len(event["heads"]):
        return event
    weights = np.asarray(event["weights"])[keep_layers][:, keep_heads]
    mean = np.asarray(event["mean"])[keep_layers]
    return {**event, "layers": [event["layers"][k] for k in keep_layers],
            "heads": [event["heads"][k] for k in keep_heads], "kv_heads": [event["kv_heads"][k] for k in keep_heads],
            "weights": weights, "mean": mean}


def json_text(event: dict) -> str:
    """An event as one line of JSON: arrays as base64 (recordings, and anything text-only)."""
    if not has_tensors(event):
        return dumps(event)
    header, payload = split(event)
    header["payload"] = base64.b64encode(payload).decode("ascii")
    return dumps(header)


def frame(event: dict) -> str | bytes:
    """What a WebSocket sends for this event: bytes for a binary frame, else text."""
    return binary_frame(event) if has_tensors(event) else dumps(event)


def decode(data: str | bytes) -> dict:
    """One event from a binary frame or a JSON text (with or without a base64 payload),
    its arrays as float32 numpy arrays. The Python twin of frontend/js/lib/frames.js."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        n = struct.unpack_from("<I", data)[0]
        event, payload = json.loads(bytes(data[4:4 + n])), bytes(data[4 + n:])
    else:
        event = json.loads(data)
        payload = base64.b64decode(event.pop("payload")) if "payload" in event else None
    if payload is None or "tensors" not in event:
        return event
    offset = 0
    for t in event.pop("tensors"):
        count = int(np.prod(t["shape"]))
        event[t["name"]] = np.frombuffer(payload, WIRE_DTYPE, count, offset).astype(np.float32).reshape(t["shape"])
        offset += count * WIRE_DTYPE.itemsize
    return event
