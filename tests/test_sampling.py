"""Sampling: seeds reproduce, filters never pick outside their set, temperature 0 is argmax."""
from __future__ import annotations

import pytest
import torch

from kvscope.engine.sampler import apply_min_p, apply_top_k, apply_top_p, row_argmax, sample
from kvscope.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from hf_models import make_checkpoint
    from kvscope import LLM
    return LLM(str(make_checkpoint("qwen3", tmp_path_factory.mktemp("s"))), device="cpu")


def draw(logits, params, n=400, seed=0):
    return sample(logits.expand(n, -1).clone(), [params] * n, [None] * n, torch.Generator().manual_seed(seed))


def test_temperature_zero_is_argmax():
    logits = torch.randn(5, 50)
    assert torch.equal(sample(logits, [SamplingParams(temperature=0.0)] * 5, [None] * 5, torch.Generator()),
                       logits.argmax(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_argmax_matches_torch_and_takes_the_first_of_ties(dtype):
    logits = torch.randn(64, 2048).to(dtype)
    logits[3, [7, 900]] = 50.0          # a tie: the first index wins, as in torch
    logits[5, -1] = float("inf")
    got = row_argmax(logits)
    assert got.dtype == torch.int64 and torch.equal(got, logits.argmax(dim=1))
    assert got[3] == 7 and got[5] == 2047
    assert torch.equal(row_argmax(logits[:, ::2]), logits[:, ::2].argmax(dim=1))   # a strided view


def test_top_k_never_leaves_the_k_most_likely():
    logits = torch.randn(1, 100)
    allowed = set(logits[0].topk(5).indices.tolist())
    tokens = draw(logits, SamplingParams(temperature=1.5, top_k=5))
    assert set(tokens.tolist()) <= allowed
    assert len(set(tokens.tolist())) > 1          # it does sample, not just argmax


def test_top_p_never_leaves_the_nucleus():
    logits = torch.tensor([[3.0, 2.5, 2.0, 0.0, -1.0, -2.0, -3.0]])
    probs = logits.softmax(-1)[0]
    # nucleus for 0.8: smallest prefix of the sorted tokens with mass >= 0.8
    order = probs.argsort(descending=True).tolist()
    mass, nucleus = 0.0, set()
    for t in order:
        nucleus.add(t)
        mass += probs[t].item()
        if mass >= 0.8:
            break
    tokens = draw(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert set(tokens.tolist()) <= nucleus
    assert set(tokens.tolist()) == nucleus        # 400 draws hit every member


def test_min_p_drops_tokens_below_the_threshold():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = apply_min_p(logits.clone(), torch.tensor([0.2]))     # threshold 0.1
    assert torch.isinf(kept[0, 3]) and not torch.isinf(kept[0, :3]).any()
    tokens = draw(logits, SamplingParams(temperature=1.0, min_p=0.2))
    assert 3 not in tokens.tolist()


def test_filters_keep_at_least_one_token():
    logits = torch.randn(3, 20)
    assert (~torch.isinf(apply_top_p(logits, torch.tensor([1e-9] * 3)))).sum(1).min() == 1
    assert (~torch.isinf(apply_top_k(logits, torch.tensor([1, 0, 3])))).sum(1).tolist() == [1, 20, 3]


def test_same_seed_same_output_whatever_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=20, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], params)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True) for _ in range(3)]
    batched = llm.generate([[1, 2], [5, 6, 7], [9] * 30, [3]], [others[0], params, others[1], others[2]])
    assert batched[1].outputs[0].token_ids == alone
    different = llm.generate([[5, 6, 7]], SamplingParams(temperature=1.0, top_p=0.95, seed=99,
                                                         max_tokens=20, ignore_eos=True))[0].outputs[0]
    assert different.token_ids != alone


def test_stop_token_ids_stop_strings_and_max_tokens(llm):
    greedy = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    assert len(greedy.token_ids) == 12 and greedy.finish_reason == "length"
    stop_at = greedy.token_ids[4]
    first = greedy.token_ids.index(stop_at)
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True,
                                                   stop_token_ids=[stop_at]))[0].outputs[0]
    assert out.token_ids == greedy.token_ids[:first + 1] and out.finish_reason == "stop"
    assert out.stop_reason == stop_at and greedy.stop_reason is None


def test_logprobs_are_reported(llm):
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3, logprobs=3))[0].outputs[0]
    assert len(out.logprobs) == 3
    for position, tok in zip(out.logprobs, out.token_ids):   # vLLM's shape: {token_id: Logprob}
        assert list(position)[0] == tok and position[tok].rank == 1 and len(position) == 3
        assert sorted(lp.rank for lp in position.values()) == [1, 2, 3]
        assert position[tok].logprob <= 0
    assert out.cumulative_logprob == pytest.approx(sum(p[t].logprob for p, t in zip(out.logprobs, out.token_ids)))


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=2),
                                 dict(max_tokens=0), dict(logprobs=50), dict(stop=[""])])
def test_bad_params_are_rejected_with_a_message(bad):
    with pytest.raises(ValueError) as err:
        SamplingParams(**bad)
    assert str(err.value)
