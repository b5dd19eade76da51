"""A watched row's attention weights, each row's keys read where they lie in the paged cache
(no gathered copy of them): on a CPU by the C kernel beside the decode kernel
(layers/cpu_paged_attention.c, `paged_weights`), which writes float16 weights and their mean
over the heads; on a GPU by a Triton kernel, one program a row and KV head with that head's
query heads, a first pass over the context for the softmax's max and sum and a second that
writes each key's probability. The Triton kernel is tested against PyTorch under its
interpreter."""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:   # CPU-only installs
    HAS_TRITON = False

from kvscope.layers import kernels

TILE_TOKENS = 32   # keys a loop step reads (the decode kernel's tile)
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"   # Triton runs kernels on the CPU (tests)


def watch_rows(layers, slots: torch.Tensor | None, weights: torch.Tensor | None = None,
               means: torch.Tensor | None = None) -> None:
    """From the next step on, the CPU decode kernel of each of `layers` (the i-th) also writes
    the softmax weights of each row r with slots[r] >= 0 into weights[i, slots[r]] [H, width]
    and their mean over the heads into means[i, slots[r]] [width] (float16, zero past the row's
    context); None: no rows. Each layer holds the tensors its kernel writes through (checked
    once for every layer: a watched step sets them all)."""
    if slots is None:
        for layer in layers:
            layer.watch.numpy()[:] = 0
            layer.watched = ()
        return
    num_layers, n, heads, width = weights.shape
    if not (slots.dtype == torch.int32 and weights.dtype == means.dtype == torch.float16
            and num_layers == len(layers) and all(layer.num_heads == heads for layer in layers)
            and means.shape == (num_layers, n, width) and slots.is_cpu and weights.is_cpu and means.is_cpu
            and slots.is_contiguous() and weights.is_contiguous() and means.is_contiguous()):
        raise ValueError(f"watched rows need int32 slots and float16 weights [{len(layers)}, n, heads, width] and "
                         f"means [{len(layers)}, n, width] on the CPU; got {slots.dtype}, {tuple(weights.shape)}, "
                         f"{tuple(means.shape)}")
    stride_w, stride_m = weights[0].numel() * 2, means[0].numel() * 2   # bytes a layer's part takes
    ptr_w, ptr_m = weights.data_ptr(), means.data_ptr()
    held = (slots, weights, means)
    for i, layer in enumerate(layers):
        layer.watched = held
        layer.watch.numpy()[:] = (slots.data_ptr(), ptr_w + i * stride_w, ptr_m + i * stride_m, len(slots), n, width)


def cpu_weights(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                scale: float, out: torch.Tensor, mean: torch.Tensor | None = None) -> None:
    """The softmax weights of q [n, H, D] over each row's first context_lens[r] keys, read in
    place through its block table, into out [n, H, width] float16 (zero past a row's length),
    and their mean over the heads into mean [n, width] float16 when given."""
    kernels.check_layout(q, k_cache, k_cache, q, block_tables, context_lens)
    width = out.shape[2]
    if not (out.is_contiguous() and out.dtype == torch.float16 and out.shape[:2] == q.shape[:2]
            and context_lens.shape == q.shape[:1] and block_tables.shape[0] == q.shape[0]
            and int(context_lens.max()) <= min(width, block_tables.shape[1] * k_cache.shape[1])
            and (mean is None or (mean.is_contiguous() and mean.dtype == torch.float16
                                  and mean.shape == (q.shape[0], width)))):
        raise ValueError(f"weights for queries {tuple(q.shape)} do not fit out {tuple(out.shape)} {out.dtype}, "
                         f"mean {None if mean is None else (tuple(mean.shape), mean.dtype)}, "
                         f"tables {tuple(block_tables.shape)}, lengths {tuple(context_lens.shape)}")
    kernels.c_function("paged_weights", q.dtype, 6, 7)(
        q.data_ptr(), k_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(), out.data_ptr(),
        None if mean is None else mean.data_ptr(), q.shape[0], q.shape[1], k_cache.shape[2], q.shape[2],
        k_cache.shape[1], block_tables.shape[1], width, scale, torch.get_num_threads())


def triton_usable(layer) -> bool:
    """Whether a layer's watched weights can be read in place here: a plain cache where Triton
    runs (a CUDA GPU, or anywhere under its interpreter)."""
    return HAS_TRITON and (layer.k_cache.is_cuda or INTERPRETED) and not layer.kv_format.quantized


def triton_weights(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                  scale: float, width: int) -> torch.Tensor:
    """q [n, H, D], one decode row each → softmax weights [n, H, width] float32, row r over its
    first context_lens[r] keys (read through block_tables[r]), zero past them."""
    n, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    q = q.contiguous()
    out = torch.zeros(n, num_heads, width, dtype=torch.float32, device=q.device)
    _paged_weights_kernel[(n, num_kv_heads)](
        q, k_cache, block_tables, context_lens, out, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), GROUP=group, GROUP_PAD=max(triton.next_power_of_2(group), 1),
        BLOCK_SIZE=block_size, TILE=max(TILE_TOKENS, block_size), HEAD_DIM=head_dim)
    return out


if HAS_TRITON:
    @triton.jit
    def _tile_scores(q, k_cache_ptr, block_tables_ptr, row, kv_head, start, context_len,
                     stride_kb, stride_ks, stride_kh, stride_bt,
                     BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, HEAD_DIM: tl.constexpr):
        """q [G, D] against the keys at positions start .. start + TILE - 1: [G, TILE], -inf past the context."""
        token = start + tl.arange(0, TILE)
        in_context = token < context_len
        block = tl.load(block_tables_ptr + row * stride_bt + token // BLOCK_SIZE, mask=in_context, other=0).to(tl.int64)
        k = tl.load(k_cache_ptr + block[:, None] * stride_kb + (token % BLOCK_SIZE)[:, None] * stride_ks
                    + kv_head * stride_kh + tl.arange(0, HEAD_DIM)[None, :],
                    mask=in_context[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        return tl.where(in_context[None, :], scores, float("-inf"))

    @triton.jit
    def _paged_weights_kernel(
        q_ptr, k_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, scale,
        stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        context_len = tl.load(context_lens_ptr + row)
        offs_g = tl.arange(0, GROUP_PAD)
        head_ok = offs_g < GROUP
        heads = kv_head * GROUP + offs_g
        q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + tl.arange(0, HEAD_DIM)[None, :],
                    mask=head_ok[:, None], other=0.0).to(tl.float32) * scale
        running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        running_sum = tl.zeros([GROUP_PAD], tl.float32)
        for start in range(0, context_len, TILE):   # the softmax's max and sum, online
            scores = _tile_scores(q, k_cache_ptr, block_tables_ptr, row, kv_head, start, context_len,
                                  stride_kb, stride_ks, stride_kh, stride_bt, BLOCK_SIZE, TILE, HEAD_DIM)
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(scores - new_max[:, None]), 1)
            running_max = new_max
        for start in range(0, context_len, TILE):   # each key's probability
            scores = _tile_scores(q, k_cache_ptr, block_tables_ptr, row, kv_head, start, context_len,
                                  stride_kb, stride_ks, stride_kh, stride_bt, BLOCK_SIZE, TILE, HEAD_DIM)
            token = start + tl.arange(0, TILE)
            probs = tl.exp(scores - running_max[:, None]) / running_sum[:, None]
            tl.store(out_ptr + row * stride_ob + heads[:, None] * stride_oh + token[None, :], probs,
                     mask=head_ok[:, None] & (token < context_len)[None, :])
