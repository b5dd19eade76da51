"""A quantized KV cache: K and V stored in 8 bits, dequantized when attention reads them.

vLLM's `kv_cache_dtype` values:
- `auto`: the model's own dtype, nothing quantized.
- `fp8` (= `fp8_e4m3`) and `fp8_e5m2`: each element cast to an 8-bit float after dividing
  by one scale per layer for K and one for V (per-tensor; 1.0 unless a checkpoint or a
  calibration says otherwise, as in vLLM). e4m3 keeps more precision, e5m2 more range.
- `int8_per_token_head`: each token's vector in each KV head gets its own float32 scale
  (its largest magnitude / 127), so one outlier token costs precision only to itself.

The cache keeps its paged shape [num_blocks, block_size, KVH, D]; the per-token-head scales
live beside it as [num_blocks, block_size, KVH]. Reading goes through QuantizedCache, which
gathers whole blocks like a plain tensor and hands back dequantized values, so the
PyTorch reference attention runs on it unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head")
_STORAGE = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
            "int8_per_token_head": torch.int8}
SCALE_DTYPE = torch.float32


@dataclass(frozen=True)
class KVCacheFormat:
    name: str                 # vLLM's kv_cache_dtype
    dtype: torch.dtype        # what one cached element is stored as
    compute_dtype: torch.dtype   # what attention reads it back as

    @property
    def quantized(self) -> bool:
        return self.name != "auto"

    @property
    def per_token_head(self) -> bool:
        return self.name == "int8_per_token_head"

    def bytes_per_token(self, num_layers: int, num_kv_heads: int, head_dim: int) -> int:
        """K and V of one token across all layers, scales included."""
        element = torch.empty((), dtype=self.dtype).element_size()
        scales = num_kv_heads * torch.empty((), dtype=SCALE_DTYPE).element_size() if self.per_token_head else 0
        return 2 * num_layers * (num_kv_heads * head_dim * element + scales)


def kv_cache_format(name: str, model_dtype: torch.dtype) -> KVCacheFormat:
    if name not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {name!r}")
    return KVCacheFormat(name, _STORAGE.get(name, model_dtype), model_dtype)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """fp8 tensors have few CPU kernels; their bytes copy and gather like any uint8 tensor."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def quantize(x: torch.Tensor, fmt: KVCacheFormat, tensor_scale: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [N, KVH, D] → (stored values, per-token-head scales [N, KVH] or None)."""
    if fmt.per_token_head:
        scale = x.abs().amax(dim=-1).float().clamp_min(1e-8) / 127.0
        q = (x.float() / scale.unsqueeze(-1)).round().clamp(-127, 127).to(torch.int8)
        return q, scale
    limit = torch.finfo(fmt.dtype).max     # saturate instead of overflowing to NaN
    return (x.float() / tensor_scale).clamp(-limit, limit).to(fmt.dtype), None


def dequantize(q: torch.Tensor, scale: torch.Tensor | None, fmt: KVCacheFormat, tensor_scale: float) -> torch.Tensor:
    if fmt.per_token_head:
        return (q.float() * scale.unsqueeze(-1)).to(fmt.compute_dtype)
    return (q.float() * tensor_scale).to(fmt.compute_dtype)


def store(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor, x: torch.Tensor,
          fmt: KVCacheFormat, tensor_scale: float = 1.0) -> None:
    """Write this step's K or V rows [N, KVH, D] into their slots, quantizing if asked."""
    kvh, d = x.shape[1], x.shape[2]
    if not fmt.quantized:
        cache.view(-1, kvh, d).index_copy_(0, slots, x)
        return
    q, scale = quantize(x, fmt, tensor_scale)
    as_bytes(cache).view(-1, kvh, d).index_copy_(0, slots, as_bytes(q))
    if scale is not None:
        scales.view(-1, kvh).index_copy_(0, slots, scale)


class QuantizedCache:
    """A quantized cache read as if it held compute_dtype values: index_select over blocks
    dequantizes only the blocks it gathers (what the reference attention calls)."""

    def __init__(self, data: torch.Tensor, scales: torch.Tensor | None, fmt: KVCacheFormat, tensor_scale: float):
        self.data, self.scales, self.fmt, self.tensor_scale = data, scales, fmt, tensor_scale

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        q = as_bytes(self.data).index_select(dim, index)
        if self.fmt.dtype != torch.int8:
            q = q.view(self.fmt.dtype)
        scale = self.scales.index_select(dim, index) if self.scales is not None else None
        return dequantize(q, scale, self.fmt, self.tensor_scale)
