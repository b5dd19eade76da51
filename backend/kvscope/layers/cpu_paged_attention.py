"""Gather-free paged decode attention on a CPU: a small C kernel (cpu_paged_attention.c)
reads each sequence's keys and values in place through its block table, with an online
softmax, instead of copying its whole context out of the pool first as the readable
reference (torch_attention.py) does. It is built with this machine's C compiler the first
time it is needed (native_build.py) and called through ctypes, which lets go of the GIL.

Under torch.compile the kernel is a custom op (kvscope::paged_decode_attention), opaque to
inductor, so a compiled decode step fuses everything around attention and calls the
kernel for attention itself."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from kvscope.native_build import NativeBuildError, load

SOURCE = Path(__file__).with_suffix(".c")
DTYPES = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
_ARGTYPES = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]


@functools.cache
def _kernels() -> dict[torch.dtype, object] | str:
    """The built kernel's entry point per dtype, or why it could not be built."""
    try:
        lib = load(SOURCE)
    except NativeBuildError as exc:
        return str(exc)
    kernels = {}
    for dtype, name in DTYPES.items():
        kernels[dtype] = fn = getattr(lib, name)
        fn.argtypes, fn.restype = _ARGTYPES, None
    return kernels


def unavailable(dtype: torch.dtype) -> str | None:
    """Why the kernel cannot run for this dtype here (None when it can); builds it once."""
    if dtype not in DTYPES:
        return f"the CPU paged-attention kernel takes float32 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    kernels = _kernels()
    return kernels if isinstance(kernels, str) else None


def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
        context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [B, H, D]; caches: [num_blocks, block_size, KVH, D]; block_tables: [B, width] int32;
    context_lens: [B] int32 (each >= 1) → [B, H, D]."""
    kernels = _kernels()
    if isinstance(kernels, str):
        raise RuntimeError(kernels)
    q = q.contiguous()
    out = torch.empty_like(q)
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    # the kernel trusts these layouts: check them, cheaply, on every call
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and block_tables.is_contiguous()
    assert block_tables.dtype == context_lens.dtype == torch.int32 and k_cache.dtype == q.dtype
    kernels[q.dtype](q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                     context_lens.data_ptr(), out.data_ptr(), batch, num_heads, num_kv_heads, head_dim,
                     block_size, block_tables.shape[1], scale, torch.get_num_threads())
    return out


# A plain operator library rather than torch.library.custom_op: its dispatch costs a third
# as much (3 µs against 7 under inference mode), which shows at batch 1. This Python kernel
# serves every backend until cpu_ops.py loads the C++ CPU kernel.
_ops = torch.library.Library("kvscope", "FRAGMENT")
_ops.define("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
            "Tensor context_lens, float scale) -> Tensor")
_ops.impl("paged_decode_attention", run, "CompositeExplicitAutograd")


@torch.library.register_fake("kvscope::paged_decode_attention")
def _(q, k_cache, v_cache, block_tables, context_lens, scale):
    return torch.empty_like(q)


# A span (a prompt, a chunk, a draft verification) reads its context in place when it is
# short: one kernel row per query, batched with the step's decode rows into one call per
# layer, so each span costs what it reads and no fixed per-call overhead (a separate
# scaled_dot_product_attention call costs about 45 µs however small). A span that would
# read more gathers its context once and uses SDPA, which reuses each key across its many
# queries. Break-even measured on one layer of the embedded model, 1 thread: 8K positions
# read (a 128-token prompt, or 16 queries over 500 cached tokens).
MAX_IN_PLACE_READS = 8192


def reads_span_in_place(start: int, q_len: int) -> bool:
    """Whether the kernel takes this span: its queries at positions start .. start + q_len - 1
    read q_len * start + q_len * (q_len + 1) / 2 cached positions in all."""
    return q_len * start + q_len * (q_len + 1) // 2 <= MAX_IN_PLACE_READS


def decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    # eagerly, the plain call: even a light operator's dispatch costs a few µs per layer
    if torch.compiler.is_compiling():
        return torch.ops.kvscope.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    return run(q, k_cache, v_cache, block_tables, context_lens, scale)
