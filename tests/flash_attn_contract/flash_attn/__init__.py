"""FlashAttention-2's two entry points kvscope calls, written in PyTorch from their documented
contract (flash_attn_interface.py's docstrings), so the flash_attn routes' metadata can be
checked on a machine where flash-attn cannot be installed: packed varlen queries, a paged cache
read through block tables in pages of a multiple of 256, the causal mask aligned to the bottom
right corner, grouped-query heads. Only tests put this folder on the path."""
from __future__ import annotations

import torch
import torch.nn.functional as F

PAGE_MULTIPLE = 256


def _attend(q, keys, values, scale, causal):
    """q: [nq, H, D]; keys, values: [nk, KVH, D]; query i sees keys up to nk - nq + i."""
    nq, nk = q.shape[0], keys.shape[0]
    mask = None
    if causal:
        mask = torch.arange(nk)[None, :] <= torch.arange(nk - nq, nk)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1).float(), keys.transpose(0, 1).float(),
                                         values.transpose(0, 1).float(), attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out.transpose(0, 1).to(q.dtype)


def _paged(cache, table, n):
    if cache.shape[1] % PAGE_MULTIPLE:
        raise RuntimeError("Paged KV cache block size must be divisible by 256")
    return cache[table.long()].flatten(0, 1)[:n]


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    for t in (cu_seqlens_q, cu_seqlens_k) + ((block_table,) if block_table is not None else ()):
        if t.dtype != torch.int32:
            raise RuntimeError("cu_seqlens and block_table must have dtype int32")
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if max(b - a for a, b in zip(cq, cq[1:])) > max_seqlen_q or max(b - a for a, b in zip(ck, ck[1:])) > max_seqlen_k:
        raise RuntimeError("a sequence is longer than max_seqlen")
    out = torch.empty_like(q)
    for i in range(len(cq) - 1):
        n = ck[i + 1] - ck[i]
        keys = _paged(k, block_table[i], n) if block_table is not None else k[ck[i]:ck[i + 1]]
        values = _paged(v, block_table[i], n) if block_table is not None else v[ck[i]:ck[i + 1]]
        out[cq[i]:cq[i + 1]] = _attend(q[cq[i]:cq[i + 1]], keys, values, softmax_scale, causal)
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    if k is not None or block_table is None or block_table.dtype != torch.int32 or cache_seqlens.dtype != torch.int32:
        raise RuntimeError("this stand-in covers the paged read kvscope makes: int32 block_table and cache_seqlens")
    out = torch.empty_like(q)   # q: [batch, seqlen, H, D]
    for b, n in enumerate(cache_seqlens.tolist()):
        out[b] = _attend(q[b], _paged(k_cache, block_table[b], n), _paged(v_cache, block_table[b], n),
                         softmax_scale, causal)
    return out
