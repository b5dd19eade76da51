"""The quantized KV cache on its own: storing into paged slots and reading whole blocks
back stays within each format's rounding bound; sizes per token as vLLM counts them."""
from __future__ import annotations

import pytest
import torch

from kvscope.layers.kv_quant import QuantizedCache, kv_cache_format, store

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
