"""Parallel sampling (SamplingParams.n): the prompt is computed once, the choices share its
blocks, the partial last block is copied when a choice first writes to it, each choice
equals a separate request seeded seed + i, and aborting some choices leaks nothing."""
from __future__ import annotations

import pytest

from kvscope.engine.block_manager import BlockManager
from kvscope.engine.sequence import Sequence
from kvscope.sampling_params import SamplingParams
from pool_checks import check_invariants

BS = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from hf_models import make_checkpoint
    return str(make_checkpoint("qwen3", tmp_path_factory.mktemp("n")))


def make_llm(checkpoint, **kw):
    from kvscope import LLM
    return LLM(checkpoint, device="cpu", dtype="float32", block_size=BS, enable_prefix_caching=False, **kw)


def params(**kw):
    return SamplingParams(**{"temperature": 1.0, "seed": 7, "max_tokens": 6, "ignore_eos": True, **kw})


PROMPT = list(range(10, 20))   # 10 tokens: two full blocks and a partial one of 2 tokens


def test_block_manager_fork_shares_then_copies_on_first_write():
    bm = BlockManager(10, BS)
    parent, child = Sequence(PROMPT, params()), Sequence(PROMPT, params())
    bm.allocate(parent, [], len(PROMPT))
    parent.num_computed_tokens = len(PROMPT)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2, 2]
    check_invariants(bm, [parent, child])
    bm.append_slots(child, 1)                  # the child writes position 10: copy block 2
    assert child.block_table[:2] == parent.block_table[:2]
    assert child.block_table[2] != parent.block_table[2]
    assert bm.take_copies() == [(parent.block_table[2], child.block_table[2])]
    bm.append_slots(parent, 1)                 # the last holder writes in place
    assert bm.take_copies() == []
    assert [bm.blocks[b].ref_count for b in parent.block_table] == [2, 2, 1]
    check_invariants(bm, [parent, child])


@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:8], PROMPT[:1]], ids=["partial", "aligned", "one-token"])
def test_each_choice_equals_a_separate_request_seeded_seed_plus_i(checkpoint, prompt):
    [request] = make_llm(checkpoint).generate([prompt], params(n=4))   # one output per prompt, as vLLM
    together = request.outputs
    assert [o.index for o in together] == [0, 1, 2, 3] and request.finished
    alone = make_llm(checkpoint)
    separate = [alone.generate([prompt], params(seed=7 + i))[0].outputs[0] for i in range(4)]
    assert [o.token_ids for o in together] == [o.token_ids for o in separate]
    assert len({tuple(o.token_ids) for o in together}) > 1     # they are different samples


def test_prompt_computed_once_and_held_once_with_ref_count_n(checkpoint):
    llm = make_llm(checkpoint)
    engine = llm.engine
    parent = engine.add_request(PROMPT, params(n=4, max_tokens=4))
    computed = 0
    while not parent.output_token_ids:
        engine.step()
    # one step computed the whole prompt; every choice now holds the same three blocks
    choices = [parent, *[s for s in engine.scheduler.running if s is not parent]]
    assert len(choices) == 4
    assert all(c.block_table == parent.block_table for c in choices)
    assert [engine.block_manager.blocks[b].ref_count for b in parent.block_table] == [4, 4, 4]
    assert engine.block_manager.num_used_blocks == 3
    out = engine.scheduler.schedule()          # first decode: 3 copies of the partial block
    assert len(out.block_copies) == 3
    computed += out.num_batched_tokens
    assert computed == 4                       # one decode token per choice, no prompt recomputed
    engine.runner.run(out, engine.generators)
    check_invariants(engine.block_manager, engine.scheduler.running)


def test_aborting_some_choices_leaks_nothing(checkpoint):
    llm = make_llm(checkpoint)
    engine = llm.engine
    parent = engine.add_request(PROMPT, params(n=4, max_tokens=5), request_id="r")
    pending = engine.add_request(PROMPT, params(n=3, max_tokens=5), request_id="p")
    assert engine.abort("p-2")                 # a choice not forked yet
    engine.step()
    engine.step()
    assert engine.abort("r-1") and engine.abort("r")     # one child and the parent
    check_invariants(engine.block_manager, engine.scheduler.running)
    while engine.has_unfinished():
        engine.step()
    assert parent.finish_reason == "abort" and pending.finish_reason == "length"
    assert pending.forks == [] and engine.block_manager.num_used_blocks == 0
    check_invariants(engine.block_manager, [])


def test_abort_before_prefill_ends_every_choice(checkpoint):
    llm = make_llm(checkpoint)
    engine = llm.engine
    parent = engine.add_request(PROMPT, params(n=3))
    children = list(parent.forks)
    assert engine.abort(parent.request_id)
    assert all(c.finish_reason == "abort" for c in (parent, *children))
    assert not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0


def test_choices_survive_preemption_unchanged(checkpoint):
    """A pool too small for four growing choices: some are preempted and recomputed, and
    each still equals its separate request (recomputing draws no extra random numbers)."""
    tight = make_llm(checkpoint, num_kv_blocks=12)
    [request] = tight.generate([PROMPT], params(n=4, max_tokens=14))
    assert request.metrics.num_preemptions > 0
    together = request.outputs
    alone = make_llm(checkpoint)
    separate = [alone.generate([PROMPT], params(seed=7 + i, max_tokens=14))[0].outputs[0] for i in range(4)]
    assert [o.token_ids for o in together] == [o.token_ids for o in separate]
    check_invariants(tight.engine.block_manager, [])
