"""The `kv` events: the block pool and block tables as a snapshot, then per-step deltas.

A block's displayed state is (ref count, filled slots, short hash, owners). The tracker
reads the pool once, when it starts (an observer attaching, or a reset); after that it
learns only from what each step hands its observers: the block manager's events (which
blocks were taken, shared, hashed, freed or evicted) and the scheduled sequences' tables
and token counts. It re-derives only the blocks a step touched, so its cost follows the
step's work, not the pool's size."""
from __future__ import annotations

from kvscope.engine.sequence import Sequence

def short_hash(h: bytes | None) -> str | None:
    return None if h is None else h[:3].hex()


def block_state(ref: int, h: bytes | None, owners: dict[str, int], seqs: dict[str, Sequence],
                block_size: int) -> tuple:
    """(ref, filled, hash, owners); `owners` maps request id -> index of the block in its table."""
    if ref == 0:
        return 0, block_size if h is not None else 0, short_hash(h), ()
    if len(owners) == 1:   # most blocks (a decode step touches one a sequence)
        (rid, idx), = owners.items()
        filled = seqs[rid].num_computed_tokens - idx * block_size
        return ref, min(max(filled, 0), block_size), short_hash(h), (rid,)
    filled = 0
    for rid, idx in owners.items():   # a shared block is as full as its fullest owner has it
        filled = max(filled, seqs[rid].num_computed_tokens - idx * block_size)
    return ref, min(filled, block_size), short_hash(h), tuple(sorted(owners))


def block_dict(block_id: int, state: tuple) -> dict:
    ref, filled, h, owners = state
    return {"id": block_id, "ref": ref, "filled": filled, "hash": h, "owners": list(owners)}


class KVTracker:
    def __init__(self, engine):
        """Starts from the engine's pool as it is now, and the tables of its live sequences."""
        self.block_size, self.hashes = engine.plan.block_size, engine.block_hashes()
        self.num_blocks = len(self.hashes)
        self.tables: dict[str, list[int]] = {}             # request id -> published table
        self.seqs: dict[str, Sequence] = {}
        self.owners: dict[int, dict[str, int]] = {}        # block -> {request id: index}
        for seq in engine.live_sequences():
            self._retable(seq, set())
        self.states: list[tuple] = [self._state(b) for b in range(self.num_blocks)]
        self.totals = {"num_free": sum(1 for s in self.states if s[0] == 0),
                       "num_cached": sum(1 for s in self.states if _is_cached(s)),
                       "prefix_hits": engine.num_prefix_hits, "evictions": engine.num_evictions}

    def _state(self, b: int) -> tuple:
        owners = self.owners.get(b, {})   # every table holding a block is tracked: its ref count
        return block_state(len(owners), self.hashes[b], owners, self.seqs, self.block_size)

    def snapshot(self, step: int, ts: float = 0.0) -> dict:
        return {"type": "kv", "ts": ts, "kind": "snapshot", "step": step, "block_size": self.block_size,
                "num_blocks": self.num_blocks,
                "blocks": [block_dict(b, s) for b, s in enumerate(self.states)],
                "tables": {rid: list(t) for rid, t in self.tables.items()}, **self.totals}

    def _retable(self, seq: Sequence, dirty: set[int]) -> bool:
        """Bring the published table of `seq` up to date; True if it changed."""
        rid, new = seq.request_id, seq.block_table
        old = self.tables.get(rid, [])
        if old == new:
            return False
        k = 0
        while k < len(old) and k < len(new) and old[k] == new[k]:
            k += 1
        for b in old[k:]:
            self.owners.get(b, {}).pop(rid, None)
            dirty.add(b)
        for i, b in enumerate(new[k:], k):
            self.owners.setdefault(b, {})[rid] = i
            dirty.add(b)
        if new:
            self.tables[rid], self.seqs[rid] = list(new), seq
        else:
            self.tables.pop(rid, None)
            self.seqs.pop(rid, None)
        return True

    def _apply(self, events: list[tuple]) -> list[tuple]:
        """Hashes and running totals from the events, in one pass; returns the published ones."""
        published = []
        for event in events:
            op, b, detail = event
            if op in ("hash", "uncache"):   # a block's cached contents named or forgotten
                self.hashes[b] = detail if op == "hash" else None
                continue
            if op == "evict":
                self.hashes[b] = None
                self.totals["evictions"] += 1
            elif op == "hit":
                self.totals["prefix_hits"] += 1
            published.append(event)
        return published

    def update(self, seqs: list[Sequence], ranges: list[tuple[Sequence, int, int]], events: list[tuple],
               step: int, ts: float = 0.0) -> dict | None:
        """seqs: every sequence the step (or an abort) touched; ranges: (seq, start, n) of
        the tokens computed; events: the block manager's (op, block, detail) records."""
        published = self._apply(events)
        dirty: set[int] = {e[1] for e in events}
        changed_tables = [s.request_id for s in seqs if self._retable(s, dirty)]
        bs = self.block_size
        for seq, start, n in ranges:   # the blocks the computed tokens filled
            dirty.update(seq.block_table[start // bs:(start + n - 1) // bs + 1])
        blocks = []
        for b in sorted(dirty):
            state, old = self._state(b), self.states[b]
            if state != old:
                if state[0] != old[0] or state[2] != old[2]:   # not only filled further: the totals move
                    self.totals["num_free"] += (state[0] == 0) - (old[0] == 0)
                    self.totals["num_cached"] += _is_cached(state) - _is_cached(old)
                self.states[b] = state
                blocks.append(block_dict(b, state))
        if not blocks and not changed_tables and not published:
            return None
        removed = [rid for rid in changed_tables if rid not in self.tables]
        id_to_rid = {s.seq_id: s.request_id for s in seqs} if published else {}
        return {"type": "kv", "ts": ts, "kind": "delta", "step": step, "blocks": blocks,
                "tables": {rid: list(self.tables[rid]) for rid in changed_tables if rid in self.tables},
                "removed_tables": removed,
                "events": [{"op": op, "block": b, "request_id": None if op == "evict" else id_to_rid.get(d)}
                           for op, b, d in published],
                **self.totals}


def _is_cached(state: tuple) -> int:
    return int(state[0] == 0 and state[2] is not None)
