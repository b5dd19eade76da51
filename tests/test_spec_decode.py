"""Speculative decoding against transformers and against the plain engine: greedy output is
the target's exactly whatever the drafter (n-gram lookup, a draft model), with chunked
prefill, prefix hits and preemption; no block leaks after many rejections; max_tokens and
stop tokens exact; sampled output follows the target's distribution (rejection sampling)."""
from __future__ import annotations

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams
from kvscope.config import SpeculativeConfig
from kvscope.engine.spec_decode import verify
from pool_checks import check_invariants

MAX_NEW = 20


def prompts_mixed() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    rand = [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (3, 40, 90)]
    repetitive = [[7, 8, 9, 10, 11] * 8, [300, 301, 302] * 20]
    return rand + repetitive


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = make_checkpoint("qwen3", tmp_path_factory.mktemp("target"))
    other_draft = make_checkpoint("qwen3", tmp_path_factory.mktemp("draft"), seed=1)
    prompts = prompts_mixed()
    return target, other_draft, prompts, hf_greedy(target, prompts, MAX_NEW)


def engine(target, spec, **kw) -> LLM:
    kw = {"device": "cpu", "dtype": "float32", "block_size": 8, **kw}
    return LLM(str(target), speculative_config=spec, **kw)


def greedy(llm: LLM, prompts, max_new=MAX_NEW, **kw):
    return llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True, **kw))


def assert_no_leak(llm: LLM):
    for bm in (llm.engine.block_manager, getattr(llm.engine.speculator.draft_model, "block_manager", None)):
        if bm is not None:
            check_invariants(bm, [])
            assert bm.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("k", [1, 3, 5])
def test_ngram_greedy_matches_transformers(models, k):
    target, _, prompts, reference = models
    llm = engine(target, {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3})
    outs = greedy(llm, prompts)
    assert [o.outputs[0].token_ids for o in outs] == reference
    stats = llm.engine.speculator.total
    assert stats.proposed > 0 and stats.accepted > 0, "the repetitive prompts should have been drafted"
    assert stats.accepted < stats.proposed, "random weights should also reject some drafts"
    assert_no_leak(llm)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_draft_model_greedy_matches_transformers(models, k):
    target, other_draft, prompts, reference = models
    llm = engine(target, {"model": str(other_draft), "num_speculative_tokens": k})
    assert [o.outputs[0].token_ids for o in greedy(llm, prompts)] == reference
    assert llm.engine.speculator.total.proposed > 0
    assert_no_leak(llm)


def test_self_draft_accepts_everything_and_emits_k_plus_one_per_pass(models):
    target, _, prompts, reference = models
    llm = engine(target, {"model": str(target), "num_speculative_tokens": 4})
    assert [o.outputs[0].token_ids for o in greedy(llm, prompts)] == reference
    stats = llm.engine.speculator.total
    assert stats.accepted == stats.proposed
    assert stats.tokens_per_pass > 4.0
    assert_no_leak(llm)


def test_chunked_prefill_prefix_hits_and_preemption(models):
    target, other_draft, prompts, reference = models
    llm = engine(target, {"method": "ngram", "num_speculative_tokens": 3}, max_num_batched_tokens=24,
                 num_kv_blocks=24)
    first = greedy(llm, prompts[2:3])                   # caches the 90-token prompt's blocks
    outs = greedy(llm, prompts + prompts[2:3])
    assert first[0].outputs[0].token_ids == reference[2]
    assert [o.outputs[0].token_ids for o in outs] == reference + reference[2:3]
    assert outs[-1].num_cached_tokens > 0 or outs[2].num_cached_tokens > 0
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "24 blocks of 8 cannot hold every sequence"
    assert_no_leak(llm)


def test_prefix_cache_never_hashes_a_rejected_draft(models):
    target, other_draft, prompts, _ = models
    llm = engine(target, {"model": str(other_draft), "num_speculative_tokens": 5})
    outs = greedy(llm, prompts)
    bm = llm.engine.block_manager
    sequences = [o.prompt_token_ids + o.outputs[0].token_ids for o in outs]
    for block in bm.blocks:
        if block.hash is None:
            continue
        assert any(_contains_block(s, block.token_ids, bm.block_size) for s in sequences), \
            f"block {block.block_id} hashes tokens no sequence produced"
    assert_no_leak(llm)


def _contains_block(tokens, block_tokens, block_size) -> bool:
    return any(tuple(tokens[i:i + block_size]) == block_tokens for i in range(0, len(tokens), block_size))


def test_max_tokens_and_stop_tokens_exact(models):
    target, _, prompts, reference = models
    llm = engine(target, {"model": str(target), "num_speculative_tokens": 5})   # every draft accepted
    for max_new in (1, 2, 7):
        outs = greedy(llm, prompts, max_new)
        assert [o.outputs[0].token_ids for o in outs] == [r[:max_new] for r in reference]
    stop_at = reference[0][4]
    out = greedy(llm, prompts[:1], stop_token_ids=[stop_at])[0].outputs[0]
    assert out.token_ids == reference[0][:reference[0].index(stop_at) + 1]
    assert out.finish_reason == "stop"
    assert_no_leak(llm)


