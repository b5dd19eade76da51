"""The page allocator: fixed-size KV blocks with ref counts, an LRU free list and a prefix
cache of full blocks found by vLLM's chained hash (parent, tokens, `cache_salt`) and checked
for identity on every hit; forks share blocks and copy a shared partial block on write."""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from kvscope.engine.sequence import Sequence

BlockHash = bytes


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def slots(blocks, positions, block_size: int):
    """The cache slots of `positions`, given each one's block; numpy arrays or ints alike."""
    return blocks * block_size + positions % block_size


def _xxhash(data: bytes) -> bytes:
    try:
        import xxhash
    except ImportError:
        raise ValueError("prefix_caching_hash_algo='xxhash' needs the xxhash package (pip install xxhash)") from None
    return xxhash.xxh3_128_digest(data)


# vLLM's names. sha256 resists collisions even from crafted prompts; xxhash (128-bit) is
# several times faster and relies on the identity check in match_prefix for correctness.
HASH_FUNCTIONS: dict[str, Callable[[bytes], bytes]] = {"sha256": lambda data: hashlib.sha256(data).digest(),
                                                        "xxhash": _xxhash}


def hash_block_tokens(hash_fn: Callable[[bytes], bytes], parent: BlockHash | None, token_ids,
                      extra_keys: tuple = ()) -> BlockHash:
    """(parent's hash, token ids, extra keys): fixed sizes, so the concatenation is unambiguous."""
    root = hash_fn(b"kvscope prefix cache root")   # the first block's parent
    return hash_fn(b"".join([parent or root, array("I", token_ids).tobytes(), repr(extra_keys).encode()]))


