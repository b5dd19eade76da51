"""vLLM's prefix cache drawn as kvscope's block pool. Its KV events name blocks by content hash
only, so each hash gets a place in a pool of the server's size, in the order stored; kvscope's
requests find their blocks by walking their token ids (a block's key: its parent's hash and its
tokens), so `ref` and `owners` count only those. `hits`: a kvscope request's from vLLM's
`cached_tokens`, another client's when vLLM republishes a block it holds (report mode "full")."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.server.attach.kv_frames import Batch, Cleared, Removed, Stored, short_hash


@dataclass
class Tracked:
    """A request kvscope sent: its token ids so far and the places of its cached blocks."""
    token_ids: list[int]
    num_prompt_tokens: int
    table: list[int] = field(default_factory=list)
    cached_at_start: int = 0   # prompt blocks already in the cache when it was sent


class AttachedPool:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks = [self._empty(i) for i in range(num_blocks)]
        self.place: dict[object, int] = {}          # vLLM hash -> place in the pool
        self.child: dict[tuple, object] = {}        # (parent hash, block tokens) -> hash
        self.key_of: dict[object, tuple] = {}       # hash -> (parent hash, block tokens)
        self.order: list[int] = []                  # places holding a hash, oldest first
        self.free = list(range(num_blocks - 1, -1, -1))
        self.requests: dict[str, Tracked] = {}
        self.step = 0
        self.prefix_hits = self.evictions = 0
        self._events: list[dict] = []
        self._changed: set[int] = set()
        self._removed_tables: list[str] = []

    @staticmethod
    def _empty(i: int) -> dict:
        return {"id": i, "ref": 0, "filled": 0, "hash": None, "owners": [], "text": None, "hits": 0}

    def apply(self, batch: Batch) -> list[tuple[object, tuple[int, ...]]]:
        """Apply one batch; returns (hash, tokens) of the new blocks, to be labelled."""
        self.step = max(self.step, batch.seq)
        new = []
        for e in batch.events:
            if isinstance(e, Stored):
                new.extend(self._store(e))
            elif isinstance(e, Removed):
                for h in e.block_hashes:
                    self._remove(h)
            elif isinstance(e, Cleared):
                for h in list(self.place):
                    self._remove(h)
        self._retable()
        return new

    def _store(self, e: Stored) -> list[tuple[object, tuple[int, ...]]]:
        bs, parent, new = e.block_size, e.parent_block_hash, []
        for i, h in enumerate(e.block_hashes):
            tokens = e.token_ids[i * bs:(i + 1) * bs]
            if h in self.place:
                self._reused(self.place[h])
            else:
                slot = self._take_place()
                self.place[h] = slot
                self.order.append(slot)
                self.blocks[slot].update(hash=short_hash(h), filled=len(tokens), text=None, hits=0)
                self.key_of[h] = (parent, tokens)
                self.child[(parent, tokens)] = h
                self._note(slot, {"op": "alloc", "block": slot, "request_id": None})
                new.append((h, tokens))
            parent = h
        return new

    def _reused(self, slot: int) -> None:
        """vLLM republished a block it held (report mode "full"): another client's hit (kvscope's count in hit())."""
        if any(slot in r.table for r in self.requests.values()):
            return
        self.blocks[slot]["hits"] += 1
        self.prefix_hits += 1
        self._note(slot, {"op": "hit", "block": slot, "request_id": None})

    def _take_place(self) -> int:
        if self.free:
            return self.free.pop()
        # Every place holds a hash vLLM did not remove (an event lost before kvscope
        # attached): reuse the oldest place no kvscope request holds.
        for slot in self.order:
            if self.blocks[slot]["ref"] == 0:
                self._remove(next(h for h, s in self.place.items() if s == slot))
                return self.free.pop()
        raise RuntimeError("the attached pool is full of blocks held by kvscope's requests")

    def _remove(self, h) -> None:
        slot = self.place.pop(h, None)
        if slot is None:
            return
        self.child.pop(self.key_of.pop(h), None)
        self.order.remove(slot)
        self.free.append(slot)
        self.blocks[slot] = self._empty(slot)
        self.evictions += 1
        self._note(slot, {"op": "evict", "block": slot, "request_id": None})

    def label(self, h, text: str) -> None:
        slot = self.place.get(h)
        if slot is not None:
            self.blocks[slot]["text"] = text
            self._changed.add(slot)

    def track(self, rid: str, prompt_ids: list[int]) -> None:
        self.requests[rid] = Tracked(list(prompt_ids), len(prompt_ids))
        self._retable()
        self.requests[rid].cached_at_start = len(self.requests[rid].table)

    def extend(self, rid: str, token_ids: list[int]) -> None:
        r = self.requests.get(rid)
        if r is not None:
            r.token_ids.extend(token_ids)
            self._retable()

    def hit(self, rid: str, cached_tokens: int | None) -> int:
        """The request's blocks hit, from vLLM's `cached_tokens` (None: the blocks cached when it was sent)."""
        r = self.requests.get(rid)
        if r is None:
            return 0
        n = r.cached_at_start if cached_tokens is None else cached_tokens // self.block_size
        for slot in r.table[:n]:
            self.blocks[slot]["hits"] += 1
            self._note(slot, {"op": "hit", "block": slot, "request_id": rid})
        self.prefix_hits += n
        return n

    def finish(self, rid: str) -> None:
        if self.requests.pop(rid, None) is not None:
            self._removed_tables.append(rid)
            self._retable()

    def walk(self, ids: list[int]) -> list[int]:
        table, parent, bs = [], None, self.block_size
        for start in range(0, len(ids) - bs + 1, bs):
            h = self.child.get((parent, tuple(ids[start:start + bs])))
            if h is None:
                break
            table.append(self.place[h])
            parent = h
        return table

    def _retable(self) -> None:
        owners: dict[int, list[str]] = {}
        for rid, r in self.requests.items():
            table = self.walk(r.token_ids)
            if table != r.table:
                r.table = table
                self._changed.add(-1)   # tables changed
            for slot in table:
                owners.setdefault(slot, []).append(rid)
        for b in self.blocks:
            mine = owners.get(b["id"], [])
            if mine != b["owners"]:
                b["owners"], b["ref"] = mine, len(mine)
                self._changed.add(b["id"])

    def _note(self, slot: int, event: dict) -> None:
        self._changed.add(slot)
        self._events.append(event)

    def totals(self) -> dict:
        cached = sum(1 for b in self.blocks if b["hash"] is not None and b["ref"] == 0)
        used = sum(1 for b in self.blocks if b["ref"] > 0)
        return {"num_free": self.num_blocks - used, "num_cached": cached,
                "prefix_hits": self.prefix_hits, "evictions": self.evictions}

    def tables(self) -> dict[str, list[int]]:
        return {rid: list(r.table) for rid, r in self.requests.items()}

    def snapshot(self, ts: float) -> dict:
        self._events, self._changed, self._removed_tables = [], set(), []
        return {"type": "kv", "ts": ts, "kind": "snapshot", "step": self.step, "block_size": self.block_size,
                "num_blocks": self.num_blocks, "blocks": [dict(b) for b in self.blocks],
                "tables": self.tables(), **self.totals()}

    def delta(self, ts: float) -> dict | None:
        """What changed since the last snapshot or delta; None when nothing did."""
        if not (self._changed or self._events or self._removed_tables):
            return None
        changed = sorted(s for s in self._changed if s >= 0)
        removed = [rid for rid in self._removed_tables if rid not in self.requests]
        event = {"type": "kv", "ts": ts, "kind": "delta", "step": self.step,
                 "blocks": [dict(self.blocks[s]) for s in changed], "tables": self.tables(),
                 "removed_tables": removed, "events": self._events, **self.totals()}
        self._events, self._changed, self._removed_tables = [], set(), []
        return event
