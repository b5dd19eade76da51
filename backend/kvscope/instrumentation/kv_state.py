"""The `kv` events: the block pool and block tables as a snapshot, then per-step deltas.

A block's displayed state is (ref count, filled slots, short hash, owners). The tracker
keeps a shadow of what it last published and, after a step, re-derives only the blocks
the step could have touched (allocator events, the scheduled token ranges, tables that
changed), so its cost follows the step's work, not the pool's size."""
from __future__ import annotations

from kvscope.engine.block_manager import BlockManager
from kvscope.engine.sequence import Sequence


def short_hash(h: bytes | None) -> str | None:
    return None if h is None else h[:3].hex()


def block_state(bm: BlockManager, block_id: int, owners: dict[str, int], seqs: dict[str, Sequence]) -> tuple:
    """(ref, filled, hash, owners); `owners` maps request id -> index of the block in its table."""
    block, bs = bm.blocks[block_id], bm.block_size
    if block.ref_count == 0:
        return 0, bs if block.hash is not None else 0, short_hash(block.hash), ()
    filled = 0
    for rid, idx in owners.items():   # a shared block is as full as its fullest owner has it
        filled = max(filled, seqs[rid].num_computed_tokens - idx * bs)
    names = tuple(owners) if len(owners) == 1 else tuple(sorted(owners))
    return block.ref_count, min(filled, bs), short_hash(block.hash), names


def block_dict(block_id: int, state: tuple) -> dict:
    ref, filled, h, owners = state
    return {"id": block_id, "ref": ref, "filled": filled, "hash": h, "owners": list(owners)}


class KVTracker:
    def __init__(self, bm: BlockManager):
        self.bm = bm
        self.tables: dict[str, list[int]] = {}             # request id -> published table
        self.seqs: dict[str, Sequence] = {}
        self.owners: dict[int, dict[str, int]] = {}        # block -> {request id: index}
        self.states: list[tuple] = [block_state(bm, b, {}, {}) for b in range(bm.num_blocks)]
        self.num_cached = sum(1 for s in self.states if s[0] == 0 and s[2] is not None)

    def snapshot(self, step: int, ts: float = 0.0) -> dict:
        bm = self.bm
        return {"type": "kv", "ts": ts, "kind": "snapshot", "step": step, "block_size": bm.block_size,
                "num_blocks": bm.num_blocks,
                "blocks": [block_dict(b, s) for b, s in enumerate(self.states)],
                "tables": {rid: list(t) for rid, t in self.tables.items()}, **self._totals()}

    def _totals(self) -> dict:
        return {"num_free": self.bm.num_free_blocks, "num_cached": self.num_cached,
                "prefix_hits": self.bm.num_prefix_hits, "evictions": self.bm.num_evictions}

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

    def _touched_blocks(self, table: list[int], start: int, n: int, dirty: set[int]) -> None:
        """Blocks holding the computed tokens, and the unhashed run before them: committing
        a step can hash an older block (one that duplicated a since-evicted cached block)."""
        bs = self.bm.block_size
        first = start // bs
        for idx in range(min((start + n - 1) // bs, len(table) - 1), -1, -1):
            if idx < first and self.states[table[idx]][2] is not None:
                break
            dirty.add(table[idx])

    def update(self, seqs: list[Sequence], ranges: list[tuple[Sequence, int, int]], events: list[tuple],
               step: int, ts: float = 0.0) -> dict | None:
        """seqs: every sequence the step (or an abort) touched; ranges: (seq, start, n) of
        the tokens computed; events: the block manager's (op, block, detail) records."""
        dirty: set[int] = {e[1] for e in events}
        changed_tables = [s.request_id for s in seqs if self._retable(s, dirty)]
        for seq, start, n in ranges:
            self._touched_blocks(seq.block_table, start, n, dirty)
        blocks = []
        for b in sorted(dirty):
            state = block_state(self.bm, b, self.owners.get(b, {}), self.seqs)
            old = self.states[b]
            if state != old:
                self.num_cached += _is_cached(state) - _is_cached(old)
                self.states[b] = state
                blocks.append(block_dict(b, state))
        if not blocks and not changed_tables and not events:
            return None
        removed = [rid for rid in changed_tables if rid not in self.tables]
        id_to_rid = {s.seq_id: s.request_id for s in seqs} if events else {}
        return {"type": "kv", "ts": ts, "kind": "delta", "step": step, "blocks": blocks,
                "tables": {rid: list(self.tables[rid]) for rid in changed_tables if rid in self.tables},
                "removed_tables": removed,
                "events": [{"op": op, "block": b, "request_id": None if op == "evict" else id_to_rid.get(d)}
                           for op, b, d in events],
                **self._totals()}


def _is_cached(state: tuple) -> int:
    return int(state[0] == 0 and state[2] is not None)
