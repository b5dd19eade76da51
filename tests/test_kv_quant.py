"""The quantized KV cache on its own: storing into paged slots and reading whole blocks
back stays within each format's rounding bound; sizes per token as vLLM counts them."""
from __future__ import annotations

import pytest
import torch

from kvscope.layers.attention import QuantizedCache, kv_cache_format, store

KVH, D, BS, BLOCKS = 2, 16, 4, 6


def roundtrip(name: str, x: torch.Tensor) -> torch.Tensor:
    fmt = kv_cache_format(name, torch.float32)
    cache = torch.zeros(BLOCKS, BS, KVH, D, dtype=fmt.dtype)
    scales = torch.zeros(BLOCKS, BS, KVH) if fmt.per_token_head else None
    slots = torch.arange(4, 4 + x.shape[0])            # blocks 1.. onward
    store(cache, scales, slots, x, fmt)
    blocks = torch.tensor([1, 2])
    read = QuantizedCache(cache, scales, fmt, 1.0).index_select(0, blocks) if fmt.quantized \
        else cache.index_select(0, blocks)
    return read.view(-1, KVH, D)[:x.shape[0]]


@pytest.mark.parametrize("name, relative_bound", [
    ("int8_per_token_head", 0.5 / 127),   # half a step of the token-head's own scale
    ("fp8_e4m3", 2 ** -4),                # 3 mantissa bits: half an ulp is 1/16 of the value
    ("fp8", 2 ** -4),
    ("fp8_e5m2", 2 ** -3),                # 2 mantissa bits
])
def test_roundtrip_error_within_the_format_bound(name, relative_bound):
    torch.manual_seed(0)
    x = torch.randn(8, KVH, D) * 3
    x[2, 1] *= 40                          # an outlier token-head
    got = roundtrip(name, x)
    if name == "int8_per_token_head":
        bound = x.abs().amax(dim=-1, keepdim=True) * relative_bound * 1.0001
    else:
        bound = x.abs() * relative_bound + 2 ** -9   # subnormals near zero
    assert (got - x).abs().le(bound).all()
    assert not torch.equal(got, x)         # it really was quantized


def test_auto_is_exact():
    x = torch.randn(8, KVH, D)
    assert torch.equal(roundtrip("auto", x), x)


def test_fp8_saturates_instead_of_overflowing():
    x = torch.full((1, KVH, D), 1e6)
    assert torch.isfinite(roundtrip("fp8", x)).all()


def test_bytes_per_token():
    bf16 = kv_cache_format("auto", torch.bfloat16).bytes_per_token(28, 8, 128)
    assert bf16 == 114688                                 # Qwen3-0.6B: 112 KiB per token
    assert kv_cache_format("fp8", torch.bfloat16).bytes_per_token(28, 8, 128) == bf16 // 2
    int8 = kv_cache_format("int8_per_token_head", torch.bfloat16).bytes_per_token(28, 8, 128)
    assert int8 == 2 * 28 * (8 * 128 + 8 * 4)             # values + one float32 scale per head
    assert bf16 / int8 >= 1.8


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_cache_format("int4", torch.float32)


# -- in the engine: logits against the unquantized cache, blocks gained ------------------

FAMILIES = ["qwen3", "llama"]
BOUNDS = {"int8_per_token_head": 0.05, "fp8": 0.25, "fp8_e5m2": 0.5}   # max |logit error|, random weights


def step_logits(directory, kv_cache_dtype: str, prompts, max_new: int):
    """Greedy run; the logits of every sampled row, per request, captured at the LM head."""
    from kvscope import LLM, SamplingParams
    seen = []
    with LLM(str(directory), kv_cache_dtype=kv_cache_dtype, attention_backend="torch", enforce_eager=True,
             num_gpu_blocks_override=64, block_size=16) as llm:
        hook = llm.engine.model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.float().clone()))
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True))
        hook.remove()
        blocks = llm.engine.block_manager.num_blocks
    return [o.outputs[0].token_ids for o in outs], seen, blocks


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    from hf_models import VOCAB, make_checkpoint
    directory = make_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (5, 23, 40)]
    return directory, prompts


@pytest.mark.parametrize("kv_cache_dtype", list(BOUNDS))
def test_quantized_cache_logits_stay_within_bound(checkpoint, kv_cache_dtype):
    directory, prompts = checkpoint
    worst, agree, total = 0.0, 0, 0
    for prompt in prompts:   # one at a time, so step i's logits are the ones that chose token i
        (ref_tokens,), ref_logits, _ = step_logits(directory, "auto", [prompt], 24)
        (tokens,), logits, _ = step_logits(directory, kv_cache_dtype, [prompt], 24)
        same = next((i for i, (a, b) in enumerate(zip(ref_tokens, tokens)) if a != b), len(tokens))
        # up to the first token that differs both runs saw the same context (a near-tie can flip)
        for ref, got in list(zip(ref_logits, logits))[:same + 1]:
            worst = max(worst, (ref - got).abs().max().item())
        agree, total = agree + same, total + len(ref_tokens)
    assert 0 < worst <= BOUNDS[kv_cache_dtype], worst
    if kv_cache_dtype == "int8_per_token_head":   # the 8-bit float formats flip more near-ties
        assert agree >= 0.8 * total, (agree, total)


def test_blocks_grow_with_the_bytes_saved(checkpoint):
    from kvscope import LLM
    directory, _ = checkpoint
    counts = {}
    for name in ("auto", "fp8", "int8_per_token_head"):
        with LLM(str(directory), kv_cache_dtype=name, kv_cache_memory_bytes=4 << 20, enforce_eager=True) as llm:
            counts[name] = llm.engine.block_manager.num_blocks
            per_block = llm.engine.runner.kv_cache_bytes / (counts[name] + 1)   # + the scratch block
            assert counts[name] * per_block <= 4 << 20
    assert counts["fp8"] >= 3.9 * counts["auto"]                 # float32 -> 8 bits
    assert counts["int8_per_token_head"] >= 1.8 * counts["auto"]


def test_a_kernel_that_cannot_read_a_quantized_cache_is_refused_by_name(checkpoint):
    from kvscope import LLM
    directory, _ = checkpoint
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(str(directory), kv_cache_dtype="fp8", attention_backend="cpu_paged", enforce_eager=True)
