"""Prefix-cache hashing as vLLM does it: a cryptographic chained hash of (parent hash,
block tokens, extra keys), cache_salt isolating tenants, an identity check that survives
forced collisions, whole last block recomputed, and the counters in tokens."""
from __future__ import annotations

import hashlib

import pytest

from kvscope.engine import block_manager as bm_module
from kvscope.engine.block_manager import BlockManager, hash_block_tokens
from kvscope.engine.sequence import Sequence
from kvscope.instrumentation.observer import row_reason
from kvscope.sampling_params import SamplingParams

BS = 4


def seq_of(tokens, salt=None, preemptions=0) -> Sequence:
    seq = Sequence(list(tokens), SamplingParams(max_tokens=8))
    seq.cache_salt, seq.num_preemptions = salt, preemptions
    return seq


def admit(bm: BlockManager, seq: Sequence) -> list[int]:
    hits = bm.match_prefix(seq)
    bm.allocate(seq, hits, seq.num_tokens - len(hits) * BS)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)
    return hits


def test_the_hash_is_sha256_of_parent_tokens_and_extra_keys():
    first = hash_block_tokens(bm_module.HASH_FUNCTIONS["sha256"], None, [1, 2, 3, 4])
    second = hash_block_tokens(bm_module.HASH_FUNCTIONS["sha256"], first, [5, 6, 7, 8], ("salt",))
    assert len(first) == 32 and first != second
    assert second == hashlib.sha256(first + bytes.fromhex("05000000060000000700000008000000")
                                    + repr(("salt",)).encode()).digest()
    # the parent is part of the hash: the same tokens after another block hash differently
    assert hash_block_tokens(bm_module.HASH_FUNCTIONS["sha256"], second, [5, 6, 7, 8]) != second


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_equal_salts_share_blocks_and_different_salts_never_do(algo):
    bm = BlockManager(32, BS, prefix_caching_hash_algo=algo)
    prompt = list(range(13))                  # 3 full blocks + 1 token
    assert admit(bm, seq_of(prompt, salt="tenant-a")) == []
    assert len(admit(bm, seq_of(prompt, salt="tenant-a"))) == 3
    assert admit(bm, seq_of(prompt, salt="tenant-b")) == []
    assert admit(bm, seq_of(prompt)) == []    # no salt is a salt of its own
    assert len(admit(bm, seq_of(prompt))) == 3


def test_unknown_hash_algo_is_a_clear_error():
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        BlockManager(4, BS, prefix_caching_hash_algo="md5")


def weak_hash(data: bytes) -> bytes:
    """A hash that ignores the parent digest: blocks with equal tokens collide whatever
    came before them (what a collision in the parent chain would look like)."""
    parent_size = 32
    return hashlib.sha256(data[parent_size:]).digest()


def test_a_forced_collision_in_the_parent_chain_does_not_reuse_a_wrong_block(monkeypatch):
    monkeypatch.setitem(bm_module.HASH_FUNCTIONS, "sha256", weak_hash)
    bm = BlockManager(32, BS)
    shared_tail = [7, 7, 7, 7]
    a = seq_of([1, 1, 1, 1, *shared_tail, 9])       # A: block x then the tail
    c = seq_of([2, 2, 2, 2, 5, 5, 5, 5, 9])         # C: caches block y
    admit(bm, a)
    admit(bm, c)
    b = seq_of([2, 2, 2, 2, *shared_tail, 9])       # B: block y then the same tail as A
    assert b.block_hashes == [] and bm.match_prefix(b) != []
    # the tail's hash equals A's (the weak hash ignores the parent), but A's tail block
    # was computed after x, not y: only B's first block may be reused
    assert b.block_hashes[1] == a.block_hashes[1]
    assert bm.match_prefix(b) == [c.block_table[0]]


def test_a_block_reused_for_new_contents_is_no_longer_a_parent():
    bm = BlockManager(3, BS)
    first = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9])     # 3 blocks: the whole pool
    admit(bm, first)
    bm.free(first)
    other = seq_of([4, 4, 4, 4, 4])                 # takes the least recently freed blocks
    admit(bm, other)
    bm.free(other)
    again = seq_of([1, 2, 3, 4, 5, 6, 7, 8, 9])
    hits = bm.match_prefix(again)
    for i, block_id in enumerate(hits):
        assert bm.blocks[block_id].token_ids == tuple(again.token_ids[i * BS:(i + 1) * BS])


def test_a_prompt_of_whole_blocks_recomputes_its_last_block():
    bm = BlockManager(16, BS)
    prompt = list(range(12))                        # exactly 3 blocks
    admit(bm, seq_of(prompt))
    second = seq_of(prompt)
    assert len(admit(bm, second)) == 2              # the last block is computed again, whole
    assert second.num_cached_tokens == 8


def test_counters_are_in_tokens_and_preemption_is_counted_apart():
    bm = BlockManager(32, BS)
    prompt = list(range(10))
    admit(bm, seq_of(prompt))
    admit(bm, seq_of(prompt))
    admit(bm, seq_of(prompt, preemptions=1))
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (20, 8)
    assert (bm.preempted_queries, bm.preempted_hits) == (10, 8)


def test_a_whole_cached_last_block_is_flagged_as_recomputed():
    bm = BlockManager(16, BS)
    prompt = list(range(12))
    admit(bm, seq_of(prompt))
    again = seq_of(prompt)
    admit(bm, again)
    assert again.last_block_recomputed
    partial = seq_of(list(range(10)))               # not a whole number of blocks
    admit(bm, partial)
    assert not partial.last_block_recomputed


def test_step_rows_say_why_they_were_scheduled():
    from kvscope import LLM, SamplingParams
    from kvscope.engine.llm_engine import EngineObserver

    class Rows(EngineObserver):
        def __init__(self):
            self.rows = []

        def on_step(self, record):
            self.rows += [(e.seq.request_id, row_reason(e), e.num_new_tokens, e.admitted and e.seq.last_block_recomputed)
                          for e in record.scheduled.entries]

    with LLM(block_size=16, enforce_eager=True) as llm:
        rows = Rows()
        llm.engine.add_observer(rows)
        prompt = list(range(100, 132))                  # exactly two blocks
        llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0))
        llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0))
    reasons = [(reason, n, flag) for _, reason, n, flag in rows.rows]
    assert reasons[0] == ("new request", 32, False)
    assert ("decode", 1, False) in reasons
    assert ("new request", 16, True) in reasons         # the second: one block hit, the last recomputed
