"""Paged attention: the layer writes this step's K/V into the cache, then attends through
the block tables with the selected backend. Below it, the readable reference backend in
plain PyTorch (CPU or GPU): K and V are read back from the paged cache through each
sequence's block table, the layout the kernels use. Whole blocks are gathered with
index_select (an order of magnitude faster on CPU than gathering single slots)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvscope.layers import cpu_paged_attention, kv_quant
from kvscope.layers.context import AttentionMetadata, PrefillSpan, get_metadata

try:
    from flash_attn import flash_attn_with_kvcache
    HAS_FLASH_ATTN = True
except ImportError:
    HAS_FLASH_ATTN = False


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_idx: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5
        self.layer_idx = layer_idx
        self.backend = "torch"
        # [num_blocks + 1, block_size, KVH, D]; bound by the model runner (the extra block
        # is a scratch target for the padded rows of a CUDA-graph batch)
        self.k_cache = self.v_cache = torch.empty(0)
        # a quantized cache (kv_cache_dtype): its format, per-token-head scales, per-tensor scales
        self.kv_format = kv_quant.kv_cache_format("auto", torch.float32)
        self.k_scales = self.v_scales = None
        self.k_scale = self.v_scale = 1.0

    def readable_caches(self):
        """K and V caches as attention reads them: quantized ones dequantize the blocks gathered."""
        if not self.kv_format.quantized:
            return self.k_cache, self.v_cache
        return (kv_quant.QuantizedCache(self.k_cache, self.k_scales, self.kv_format, self.k_scale),
                kv_quant.QuantizedCache(self.v_cache, self.v_scales, self.kv_format, self.v_scale))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        md = get_metadata()
        kv_quant.store(self.k_cache, self.k_scales, md.slot_mapping, k, self.kv_format, self.k_scale)
        kv_quant.store(self.v_cache, self.v_scales, md.slot_mapping, v, self.kv_format, self.v_scale)
        k_cache, v_cache = self.readable_caches()

        out = torch.empty_like(q)
        if md.in_place is not None:   # decode rows and short spans: one kernel call
            r = md.in_place
            out[r.rows] = cpu_paged_attention.run(q[r.rows], self.k_cache, self.v_cache, r.block_tables,
                                                  r.context_lens, self.scale)
        if md.tiled is not None:      # the other spans: one call, written into their rows
            cpu_paged_attention.prefill(q.contiguous(), self.k_cache, self.v_cache, md.tiled, self.scale, out)
        for span in md.prefills:
            rows = slice(span.q_start, span.q_start + span.q_len)
            out[rows] = prefill_attention(
                q[rows], k[rows], v[rows], k_cache, v_cache, span, self.scale)
        if md.num_decodes and md.in_place is None:
            q_dec = q[md.num_prefill_tokens:]
            out[md.num_prefill_tokens:] = self._decode(q_dec, md, k_cache, v_cache)
        return out.view(q.shape[0], -1)

    def _decode(self, q, md, k_cache, v_cache):
        if self.backend == "triton":
            from kvscope.layers.triton_attention import paged_decode_attention
            return paged_decode_attention(q, self.k_cache, self.v_cache, md.block_tables,
                                          md.context_lens, self.scale)
        if self.backend == "flash_attn":
            out = flash_attn_with_kvcache(q.unsqueeze(1), self.k_cache, self.v_cache,
                                          cache_seqlens=md.context_lens, block_table=md.block_tables,
                                          softmax_scale=self.scale, causal=True)
            return out.squeeze(1)
        if self.backend == "cpu_paged":
            return cpu_paged_attention.decode_attention(q, self.k_cache, self.v_cache, md.block_tables,
                                                        md.context_lens, self.scale)
        return decode_attention(q, k_cache, v_cache, md, self.scale)


# -- the reference backend ------------------------------------------------------------

def gather_context(cache: torch.Tensor, blocks: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """cache: [num_blocks, block_size, KVH, D]; blocks: [..., n] block ids →
    [..., n * block_size, KVH, D] (cut to `length` tokens when given)."""
    out = cache.index_select(0, blocks.reshape(-1))
    out = out.view(*blocks.shape[:-1], -1, *cache.shape[2:])
    return out if length is None else out[..., :length, :, :]


def prefill_attention(q, k, v, k_cache, v_cache, span: PrefillSpan, scale: float):
    """q: [q_len, H, D]; k, v: this span's new keys/values [q_len, KVH, D];
    caches: [num_blocks, block_size, KVH, D]."""
    qs = q.transpose(0, 1).unsqueeze(0)                        # [1, H, q_len, D]
    if span.start == 0:   # nothing cached: the new keys are the whole context
        ks, vs = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
    else:
        ctx = span.start + span.q_len
        ks = gather_context(k_cache, span.context_blocks, ctx).transpose(0, 1).unsqueeze(0)  # [1, KVH, ctx, D]
        vs = gather_context(v_cache, span.context_blocks, ctx).transpose(0, 1).unsqueeze(0)
        query_pos = torch.arange(span.start, ctx, device=q.device)[:, None]
        mask = torch.arange(ctx, device=q.device)[None, :] <= query_pos
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)                        # [q_len, H, D]


def decode_attention(q, k_cache, v_cache, md: AttentionMetadata, scale: float):
    """q: [B, H, D], one query per sequence, each attending to its own cached context."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    out = torch.empty_like(q)
    for group in md.decode_groups:
        ks = gather_context(k_cache, group.block_tables).transpose(1, 2)   # [n, KVH, blocks * bs, D]
        vs = gather_context(v_cache, group.block_tables).transpose(1, 2)
        # the query heads that share a KV head act as that head's query rows, so K and V
        # are read once per KV head instead of being expanded to every query head
        qs = q[group.rows].view(-1, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out[group.rows] = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=group.mask, scale=scale).reshape(-1, num_heads, head_dim)
    return out