def test_logprobs_equal_the_plain_engine(models):
    target, _, prompts, _ = models
    plain = greedy(engine(target, None), prompts[3:], logprobs=2)
    spec = greedy(engine(target, {"method": "ngram", "num_speculative_tokens": 3}), prompts[3:], logprobs=2)
    for a, b in zip((o.outputs[0] for o in plain), (o.outputs[0] for o in spec)):
        assert a.token_ids == b.token_ids
        assert [list(x) for x in a.logprobs] == [list(x) for x in b.logprobs]   # the same tokens, in order
        assert [x[t].logprob for x, t in zip(a.logprobs, a.token_ids)] == \
            pytest.approx([x[t].logprob for x, t in zip(b.logprobs, b.token_ids)], abs=1e-4)


def test_each_token_of_a_verified_step_carries_its_own_logprobs(models):
    """A step that accepts drafts appends several tokens; each TokenDelta the step returns
    (what the server streams) reads its own {logprob, top}, not the step's last."""
    target, _, prompts, _ = models
    e = engine(target, {"method": "ngram", "num_speculative_tokens": 3}).engine
    for p in prompts[3:]:
        e.add_request(p, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2))
    multi = 0
    while e.has_unfinished():
        deltas, _ = e.step()
        per_seq = {}
        for d in deltas:
            per_seq[d.seq.seq_id] = per_seq.get(d.seq.seq_id, 0) + 1
            assert d.logprob is d.seq.logprobs[d.index]
            assert d.logprob["top"][0][0] == d.token_id   # greedy: the chosen token is the most likely
        multi += sum(1 for n in per_seq.values() if n > 1)
    assert multi > 0, "the repetitive prompts should have had drafts accepted"


def test_abort_mid_run_frees_both_caches(models):
    target, other_draft, prompts, _ = models
    llm = engine(target, {"model": str(other_draft), "num_speculative_tokens": 3})
    e = llm.engine
    seqs = [e.add_request(p, SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)) for p in prompts]
    for _ in range(6):
        e.step()
    for s in seqs:
        e.abort(s.request_id)
    assert not e.has_unfinished()
    assert_no_leak(llm)


def test_seeded_sampling_is_reproducible(models):
    target, other_draft, prompts, _ = models
    outs = []
    for _ in range(2):
        llm = engine(target, {"model": str(other_draft), "num_speculative_tokens": 3})
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=1.0, seed=5, max_tokens=12,
                                                                                ignore_eos=True))])
    assert outs[0] == outs[1]


def test_config_keys_are_vllms():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5})
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == (4, 5, 1)
    assert SpeculativeConfig.from_dict({"model": "/x", "num_speculative_tokens": 2}).method == "draft_model"
    with pytest.raises(ValueError, match="unknown"):
        SpeculativeConfig.from_dict({"num_speculative_tokens": 2, "lookahead": 3})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.from_dict({"method": "ngram"})


