"""Gather-free paged decode attention for CPU: walk the block tables one block column at a
time with an online softmax (running max, running sum), as the GPU kernels do.

At step j every sequence reads only its j-th block, [B, block_size, KVH, D], so no
sequence's whole context is ever copied out of the cache. Positions past a sequence's
context length (the tail of its last block, and the padding of shorter tables) are masked."""
from __future__ import annotations

import torch

from kvscope.layers.context import AttentionMetadata
from kvscope.paging import cdiv


def decode_attention(q, k_cache, v_cache, md: AttentionMetadata, scale: float):
    """q: [B, H, D], one query per sequence; caches: [num_blocks, block_size, KVH, D]."""
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    # the query heads that share a KV head become that head's query rows (GQA)
    qs = (q * scale).view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    running_max = torch.full(qs.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    running_sum = torch.zeros_like(running_max)
    acc = torch.zeros_like(qs)
    offsets = torch.arange(block_size, device=q.device)
    for j in range(cdiv(md.max_context_len, block_size)):
        ids = md.block_tables[:, j]
        keys, values = k_cache[ids], v_cache[ids]                       # [B, bs, KVH, D]
        scores = torch.einsum("bhgd,bthd->bhgt", qs, keys)              # [B, KVH, G, bs]
        past_end = (j * block_size + offsets)[None, :] >= md.context_lens[:, None]
        scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))
        # every context holds at least one token, so block 0 makes the max finite and
        # exp(-inf - finite) = 0 drops the masked and the not-yet-seen terms
        new_max = torch.maximum(running_max, scores.amax(-1))
        rescale = torch.exp(running_max - new_max)
        probs = torch.exp(scores - new_max[..., None])
        running_sum = running_sum * rescale + probs.sum(-1)
        acc = acc * rescale[..., None] + torch.einsum("bhgt,bthd->bhgd", probs, values)
        running_max = new_max
    return (acc / running_sum[..., None]).reshape(batch, num_heads, head_dim)
