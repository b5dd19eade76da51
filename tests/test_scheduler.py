"""Scheduling policy without a model: vLLM V1's one rule (running sequences in admission
order, each given what it lacks up to the budget, then waiting ones), the sequence cap,
preemption of the most recently admitted sequence."""
from __future__ import annotations

from kvscope.config import EngineConfig
from kvscope.engine.block_manager import BlockManager
from kvscope.engine.scheduler import Scheduler
from kvscope.engine.sequence import Sequence
from kvscope.sampling_params import SamplingParams
from pool_checks import check_invariants


def running(bm: BlockManager, tokens: int, computed: int) -> Sequence:
    seq = Sequence(list(range(tokens)), SamplingParams(max_tokens=50))
    bm.allocate(seq, [], computed)
    seq.num_computed_tokens = computed
    return seq


def scheduler(budget: int, blocks: int = 64, max_seqs: int = 8) -> Scheduler:
    cfg = EngineConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, block_size=4)
    return Scheduler(cfg, BlockManager(blocks, 4), max_model_len=512, eos_token_ids=set())


def test_running_sequences_are_served_in_admission_order_up_to_the_budget():
    sch = scheduler(budget=5)
    long_prompt = running(sch.block_manager, tokens=40, computed=8)   # admitted first, mid-prefill
    decoding = running(sch.block_manager, tokens=4, computed=3)       # one token to compute
    sch.running = [long_prompt, decoding]
    out = sch.schedule()
    # V1: no decode-first sort; the earlier prompt takes what the budget allows
    assert [(e.seq, e.num_new_tokens) for e in out.entries] == [(long_prompt, 5)]
    assert sch.running == [long_prompt, decoding]   # the decode waits a step, it is not dropped
    sch = scheduler(budget=40)
    long_prompt = running(sch.block_manager, tokens=40, computed=8)
    decoding = running(sch.block_manager, tokens=4, computed=3)
    sch.running = [long_prompt, decoding]
    out = sch.schedule()
    assert [(e.seq, e.num_new_tokens) for e in out.entries] == [(long_prompt, 32), (decoding, 1)]
    assert out.entries[0].samples and out.entries[1].samples   # the prompt ends here: both draw


V1_TABLE = [
    # budget, [(tokens, computed, drafts, running?)], expected tokens per row, in order
    (16, [(4, 3, 0, True), (9, 8, 2, True), (30, 0, 0, False), (7, 0, 0, False)], [1, 3, 12]),
    (64, [(4, 3, 0, True), (9, 8, 2, True), (30, 0, 0, False), (7, 0, 0, False)], [1, 3, 30, 7]),
    (8, [(30, 10, 0, True), (4, 3, 0, True), (7, 0, 0, False)], [8]),
    (3, [(4, 3, 0, True), (4, 3, 0, True), (4, 3, 0, True), (4, 3, 0, True)], [1, 1, 1]),
]


def test_the_v1_rule_step_by_step():
    """A table of requests and budgets: each row gets min(what it lacks, what is left)."""
    for budget, requests, expected in V1_TABLE:
        sch = scheduler(budget=budget)
        rows = []
        for tokens, computed, drafts, is_running in requests:
            if is_running:
                seq = running(sch.block_manager, tokens, computed)
                seq.spec_token_ids = list(range(drafts))
                sch.running.append(seq)
            else:
                seq = Sequence(list(range(tokens)), SamplingParams(max_tokens=4))
                sch.add(seq)
            rows.append(seq)
        out = sch.schedule()
        assert [e.num_new_tokens for e in out.entries] == expected, (budget, requests)
        assert out.num_batched_tokens <= budget
        assert [e.seq for e in out.entries] == rows[:len(expected)]


def test_waiting_prompts_are_chunked_to_the_budget_and_capped_in_number():
    sch = scheduler(budget=10, max_seqs=2)
    seqs = [Sequence(list(range(n)), SamplingParams(max_tokens=4)) for n in (6, 30, 3)]
    for s in seqs:
        sch.add(s)
    out = sch.schedule()
    assert [(e.seq, e.num_new_tokens) for e in out.entries] == [(seqs[0], 6), (seqs[1], 4)]
    assert list(sch.waiting) == [seqs[2]]          # the cap of two sequences holds the third back


def test_out_of_blocks_preempts_the_most_recently_admitted():
    sch = scheduler(budget=64, blocks=4)
    first = running(sch.block_manager, tokens=9, computed=8)    # 2 blocks, needs a 3rd for token 9
    second = running(sch.block_manager, tokens=5, computed=4)   # 1 block, needs a 2nd
    sch.running = [first, second]
    out = sch.schedule()
    assert out.preempted == [second]
    assert [e.seq for e in out.entries] == [first]
    assert second not in sch.running and sch.waiting[0] is second
    assert second.block_table == [] and second.num_computed_tokens == 0
    check_invariants(sch.block_manager, [first])


def test_the_scheduler_decides_each_rows_kind_once():
    """decode: the one newest token; verify: the newest token and drafts; prefill: prompt
    tokens, even a single one that does not reach the end (a budget cut)."""
    sch = scheduler(budget=4)
    decoding = running(sch.block_manager, tokens=4, computed=3)
    drafting = running(sch.block_manager, tokens=8, computed=7)
    drafting.spec_token_ids = [1, 2]
    prompt = running(sch.block_manager, tokens=40, computed=8)
    sch.running = [decoding, drafting, prompt]
    kinds = {e.seq.seq_id: (e.kind, e.num_new_tokens, e.samples) for e in sch.schedule().entries}
    assert kinds[decoding.seq_id] == ("decode", 1, True)
    assert kinds[drafting.seq_id] == ("verify", 3, True)
    assert prompt.seq_id not in kinds   # the budget (4) went to the decode and the verify pass
    sch = scheduler(budget=1)
    chunked = running(sch.block_manager, tokens=10, computed=4)
    sch.running = [chunked]
    (entry,) = sch.schedule().entries
    assert (entry.kind, entry.num_new_tokens, entry.samples) == ("prefill", 1, False)