def block_extra_keys(seq: Sequence, index: int) -> tuple:
    """The salt goes into the first block only; the chain carries it into every later hash."""
    return (seq.cache_salt,) if index == 0 and seq.cache_salt is not None else ()


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()   # content of a hashed block, checked on every hit
    extra_keys: tuple = ()
    parent: tuple[int, int] | None = None   # (block id, generation) this block was computed after
    generation: int = 0               # bumped whenever the block is taken for new contents


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 prefix_caching_hash_algo: str = "sha256"):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        if prefix_caching_hash_algo not in HASH_FUNCTIONS:
            raise ValueError(f"prefix_caching_hash_algo must be one of {sorted(HASH_FUNCTIONS)}, "
                             f"got {prefix_caching_hash_algo!r}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_algo = prefix_caching_hash_algo
        self.hash_fn = HASH_FUNCTIONS[prefix_caching_hash_algo]
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.capacity = num_blocks * block_size   # tokens the whole pool holds
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[BlockHash, int] = {}
        self.events: list[tuple] | None = None   # a list while someone records allocator events
        self.num_prefix_hits = self.num_evictions = self.num_copies = 0   # blocks reused, evicted, copied on write
        # vLLM's counters, in tokens: a new request's tokens looked up and found; a
        # preempted request's re-admission is counted apart (its hits are recomputation saved)
        self.prefix_cache_queries = self.prefix_cache_hits = 0
        self.preempted_queries = self.preempted_hits = 0
        self.pending_copies: list[tuple[int, int]] = []   # (src, dst) for the next step

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

    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_full_blocks):
            prev = seq.block_hashes[i - 1] if i else None
            seq.block_hashes.append(hash_block_tokens(self.hash_fn, prev, seq.token_ids[i * bs:(i + 1) * bs],
                                                      block_extra_keys(seq, i)))

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding this sequence's leading tokens, leaving at least one token to
        compute (it yields the next logits): a prompt of exactly k blocks reuses k - 1."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, max_blocks)
        hits: list[int] = []
        for i in range(max_blocks):
            block_id = self.hash_to_block.get(seq.block_hashes[i])
            if block_id is None or not self._same_block(seq, i, block_id, hits):
                break
            hits.append(block_id)
        if len(hits) == max_blocks and seq.num_tokens % self.block_size == 0:
            self._extend_hashes(seq, max_blocks + 1)
            seq.last_block_recomputed = seq.block_hashes[max_blocks] in self.hash_to_block
        return hits

    def _same_block(self, seq: Sequence, index: int, block_id: int, table: list[int]) -> bool:
        """Same tokens and extra keys, computed after the very block `table` has before it."""
        block, bs = self.blocks[block_id], self.block_size
        return (block.parent == self._parent(table, index) and block.extra_keys == block_extra_keys(seq, index)
                and block.token_ids == tuple(seq.token_ids[index * bs:(index + 1) * bs]))

    def _parent(self, table: list[int], index: int) -> tuple[int, int] | None:
        return (table[index - 1], self.blocks[table[index - 1]].generation) if index else None

    def reset_prefix_cache(self) -> None:
        """Forget the prefixes of free blocks (a benchmark's repeats must compute them again)."""
        for block_id in self.free_ids:
            block = self.blocks[block_id]
            if block.hash is not None:
                del self.hash_to_block[block.hash]
                block.hash, block.token_ids = None, ()
                block.generation += 1
                self._record("uncache", block_id, None)

    def can_allocate(self, hits: list[int], num_tokens: int) -> bool:
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        fresh = self.blocks_for(num_tokens) - len(hits)
        return revived + fresh <= self.num_free_blocks

    def allocate(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> None:
        """A waiting sequence's first blocks: `hits`, then fresh ones for `num_new_tokens`."""
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_ids[block_id]
            block.ref_count += 1
            self._record("hit", block_id, seq.seq_id)
        self.num_prefix_hits += len(hits)
        found = len(hits) * self.block_size
        if seq.num_preemptions:
            self.preempted_queries += seq.num_tokens
            self.preempted_hits += found
        else:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += found
        seq.block_table = list(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = found
        self.append_slots(seq, num_new_tokens)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return sum(self._append_cost(seq, num_new_tokens)) <= len(self.free_ids)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        if not self.try_append(seq, num_new_tokens):
            raise RuntimeError(f"out of KV blocks: {self.num_free_blocks} free")

    def try_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Slots for `num_new_tokens` more tokens (copying a shared block about to be written),
        or False with nothing changed when the free blocks do not cover them."""
        fresh, copy = self._append_cost(seq, num_new_tokens)
        if fresh + copy > len(self.free_ids):
            return False
        if copy:
            idx = seq.num_computed_tokens // self.block_size
            src = seq.block_table[idx]
            self.blocks[src].ref_count -= 1
            seq.block_table[idx] = dst = self._take_free_block(seq.seq_id, op="cow")
            self.pending_copies.append((src, dst))
            self.num_copies += 1
        for _ in range(fresh):
            seq.block_table.append(self._take_free_block(seq.seq_id))
        return True

    def _append_cost(self, seq: Sequence, num_new_tokens: int) -> tuple[int, bool]:
        """(new blocks past the table, whether the next token lands in a block others hold)."""
        table, computed = seq.block_table, seq.num_computed_tokens
        idx = computed // self.block_size
        return (self.blocks_for(computed + num_new_tokens) - len(table),
                idx < len(table) and self.blocks[table[idx]].ref_count > 1)

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def record_events(self, on: bool) -> None:
        """Keep (or stop keeping) events (kind, block_id, detail): alloc, hit, share, cow, free,
        evict, hash, uncache."""
        self.events = [] if on else None

    def take_events(self) -> list[tuple]:
        if self.events is None:
            return []
        events, self.events = self.events, []
        return events

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` continues from `parent`'s computed tokens, sharing all of its blocks."""
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
            self._record("share", block_id, child.seq_id)
        child.block_table, child.block_hashes = list(parent.block_table), list(parent.block_hashes)
        child.num_computed_tokens, child.num_cached_tokens = parent.num_computed_tokens, parent.num_cached_tokens

    def _take_free_block(self, owner: int, op: str = "alloc") -> int:
        block_id, _ = self.free_ids.popitem(last=False)   # least recently freed first
        block = self.blocks[block_id]
        if block.hash is not None:
            del self.hash_to_block[block.hash]
            self.num_evictions += 1
            self._record("evict", block_id, block.hash)
            block.hash, block.token_ids = None, ()
        block.generation += 1   # new contents: blocks computed after the old ones no longer follow it
        block.ref_count = 1
        self._record(op, block_id, owner)
        return block_id

    def commit(self, seq: Sequence) -> None:
        """Hash the blocks that became full, for later requests to reuse."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        if len(seq.block_hashes) < num_full:   # (a decode step seldom fills a block)
            self._extend_hashes(seq, num_full)
        for i in range(num_full - 1, -1, -1):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                break     # everything before an already-hashed block is hashed too
            h = seq.block_hashes[i]
            if h not in self.hash_to_block:   # a duplicate of a cached block stays unhashed
                block.hash, block.token_ids = h, tuple(seq.token_ids[i * bs:(i + 1) * bs])
                block.extra_keys, block.parent = block_extra_keys(seq, i), self._parent(seq.block_table, i)
                self.hash_to_block[h] = block.block_id
                self._record("hash", block.block_id, h)

    def trim(self, seq: Sequence) -> None:
        """Give back blocks past the computed tokens (allocated for drafts that were rejected)."""
        keep = self.blocks_for(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop(), seq.seq_id)

    def free(self, seq: Sequence) -> None:
        """The tail goes into the free list first: a shared prefix outlives the unique suffix."""
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
