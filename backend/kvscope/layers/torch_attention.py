"""The readable reference: paged attention in plain PyTorch, on CPU or GPU.

K and V are read back from the paged cache through each sequence's block table, so this
path exercises exactly the layout the kernels use. Whole blocks are gathered with
index_select (an order of magnitude faster on CPU than gathering single slots)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvscope.layers.context import AttentionMetadata, PrefillSpan


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
