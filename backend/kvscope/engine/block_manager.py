"""The page allocator: a pool of fixed-size KV blocks with ref counts and a prefix cache.

A full block is identified by a hash chained to the block before it, so equal hashes mean
equal prefixes. Freed blocks keep their hash (lazy eviction) and sit in an LRU free list:
a later request with the same prefix takes them back; only allocating a fresh block
evicts the oldest one's hash.

Parallel sampling forks a sequence after its prompt: the copies share every block (ref
counts). Full blocks are never written again, so they stay shared; the partial last block
is copied only when a sequence first writes into it while others still hold it
(copy-on-write). The copies to make on the device are handed to the model runner.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kvscope.engine.sequence import Sequence
from kvscope.paging import cdiv


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()   # content of a hashed block, checked on every hit


def chain_hash(prev_hash: int | None, token_ids) -> int:
    return hash((prev_hash, *token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.capacity = num_blocks * block_size   # tokens the whole pool holds
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.events: list[tuple] | None = None   # a list while someone records allocator events
        self.num_prefix_hits = 0                 # blocks reused, since start
        self.num_evictions = 0
        self.num_copies = 0                      # copy-on-write copies, since start
        self.pending_copies: list[tuple[int, int]] = []   # (src, dst) for the next step

    # -- sizes -------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # -- prefix cache ------------------------------------------------------------------
    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_full_blocks):
            prev = seq.block_hashes[i - 1] if i else None
            seq.block_hashes.append(chain_hash(prev, seq.token_ids[i * bs:(i + 1) * bs]))

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold this sequence's leading tokens (at least one token is left
        to compute, because the step that computes it produces the next token's logits)."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, max_blocks)
        hits = []
        for i in range(max_blocks):
            block_id = self.hash_to_block.get(seq.block_hashes[i])
            if block_id is None:
                break
            tokens = tuple(seq.token_ids[i * self.block_size:(i + 1) * self.block_size])
            if self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
        return hits

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix held by a free block, so the same prompts are computed
        again (a benchmark's repeats must not be served from the previous run's cache).
        Blocks in use keep theirs: their sequences still own those contents."""
        for block_id in self.free_ids:
            block = self.blocks[block_id]
            if block.hash is not None:
                if self.hash_to_block.get(block.hash) == block_id:
                    del self.hash_to_block[block.hash]
                block.hash, block.token_ids = None, ()

    # -- allocation --------------------------------------------------------------------
    def can_allocate(self, hits: list[int], num_tokens: int) -> bool:
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        fresh = self.blocks_for(num_tokens) - len(hits)
        return revived + fresh <= self.num_free_blocks

    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> None:
        """First allocation of a waiting sequence: reuse `hits`, then fresh blocks so that
        the cached tokens plus `num_new_tokens` have slots."""
        assert not seq.block_table, "sequence already holds blocks"
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_ids[block_id]
            block.ref_count += 1
            self._record("hit", block_id, seq.seq_id)
        self.num_prefix_hits += len(hits)
        seq.block_table = list(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        self.append_slots(seq, num_new_tokens)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        fresh, copy = self._append_cost(seq, num_new_tokens)
        return fresh + copy <= len(self.free_ids)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        if not self.try_append(seq, num_new_tokens):
            raise RuntimeError(f"out of KV blocks: need {sum(self._append_cost(seq, num_new_tokens))}, "
                               f"{self.num_free_blocks} free")

    def try_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Slots for `num_new_tokens` more tokens: fresh blocks past the table's end, and a
        copy of a shared block about to be written. False, with nothing changed, when the
        free blocks do not cover them (the scheduler's one call per running sequence)."""
        fresh, copy = self._append_cost(seq, num_new_tokens)
        if fresh + copy > len(self.free_ids):
            return False
        if copy:
            self._copy_on_write(seq)
        for _ in range(fresh):
            seq.block_table.append(self._take_free_block(seq.seq_id))
        return True

    def _append_cost(self, seq: Sequence, num_new_tokens: int) -> tuple[int, bool]:
        """What appending takes from the free list: new blocks past the table, and whether
        the next token lands in a block another sequence still holds (a forked prompt's
        partial last block), which must be copied first."""
        table, computed = seq.block_table, seq.num_computed_tokens
        idx = computed // self.block_size
        return (self.blocks_for(computed + num_new_tokens) - len(table),
                idx < len(table) and self.blocks[table[idx]].ref_count > 1)

    def _copy_on_write(self, seq: Sequence) -> None:
        idx = seq.num_computed_tokens // self.block_size
        src = seq.block_table[idx]
        self.blocks[src].ref_count -= 1
        dst = self._take_free_block(seq.seq_id, op="cow")
        seq.block_table[idx] = dst
        self.pending_copies.append((src, dst))
        self.num_copies += 1

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` continues from `parent`'s computed tokens, sharing all of its blocks."""
        assert not child.block_table, "a fork starts without blocks"
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
            self._record("share", block_id, child.seq_id)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def _take_free_block(self, owner: int, op: str = "alloc") -> int:
        block_id, _ = self.free_ids.popitem(last=False)   # least recently freed first
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            self.num_evictions += 1
            self._record("evict", block_id, block.hash)
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        self._record(op, block_id, owner)
        return block_id

    def commit(self, seq: Sequence) -> None:
        """After a step: hash the blocks that became full so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        if len(seq.block_hashes) < num_full:
            self._extend_hashes(seq, num_full)
        for i in range(num_full - 1, -1, -1):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                break     # everything before an already-hashed block is hashed too
            h = seq.block_hashes[i]
            if h not in self.hash_to_block:   # a duplicate of a cached block stays unhashed
                block.hash, block.token_ids = h, tuple(seq.token_ids[i * bs:(i + 1) * bs])
                self.hash_to_block[h] = block.block_id

    def trim(self, seq: Sequence) -> None:
        """Give back blocks past the computed tokens: those allocated for drafts that the
        target rejected (their slots hold K/V of tokens that never joined the sequence)."""
        keep = self.blocks_for(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop(), seq.seq_id)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; the tail goes into the free list first, so a
        shared prefix outlives the unique suffix when blocks are later evicted."""
        for block_id in reversed(seq.block_table):
            self._release(block_id, seq.seq_id)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _release(self, block_id: int, owner: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free_ids[block_id] = None
            self._record("free", block_id, owner)

    def _record(self, kind: str, block_id: int, detail) -> None:
        if self.events is not None:
            self.events.append((kind, block_id, detail))

    # -- inspection --------------------------------------------------------------------
    def check_invariants(self, live: list[Sequence]) -> None:
        """Ref counts equal the number of live block tables holding each block; free means 0."""
        counts = [0] * self.num_blocks
        for seq in live:
            for block_id in seq.block_table:
                counts[block_id] += 1
        for block in self.blocks:
            assert block.ref_count == counts[block.block_id], f"block {block.block_id} ref mismatch"
            assert (block.ref_count == 0) == (block.block_id in self.free_ids), \
                f"block {block.block_id} free-list mismatch"