# -- the distribution of sampled output ---------------------------------------------------
def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("drafter", ["model", "one-hot"])
def test_rejection_sampling_follows_the_target(drafter):
    """With a tiny vocabulary, the first emitted token over many draws is distributed as the
    target's p whatever the drafter proposes (chi-square, 3 degrees of freedom: 16.3 is the
    0.1 % critical value)."""
    params = SamplingParams(temperature=1.0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.stack([p.log(), p.log()])           # k = 1: the draft row and the bonus row
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    n = 6000
    for _ in range(n):
        if drafter == "model":
            d = int(torch.multinomial(q, 1, generator=gen))
            verdict = verify(logits, [d], params, gen, q.unsqueeze(0))
        else:
            verdict = verify(logits, [3], params, gen)      # a fixed lookup draft: q is one-hot
        counts[verdict.token_ids[0]] += 1
    assert chi_square(counts, p) < 16.3, counts / n


def test_greedy_verification_takes_the_argmax():
    logits = torch.tensor([[0.0, 5.0, 0.0], [4.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    v = verify(logits, [1, 2], SamplingParams(temperature=0.0), torch.Generator())
    assert v.token_ids == [1, 0] and v.num_accepted == 1 and not v.bonus
    v = verify(logits, [1, 0], SamplingParams(temperature=0.0), torch.Generator())
    assert v.token_ids == [1, 0, 2] and v.bonus


def test_spec_events_are_valid_and_add_up(models):
    from server_harness import check_event
    from kvscope.instrumentation.observer import Instrumentation
    target, _, prompts, _ = models
    llm = engine(target, {"method": "ngram", "num_speculative_tokens": 3})
    events: list[dict] = []
    Instrumentation(llm.engine, events.extend)
    outs = greedy(llm, prompts[3:])
    spec = [e for e in events if e["type"] == "spec"]
    assert spec
    for e in spec:
        check_event(e)
        assert e["token_ids"][:e["accepted"]] == e["proposed"][:e["accepted"]]
        assert e["bonus"] == (e["accepted"] == len(e["proposed"]))
    drafted_steps = [s for e in events if e["type"] == "step" for s in e["seqs"] if s.get("num_drafts")]
    assert len(drafted_steps) == len(spec)
    last = {e["request_id"]: e["running"] for e in spec}
    for out in outs:
        if out.request_id in last:
            assert sum(e["accepted"] for e in spec if e["request_id"] == out.request_id) == last[out.request_id]["accepted"]


def test_a_watched_sampled_request_gets_p_and_q_of_its_deciding_check(models):
    """Chapter 18's <kv-spec-sampling> reads `distribution`: only for the watched request, the
    target's p and the drafter's q at the first rejected draft (else the last check)."""
    from server_harness import check_event
    from kvscope.instrumentation.observer import Instrumentation
    from kvscope.instrumentation.watch import WatchSpec
    target, _, prompts, _ = models
    llm = engine(target, {"method": "ngram", "num_speculative_tokens": 3})
    events: list[dict] = []
    instr = Instrumentation(llm.engine, events.extend)
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True)
    watched, other = (llm.engine.add_request(p, params) for p in prompts[3:5])
    instr.watch(watched.request_id, "test", WatchSpec(layers=frozenset()), watched)
    while llm.engine.has_unfinished():
        llm.engine.step()
    instr.detach()
    spec = [check_event(e) for e in events if e["type"] == "spec"]
    assert {e["request_id"] for e in spec} == {watched.request_id, other.request_id}
    for e in spec:
        d = e.get("distribution")
        assert (d is not None) == (e["request_id"] == watched.request_id)
        if d is None:
            continue
        check = e["checks"][d["check"]]
        assert d["check"] == next((i for i, c in enumerate(e["checks"]) if not c["accepted"]), len(e["checks"]) - 1)
        assert abs(d["p"][d["ids"].index(check["token_id"])] - check["p"]) < 1e-5
        assert d["q"][d["ids"].index(check["token_id"])] == 1.0 and d["q_rest"] == 0   # prompt lookup: q is its draft
        assert abs(sum(d["p"]) + d["p_rest"] - 1) < 1e-4
    assert any(e.get("distribution") for e in spec)


def test_shipped_draft_model_speeds_up_the_embedded_model_losslessly():
    from kvscope.bench.spec import FREE_FORM
    from kvscope.default_model import DEFAULT_DRAFT_NAME, default_draft_path
    import os
    path = default_draft_path()
    assert path is not None
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    assert size <= 5 * 2**20, f"the draft must stay under 5 MB, it is {size / 2**20:.1f} MB"
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain = LLM(None, device="cpu", dtype="float32").generate([FREE_FORM], params)[0].outputs[0]
    llm = LLM(None, device="cpu", dtype="float32",
              speculative_config={"model": DEFAULT_DRAFT_NAME, "num_speculative_tokens": 3})
    spec = llm.generate([FREE_FORM], params)[0].outputs[0]
    assert spec.token_ids == plain.token_ids
    assert llm.engine.speculator.total.acceptance_rate > 0.3
    assert llm.engine.speculator.total.tokens_per_pass > 1.5


def test_stop_strings_cut_where_they_do_without_speculation():
    """Several tokens accepted at once: the stop string still ends the output at the same
    token and character as plain decoding (the embedded model drafting for itself)."""
    from kvscope.bench.spec import FREE_FORM
    params = dict(temperature=0.0, max_tokens=40, ignore_eos=True)
    plain_llm = LLM(None, device="cpu", dtype="float32")
    full = plain_llm.generate([FREE_FORM], SamplingParams(**params))[0].outputs[0]
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 6]
    plain = plain_llm.generate([FREE_FORM], SamplingParams(**params, stop=[stop]))[0].outputs[0]
    draft = {"model": "kvscope-mini-draft", "num_speculative_tokens": 5}
    llm = LLM(None, device="cpu", dtype="float32", speculative_config=draft)
    spec = llm.generate([FREE_FORM], SamplingParams(**params, stop=[stop]))[0].outputs[0]
    assert plain.finish_reason == spec.finish_reason == "stop"
    assert (spec.text, spec.token_ids) == (plain.text, plain.token_ids)
    assert llm.engine.speculator.total.accepted > 0


def test_parallel_sampling_choices_speculate_after_the_fork(models):
    """n choices of one prompt: the parent forks after its prompt (no drafts before), then
    every choice drafts on its own; greedy choices all equal the plain engine's output."""
    target, _, prompts, reference = models
    llm = engine(target, {"model": str(target), "num_speculative_tokens": 3})
    [out] = llm.generate(prompts[3:4], SamplingParams(n=3, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    assert [o.token_ids for o in out.outputs] == [reference[3]] * 3
    assert llm.engine.speculator.total.accepted > 0
    assert_no_leak(llm)
