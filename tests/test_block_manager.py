"""The page allocator on its own, no model: allocation, prefix hits, ref counts, freeing,
eviction order, and no leak after an abort."""
from __future__ import annotations

import pytest

from kvscope.engine.block_manager import BlockManager
from kvscope.engine.sequence import Sequence
from kvscope.sampling_params import SamplingParams
from pool_checks import check_invariants

BS = 4


def seq_of(tokens) -> Sequence:
    return Sequence(list(tokens), SamplingParams(max_tokens=8))


def admit(bm: BlockManager, seq: Sequence) -> list[int]:
    """Allocate the whole prompt (what the scheduler does with an ample budget) and mark it computed."""
    hits = bm.match_prefix(seq)
    assert bm.can_allocate(hits, seq.num_tokens)
    bm.allocate(seq, hits, seq.num_tokens - len(hits) * BS)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit(seq)
    return hits


def test_allocate_uses_ceil_blocks_and_free_returns_them():
    bm = BlockManager(10, BS)
    s = seq_of(range(9))                     # 9 tokens -> 3 blocks
    admit(bm, s)
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7
    assert all(bm.blocks[b].ref_count == 1 for b in s.block_table)
    check_invariants(bm, [s])
    bm.free(s)
    assert bm.num_free_blocks == 10
    check_invariants(bm, [])


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(16, BS)
    a = seq_of(list(range(8)) + [100, 101, 102])     # two full shared blocks + a tail
    b = seq_of(list(range(8)) + [200, 201, 202, 203, 204])
    admit(bm, a)
    hits = admit(bm, b)
    assert hits == a.block_table[:2]
    assert b.num_cached_tokens == 8
    assert [bm.blocks[x].ref_count for x in hits] == [2, 2]
    assert b.block_table[2] != a.block_table[2]
    check_invariants(bm, [a, b])
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in hits] == [1, 1]
    bm.free(b)
    check_invariants(bm, [])


def test_a_different_first_block_breaks_the_chain():
    bm = BlockManager(16, BS)
    a = seq_of(list(range(12)) + [1])
    admit(bm, a)
    b = seq_of([99] + list(range(1, 12)) + [1])      # same second/third blocks, other first block
    assert bm.match_prefix(b) == []


def test_whole_prompt_cached_still_leaves_one_token_to_compute():
    bm = BlockManager(16, BS)
    a = seq_of(range(8))
    admit(bm, a)
    b = seq_of(range(8))
    hits = bm.match_prefix(b)
    assert len(hits) == 1                    # the last block is recomputed for its logits


def test_freed_blocks_stay_cached_until_reused_then_lru_evicts():
    bm = BlockManager(4, BS)
    a = seq_of(range(8))                     # 2 blocks
    admit(bm, a)
    a_blocks = list(a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 4
    again = seq_of(list(range(8)) + [5])     # cached blocks come back without recompute
    assert bm.match_prefix(again) == a_blocks
    # filling the pool with something else evicts: least recently freed go first
    c = seq_of(range(50, 58))                # 2 blocks, taken from the never-used blocks first
    admit(bm, c)
    assert set(c.block_table).isdisjoint(a_blocks)
    assert bm.match_prefix(again) == a_blocks
    d = seq_of(range(70, 74))                # 1 block: must evict one of a's blocks
    admit(bm, d)
    assert bm.num_evictions == 1
    # a's tail block was freed first (free order is tail first), so it was evicted first
    assert d.block_table == [a_blocks[1]]
    assert bm.match_prefix(again) == a_blocks[:1]


def test_reset_prefix_cache_forgets_free_blocks_and_keeps_blocks_in_use():
    bm = BlockManager(16, BS)
    done, running = seq_of(range(9)), seq_of(range(100, 109))
    admit(bm, done)
    admit(bm, running)
    bm.free(done)
    bm.reset_prefix_cache()
    again, twin = seq_of(range(9)), seq_of(range(100, 109))
    assert admit(bm, again) == []                            # computed again
    assert admit(bm, twin) == running.block_table[:2]        # still shared
    check_invariants(bm, [running, again, twin])


def test_out_of_blocks_is_refused_not_overcommitted():
    bm = BlockManager(2, BS)
    assert not bm.can_allocate([], 12)       # 3 blocks wanted, 2 exist
    t = seq_of(range(4))
    admit(bm, t)
    t.token_ids += [1, 2, 3, 4]
    assert bm.can_append(t, 4)
    bm.append_slots(t, 4)
    t.num_computed_tokens = 8
    assert bm.num_free_blocks == 0
    assert not bm.can_append(t, 1)
    with pytest.raises(RuntimeError):
        bm.append_slots(t, 1)


def test_double_free_is_caught():
    bm = BlockManager(4, BS)
    s = seq_of(range(4))
    admit(bm, s)
    table = list(s.block_table)
    bm.free(s)
    s.block_table = table
    with pytest.raises(AssertionError):
        bm.free(s)


def test_events_are_recorded_only_when_asked():
    bm = BlockManager(8, BS)
    admit(bm, seq_of(range(5)))
    assert bm.events is None
    bm.events = []
    s = seq_of(range(5))
    admit(bm, s)
    kinds = [e[0] for e in bm.events]
    assert kinds == ["hit", "alloc"]
    bm.events.clear()
    tail = s.block_table[1]
    bm.free(s)
    # the hit block is still held by the first sequence: only the fresh tail block is freed
    assert bm.events == [("free", tail, s.seq_id)]


def test_no_leak_after_abort_mid_generation(tmp_path):
    from hf_models import make_checkpoint
    from kvscope import LLM, SamplingParams as SP
    llm = LLM(str(make_checkpoint("qwen3", tmp_path / "m")), device="cpu", block_size=4, num_kv_blocks=64)
    engine = llm.engine
    seqs = [engine.add_request(list(range(1, 20 + i)), SP(temperature=0, max_tokens=50, ignore_eos=True))
            for i in range(4)]
    for _ in range(5):
        engine.step()
    assert engine.block_manager.num_free_blocks < 64
    for s in seqs[:3]:
        assert engine.abort(s.request_id)
    while engine.has_unfinished():
        engine.step()
    assert [s.finish_reason for s in seqs] == ["abort", "abort", "abort", "length"]
    assert engine.block_manager.num_free_blocks == 64
    check_invariants(engine.block_manager, [])
