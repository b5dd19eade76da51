"""What a late joiner needs, mirrored from the event stream, so snapshots never touch the engine thread."""
from __future__ import annotations

from kvscope.instrumentation.encode import dumps


class KVMirror:
    """The pool as the viewers know it: the last snapshot with every delta applied."""

    def __init__(self):
        self.blocks: list[dict] = []
        self.tables: dict[str, list[int]] = {}
        self.meta: dict = {}
        self.pool: int | None = None   # attached to several pools: which one this mirrors
        self._text: str | None = None

    def apply(self, e: dict) -> None:
        totals = {k: e[k] for k in ("num_free", "num_cached", "prefix_hits", "evictions")}
        if e["kind"] == "snapshot":
            self.blocks, self.tables = list(e["blocks"]), dict(e["tables"])
            self.meta = {"block_size": e["block_size"], "num_blocks": e["num_blocks"]}
            self.pool = e.get("pool")
        else:
            for b in e["blocks"]:
                self.blocks[b["id"]] = b
            self.tables.update(e["tables"])
            for rid in e["removed_tables"]:
                self.tables.pop(rid, None)
        self.meta.update(totals, step=e["step"])
        self._text = None

    def snapshot(self, ts: float) -> dict:
        m = self.meta
        return {"type": "kv", "ts": ts, "kind": "snapshot", "step": m["step"], "block_size": m["block_size"],
                "num_blocks": m["num_blocks"], "blocks": self.blocks, "tables": self.tables,
                **{k: m[k] for k in ("num_free", "num_cached", "prefix_hits", "evictions")},
                **({"pool": self.pool} if self.pool is not None else {})}

    def snapshot_text(self, ts: float) -> str:
        if self._text is None:
            self._text = dumps(self.snapshot(ts))
        return self._text


class StreamState:
    def __init__(self, clock, metrics=None):
        self.clock = clock
        self.metrics = metrics
        self.kvs: dict[int, KVMirror] = {}   # by `pool` (kvscope's own engine: one, pool 0)
        self.memory: dict | None = None
        self.requests: dict[str, dict] = {}                      # in flight, for request.snapshot
        self.owners: dict[str, str] = {}                         # request id -> viewer id

    def observe(self, e: dict) -> None:
        kind = e["type"]
        if kind == "kv":
            self.kvs.setdefault(e.get("pool", 0), KVMirror()).apply(e)
        elif kind == "memory":
            self.memory = e
        elif kind == "request.added":
            if e["owner"] is not None:
                self.owners[e["request_id"]] = e["owner"]
            self.requests[e["request_id"]] = {
                "request_id": e["request_id"], "source": e["source"], "owner": e["owner"],
                "status": "held" if e["held"] else "waiting", "num_prompt_tokens": e["num_prompt_tokens"],
                "num_output_tokens": 0, "num_computed_tokens": 0, "held": e["held"], "watched": e["watched"]}
        elif kind == "request.token":
            r = self.requests.get(e["request_id"])
            if r is not None:
                r["num_output_tokens"] = e["index"] + 1
        elif kind == "step":
            for s in e["seqs"]:
                r = self.requests.get(s["request_id"])
                if r is not None:
                    r["num_computed_tokens"] = s["start"] + s["num_tokens"]
                    r["status"] = "held" if r["held"] else "running"
            for rid in e["preempted"]:
                if rid in self.requests:
                    self.requests[rid]["status"] = "waiting"
        if self.metrics is not None:
            source = self.requests.get(e.get("request_id", ""), {}).get("source", "api")
            self.metrics.observe(e, source)

    def forget(self, rid: str) -> str | None:
        self.requests.pop(rid, None)
        return self.owners.pop(rid, None)

    def set_held(self, rid: str, held: bool) -> None:
        r = self.requests.get(rid)
        if r is not None:
            r["held"] = held
            if held or r["status"] == "held":
                r["status"] = "held" if held else "running"

    def snapshot_texts(self, kind: str) -> list[str]:
        if kind == "kv":
            ts = self.clock()
            return [m.snapshot_text(ts) for _pool, m in sorted(self.kvs.items()) if m.meta]
        if kind == "memory":
            return [dumps(self.memory)] if self.memory is not None else []
        return []

    def snapshots(self, families) -> list[dict]:
        """What a viewer subscribing to `families` needs before deltas."""
        out, ts = [], self.clock()
        if "kv" in families:
            out.extend(m.snapshot(ts) for _pool, m in sorted(self.kvs.items()) if m.meta)
        if "memory" in families and self.memory is not None:
            out.append(self.memory)
        if "request" in families:
            out.append({"type": "request.snapshot", "ts": ts, "requests": list(self.requests.values())})
        return out
