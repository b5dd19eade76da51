"""Gather-free paged decode attention for CPU: walk the block tables one block column at a
time with an online softmax (running max, running sum), as the GPU kernels do.

At step j every sequence still in its context reads only its j-th block, [B, block_size,
KVH, D], so no sequence's whole context is ever copied out of the cache. Positions past a
sequence's context length (the tail of its last block) are masked."""
from __future__ import annotations

from bisect import bisect_right

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
    lens = md.context_lens.tolist()
    in_order = all(a <= b for a, b in zip(lens, lens[1:]))   # the step builder sorts decodes
    offsets = torch.arange(block_size, device=q.device)
    for j in range(cdiv(md.max_context_len, block_size)):
        start = j * block_size
        # rows sorted by length: those whose context ended before this block are a prefix, skipped
        first = bisect_right(lens, start) if in_order else 0
        rows = slice(first, batch)
        ids = md.block_tables[rows, j]
        keys = k_cache[ids].permute(0, 2, 3, 1)                         # [b, KVH, D, bs]
        values = v_cache[ids].transpose(1, 2)                           # [b, KVH, bs, D]
        scores = qs[rows] @ keys                                        # [b, KVH, G, bs]
        if not in_order or lens[first] < start + block_size:   # some context ends inside this block
            past_end = (start + offsets)[None, :] >= md.context_lens[rows, None]
            scores = scores.masked_fill(past_end[:, None, None, :], float("-inf"))
        # every context holds at least one token, so block 0 makes the max finite and
        # exp(-inf - finite) = 0 drops the masked and the not-yet-seen terms
        new_max = torch.maximum(running_max[rows], scores.amax(-1))
        rescale = torch.exp(running_max[rows] - new_max)
        probs = torch.exp(scores - new_max[..., None])
        running_sum[rows] = running_sum[rows] * rescale + probs.sum(-1)
        acc[rows] = acc[rows] * rescale[..., None] + probs @ values
        running_max[rows] = new_max
    return (acc / running_sum[..., None]).reshape(batch, num_heads, head_dim)
