"""Convert recordings of schema versions 1 to 4 to the current one (docs/events.md). Up to
version 3: a watched request's per-layer `attention` events of one step (consecutive in
the stream) become one event carrying every layer; lists stay lists (version 1), float16
payloads are regrouped byte for byte (version 2). Version 4: a `sampling` event lists its
candidates once and each stage carries arrays parallel to them. Version 5: a stage the
request does not apply keeps only its name and `applied: false`, and an `attention` event
keeps the `token_ids` new since the request's previous one (all of them in its first). The
numbers are not touched.

    python scripts/upgrade_recordings.py frontend/recordings/*.jsonl
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "backend"))

from kvscope.instrumentation.encode import decode, json_text   # noqa: E402
from kvscope.instrumentation.schema import SCHEMA_VERSION   # noqa: E402

SAME = ("request_id", "step", "recomputed", "heads", "kv_heads", "num_heads", "query_positions", "context_len",
        "token_ids")


def compact(event: dict) -> str:
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def merged(group: list[dict]) -> str:
    """One version-3 attention line from a step's per-layer events."""
    first = {k: v for k, v in group[0].items() if k not in ("layer", "weights", "mean", "tensors", "payload")}
    first = {**first, "layers": [e["layer"] for e in group]}
    if "payload" in group[0]:   # version 2: float16 arrays in base64
        arrays = [decode(json.dumps(e)) for e in group]
        return json_text({**first, "weights": np.stack([a["weights"] for a in arrays]).astype(np.float16),
                          "mean": np.stack([a["mean"] for a in arrays]).astype(np.float16)})
    return compact({**first, "weights": [e["weights"] for e in group], "mean": [e["mean"] for e in group]})


def columns(event: dict) -> dict:
    """A version-4 sampling line from an older one: each stage's candidate objects become the
    event's `candidates` (ids, texts, once) and the stage's `logits` and `probs` arrays."""
    listed = event["stages"][0]["candidates"]
    stages = [{**{k: v for k, v in st.items() if k != "candidates"},
               "logits": [c["logit"] for c in st["candidates"]], "probs": [c["prob"] for c in st["candidates"]]}
              for st in event["stages"]]
    if any([c["id"] for c in st["candidates"]] != [c["id"] for c in listed] for st in event["stages"]):
        raise ValueError(f"sampling event {event['request_id']}/{event['index']}: stages list different candidates")
    out = {}
    for key, value in event.items():   # the fields in their order, `candidates` just before `stages`
        if key == "stages":
            out["candidates"] = {"ids": [c["id"] for c in listed], "texts": [c["text"] for c in listed]}
            value = stages
        out[key] = value
    return out


def unapplied_bare(event: dict) -> dict:
    """A version-5 sampling event: a stage not applied keeps only its name and `applied`."""
    return {**event, "stages": [st if st["applied"] else {"name": st["name"], "applied": False}
                                for st in event["stages"]]}


def new_tokens_only(lines: list[str]) -> list[str]:
    """Version 5 attention lines: after a request's first event, only the ids of the key
    positions from its first query position on (those earlier came with earlier events)."""
    out, seen = [], set()
    for line in lines:
        event = json.loads(line)
        if event.get("type") == "attention" and len(event["token_ids"]) == event["context_len"]:
            if event["request_id"] in seen:
                line = compact({**event, "token_ids": event["token_ids"][event["query_positions"][0]:]})
            seen.add(event["request_id"])
        out.append(line)
    return out


def upgrade(lines: list[str]) -> list[str]:
    head = json.loads(lines[0])
    if head.get("schema_version") == SCHEMA_VERSION:
        return lines
    out, group = [json.dumps({**head, "schema_version": SCHEMA_VERSION})], []
    for line in lines[1:] + [None]:
        event = json.loads(line) if line is not None else None
        is_layer = event is not None and event.get("type") == "attention" and "layer" in event
        if group and not (is_layer and all(event.get(k) == group[0].get(k) for k in SAME)):
            out.append(merged(group))
            group = []
        if is_layer:
            group.append(event)
        elif event is not None and event.get("type") == "hello":
            out.append(compact({**event, "schema_version": SCHEMA_VERSION}))
        elif event is not None and event.get("type") == "sampling":
            out.append(compact(unapplied_bare(columns(event) if "candidates" in event["stages"][0] else event)))
        elif event is not None:
            out.append(line)
    return new_tokens_only(out)


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        new = upgrade(lines)
        path.write_text("\n".join(new) + "\n", encoding="utf-8")
        print(f"{path}: {len(lines) - 1} events -> {len(new) - 1}")


if __name__ == "__main__":
    main(sys.argv[1:])
