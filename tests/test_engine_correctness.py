"""The engine against Hugging Face transformers on small random-weight models, float32 on
CPU: greedy outputs must be token-identical, whatever the block size, prefix-cache hits,
preemption or chunking. The CPU's default attention is the C kernel (cpu_paged); the
readable reference it is tested against (torch) must match transformers too."""
from __future__ import annotations

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams
from pool_checks import check_invariants

FAMILIES = ["qwen3", "qwen2", "llama"]
PROMPT_LENS = [1, 3, 17, 40, 64, 129, 200, 310]
MAX_NEW = 24


def random_prompts(seed: int, lens=PROMPT_LENS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in lens]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    directory = make_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    prompts = random_prompts(7)
    return request.param, directory, prompts, hf_greedy(directory, prompts, MAX_NEW)


def greedy(llm: LLM, prompts, max_new=MAX_NEW):
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    return llm.generate(prompts, params)


def assert_no_leak(llm: LLM):
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    check_invariants(bm, [])


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("block_size", [8, 16])
def test_greedy_matches_transformers(family, block_size, backend):
    _, directory, prompts, reference = family
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=block_size, attention_backend=backend)
    assert llm.engine.plan.attention_backend == ("cpu_paged" if backend == "auto" else backend)
    outs = greedy(llm, prompts)
    for out, ref, prompt in zip(outs, reference, prompts):
        assert out.outputs[0].token_ids == ref, f"prompt of {len(prompt)} tokens diverged"
        assert out.outputs[0].finish_reason == "length"
    assert_no_leak(llm)


def test_chunked_prefill_matches(family):
    _, directory, prompts, reference = family
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=16, max_num_batched_tokens=48)
    steps = []
    engine = llm.engine
    for p in prompts:
        engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))
    seqs = list(engine.scheduler.waiting)
    while engine.has_unfinished():
        out_before = engine.scheduler.num_steps
        engine.step()
        steps.append(out_before)
    assert [s.output_token_ids for s in seqs] == reference
    # the 310-token prompt cannot fit a 48-token budget: it must have been split
    assert len(steps) > MAX_NEW + 310 // 48
    assert_no_leak(llm)


def test_forced_preemption_matches(family):
    _, directory, prompts, reference = family
    # 40 blocks of 16 tokens cannot hold all eight sequences at once (they need ~70)
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=16, num_kv_blocks=40)
    outs = greedy(llm, prompts)
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert sum(o.metrics.num_preemptions for o in outs) > 0, "the small cache should have forced preemption"
    assert_no_leak(llm)


def test_prefix_cache_hits_match(family):
    _, directory, _, _ = family
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, VOCAB - 2, (70,), generator=g).tolist()
    prompts = [shared + torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (1, 9, 30, 100)]
    reference = hf_greedy(directory, prompts + [prompts[2]], MAX_NEW)
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=16)
    first = greedy(llm, prompts[:1])              # fills the cache with the shared prefix
    rest = greedy(llm, prompts[1:] + [prompts[2]])
    outs = first + rest
    assert [o.outputs[0].token_ids for o in outs] == reference
    assert all(o.num_cached_tokens >= 64 for o in rest), [o.num_cached_tokens for o in rest]
    assert_no_leak(llm)


def test_same_prompt_twice_reuses_blocks(family):
    _, directory, prompts, reference = family
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=16)
    first = greedy(llm, [prompts[-1]])[0]
    hits_before = llm.engine.block_manager.num_prefix_hits
    second = greedy(llm, [prompts[-1]])[0]
    assert first.outputs[0].token_ids == second.outputs[0].token_ids == reference[-1]
    # 310 tokens: 19 full blocks, all cached (at least one token is always recomputed)
    assert second.num_cached_tokens == 19 * 16
    assert llm.engine.block_manager.num_prefix_hits - hits_before == 19


def test_first_step_logits_close(family):
    from transformers import AutoModelForCausalLM
    _, directory, prompts, _ = family
    ref_model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    llm = LLM(str(directory), device="cpu", dtype="float32")
    for p in (prompts[1], prompts[5]):
        with torch.no_grad():
            ref = ref_model(torch.tensor([p])).logits[0, -1]
        out = llm.generate([p], SamplingParams(temperature=0.0, max_tokens=1, logprobs=5))[0].outputs[0]
        top = sorted(out.logprobs[0].items(), key=lambda item: item[1].rank)
        ref_logp = ref.log_softmax(-1)
        for token, logprob in top:
            assert abs(ref_logp[token].item() - logprob.logprob) < 1e-4
        assert [t for t, _ in top] == ref_logp.topk(5).indices.tolist()
