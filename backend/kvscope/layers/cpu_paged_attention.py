"""Gather-free paged attention on a CPU: small C kernels (cpu_paged_attention.c) read each
sequence's keys and values in place through its block table, with an online softmax,
instead of copying its whole context out of the pool first as the readable reference
(layers/attention.py) does. One kernel takes query rows one at a time (decode rows, spans of
a few tokens); the other takes longer spans (prompts, chunks) a tile of positions at a
time, loading each key once per tile. They are built with this machine's C compiler the
first time they are needed (native_build.py) and called through ctypes, which lets go of
the GIL.

Under torch.compile the row kernel is a custom op (kvscope::paged_decode_attention), opaque
to inductor, so a compiled decode step fuses everything around attention and calls the
kernel for attention itself."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from kvscope.layers.context import TiledSpans
from kvscope.native_build import NativeBuildError, load

SOURCE = Path(__file__).with_suffix(".c")
DTYPES = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
PREFILL_DTYPES = {torch.float32: "paged_prefill_f32", torch.bfloat16: "paged_prefill_bf16"}
_ARGTYPES = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]
_PREFILL_ARGTYPES = [ctypes.c_void_p] * 8 + [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_int]


def _entry_points(names: dict[torch.dtype, str], argtypes: list) -> dict[torch.dtype, object] | str:
    """The built library's entry points per dtype, or why it could not be built (no
    compiler). A source missing from the install raises: that is a broken install."""
    if not SOURCE.is_file():
        raise NativeBuildError(f"{SOURCE} is missing: this kvscope install is incomplete (reinstall it)")
    try:
        lib = load(SOURCE)
    except NativeBuildError as exc:
        return str(exc)
    kernels = {}
    for dtype, name in names.items():
        kernels[dtype] = fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return kernels


@functools.cache
def _kernels() -> dict[torch.dtype, object] | str:
    """The row kernel per dtype, or why it could not be built."""
    return _entry_points(DTYPES, _ARGTYPES)


@functools.cache
def _prefill_kernels() -> dict[torch.dtype, object] | str:
    return _entry_points(PREFILL_DTYPES, _PREFILL_ARGTYPES)


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
# as much (3 µs against 7 under inference mode), which shows at batch 1.
_ops = torch.library.Library("kvscope", "FRAGMENT")
_ops.define("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
            "Tensor context_lens, float scale) -> Tensor")
_ops.impl("paged_decode_attention", run, "CompositeExplicitAutograd")


@torch.library.register_fake("kvscope::paged_decode_attention")
def _(q, k_cache, v_cache, block_tables, context_lens, scale):
    return torch.empty_like(q)


def prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, spans: TiledSpans, scale: float,
            out: torch.Tensor) -> None:
    """Causal attention for `spans` of the step's rows, read in place, written into `out`.
    q, out: [tokens, H, D] contiguous; each span's keys (this step's included) are already in
    the caches, at the positions its block table gives."""
    kernels = _prefill_kernels()
    if isinstance(kernels, str):
        raise RuntimeError(kernels)
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert q.is_contiguous() and out.is_contiguous() and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k_cache.dtype == q.dtype == out.dtype and spans.block_tables.dtype == torch.int32
    kernels[q.dtype](q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), spans.block_tables.data_ptr(),
                     spans.q_starts.data_ptr(), spans.q_lens.data_ptr(), spans.starts.data_ptr(), out.data_ptr(),
                     len(spans.q_lens), num_heads, num_kv_heads, head_dim, block_size, spans.block_tables.shape[1],
                     scale, torch.get_num_threads())


# Which kernel takes a span (a prompt, a chunk, a draft verification): the row kernel, one
# row per query, batched with the step's decode rows into one call per layer, or the tile
# kernel, which loads each key once for up to 16 queries. Measured on one layer of the
# embedded model, 1 thread, µs rows/tiles: 8 queries from position 0, 20/23; 8 over 100
# cached, 110/76; 16 from 0, 42/34; 64 from 0, 312/213; 4 over 500 cached, 233/188.
MIN_TILED_SPAN = 8


def tiles_span(q_len: int) -> bool:
    return q_len >= MIN_TILED_SPAN


def decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale: float) -> torch.Tensor:
    # eagerly, the plain call: even a light operator's dispatch costs a few µs per layer
    if torch.compiler.is_compiling():
        return torch.ops.kvscope.paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    return run(q, k_cache, v_cache, block_tables, context_lens, scale)
