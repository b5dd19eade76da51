"""The hand-written paged-attention kernels, reading K/V in place through the block tables with an
online softmax: on a CPU the C kernels (a row kernel, a tile kernel; built once, called through
ctypes, which releases the GIL), on a GPU a Triton decode kernel (flash-decoding for small batches)."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kvscope.native_build import NativeBuildError, load

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:   # CPU-only installs
    HAS_TRITON = False

if TYPE_CHECKING:
    from kvscope.layers.attention import TiledSpans

# -- CPU: the C kernels --------------------------------------------------------------------
SOURCE = Path(__file__).with_name("cpu_paged_attention.c")
CPU_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16"}
WATCH_FIELDS = 6   # the decode kernel's watch descriptor (cpu_paged_attention.c, watched_slot)
# each kernel's pointer and int arguments (then the scale and the thread count)
SIGNATURES = {"paged_decode": (7, 6), "paged_prefill": (8, 6)}


@functools.cache
def _library() -> ctypes.CDLL | str:
    """The C kernels, or why they could not be built; a missing source raises."""
    if not SOURCE.is_file():
        raise NativeBuildError(f"{SOURCE} is missing: this kvscope install is incomplete (reinstall it)")
    try:
        return load(SOURCE)
    except NativeBuildError as exc:
        return str(exc)


@functools.cache
def c_function(name: str, dtype: torch.dtype, pointers: int, ints: int):
    """The C function `name` for `dtype`, taking that many pointers and ints, a float and an int."""
    lib = _library()
    if isinstance(lib, str):
        raise RuntimeError(lib)
    fn = getattr(lib, f"{name}_{CPU_DTYPES[dtype]}")
    fn.argtypes = [ctypes.c_void_p] * pointers + [ctypes.c_int] * ints + [ctypes.c_float, ctypes.c_int]
    fn.restype = None
    return fn


@functools.cache
def _kernel(name: str, dtype: torch.dtype):
    return c_function(name, dtype, *SIGNATURES[name])


def cpu_unavailable(dtype: torch.dtype) -> str | None:
    if dtype not in CPU_DTYPES:
        return f"the CPU paged-attention kernel takes float32 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    lib = _library()
    return lib if isinstance(lib, str) else None


def cpu_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float, watch: torch.Tensor | None = None) -> torch.Tensor:
    """Attention for one query row per sequence; `watch` (WATCH_FIELDS int64,
    instrumentation/weights.py watch_rows fills it) also asks for some rows' softmax weights."""
    q = q.contiguous()
    out = torch.empty_like(q)
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_layout(q, k_cache, v_cache, out, block_tables, context_lens)
    if context_lens.shape != (batch,) or block_tables.shape[0] != batch:
        raise ValueError(f"{batch} query rows need {batch} block tables and context lengths, got "
                         f"{tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if watch is not None and not (watch.is_cpu and watch.dtype == torch.int64 and watch.shape == (WATCH_FIELDS,)):
        raise ValueError(f"a decode watch is {WATCH_FIELDS} int64 on the CPU, not {tuple(watch.shape)} {watch.dtype}")
    _kernel("paged_decode", q.dtype)(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
                                     context_lens.data_ptr(), out.data_ptr(), None if watch is None else watch.data_ptr(),
                                     batch, num_heads, num_kv_heads, head_dim, block_size, block_tables.shape[1],
                                     scale, torch.get_num_threads())
    return out


def check_layout(q, k_cache, v_cache, out, *int32s: torch.Tensor) -> None:
    """The C kernels trust raw pointers: refuse what they would misread (not asserts: python -O
    drops those), as plain comparisons (generators and all() cost more than the checks)."""
    for t in (q, k_cache, v_cache, out) + int32s:
        if not (t.is_cpu and t.is_contiguous()):
            raise ValueError("the CPU paged-attention kernels take contiguous CPU tensors")
    dtype = q.dtype
    if k_cache.dtype != dtype or v_cache.dtype != dtype or out.dtype != dtype or dtype not in CPU_DTYPES:
        raise ValueError(f"query, caches and output must share one of float32, bfloat16; got {q.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}, {out.dtype}")
    for t in int32s:
        if t.dtype != torch.int32:
            raise ValueError("block tables, lengths and offsets must be int32")
    q_shape, k_shape = q.shape, k_cache.shape
    if k_shape != v_cache.shape or len(k_shape) != 4 or len(q_shape) != 3 or out.shape != q_shape \
            or k_shape[3] != q_shape[2] or q_shape[1] % k_shape[2]:
        raise ValueError(f"caches {tuple(k_shape)}, {tuple(v_cache.shape)} do not fit queries {tuple(q_shape)}")


# A plain operator library rather than torch.library.custom_op: its dispatch costs a third
# as much (3 µs against 7 under inference mode), which shows at batch 1.
_ops = torch.library.Library("kvscope", "FRAGMENT")
_ops.define("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
            "Tensor context_lens, float scale, Tensor watch) -> Tensor")
_ops.impl("paged_decode_attention", cpu_decode, "CompositeExplicitAutograd")


@torch.library.register_fake("kvscope::paged_decode_attention")
def _(q, k_cache, v_cache, block_tables, context_lens, scale, watch):
    return torch.empty_like(q)


def cpu_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, spans: TiledSpans, scale: float,
                out: torch.Tensor) -> None:
    """Causal attention for `spans`' rows of q into out, their keys (this step's too) in the caches."""
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_layout(q, k_cache, v_cache, out, spans.block_tables, spans.q_starts, spans.q_lens, spans.starts)
    _kernel("paged_prefill", q.dtype)(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), spans.block_tables.data_ptr(),
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


# -- GPU: the Triton decode kernel ---------------------------------------------------------
TILE_TOKENS = 32   # context tokens a loop step reads: on an H100, 16 or 32 read KV at ~1 TB/s, 64 at 0.74
NUM_STAGES = 3     # tiles in flight: the next tiles' loads are issued while this one is reduced
MAX_SPLITS = 64    # slices one sequence's context is cut into at most (a power of two: the combine's width)
H100_SMS = 132     # the card the splits are sized for when no CUDA device is there to ask


def decode_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Slices per context (flash-decoding): about two programs per SM, never shorter than a tile."""
    programs = batch * num_kv_heads
    target = 2 * _sm_count(device)
    if programs >= target:
        return 1
    return max(1, min(-(-target // programs), -(-max_context // TILE_TOKENS), MAX_SPLITS))


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return H100_SMS


if HAS_TRITON:
    @triton.jit
    def _paged_decode_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
        part_max_ptr, part_sum_ptr, part_out_ptr, scale, num_splits,
        stride_qb, stride_qh, stride_kb, stride_ks, stride_kh, stride_bt, stride_ob, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
        HEAD_DIM: tl.constexpr, SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
    ):
        """One sequence, one KV head with its GROUP query heads (a tile loaded once for all), one
        of num_splits slices of the context (a run-time number: no recompile per batch size)."""
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        context_len = tl.load(context_lens_ptr + seq)
        # this program's slice: whole tiles, so every slice but the last is full
        split_len = tl.cdiv(tl.cdiv(context_len, num_splits), TILE) * TILE
        lo = split * split_len
        hi = tl.minimum(lo + split_len, context_len)

        offs_d = tl.arange(0, HEAD_DIM)
        offs_g = tl.arange(0, GROUP_PAD)
        offs_t = tl.arange(0, TILE)
        head_ok = offs_g < GROUP
        heads = kv_head * GROUP + offs_g
        q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=head_ok[:, None], other=0.0).to(tl.float32)
        running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        running_sum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)

        # each token finds its own block, so short blocks still keep enough loads in flight
        for start in tl.range(lo, hi, TILE, num_stages=NUM_STAGES):
            token = start + offs_t
            in_context = token < hi
            block = tl.load(block_tables_ptr + seq * stride_bt + token // BLOCK_SIZE,
                            mask=in_context, other=0).to(tl.int64)
            kv_offs = (block[:, None] * stride_kb + (token % BLOCK_SIZE)[:, None] * stride_ks
                       + kv_head * stride_kh + offs_d[None, :])
            k = tl.load(k_cache_ptr + kv_offs, mask=in_context[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_cache_ptr + kv_offs, mask=in_context[:, None], other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale          # [G, TILE]
            scores = tl.where(in_context[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_max[:, None])
            rescale = tl.exp(running_max - new_max)
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
            running_max = new_max

        if not SPLIT:   # the whole context: normalise and write the output
            running_sum = tl.where(running_sum == 0.0, 1.0, running_sum)   # padded rows of a graph batch
            out = acc / running_sum[:, None]
            tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                     out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None])
        else:   # this slice's max, sum and unnormalised output, for _combine_splits
            part = (seq * GROUP * tl.num_programs(1) + heads) * num_splits + split             # [G]
            tl.store(part_max_ptr + part, running_max, mask=head_ok)
            tl.store(part_sum_ptr + part, running_sum, mask=head_ok)
            tl.store(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=head_ok[:, None])

    @triton.jit
    def _combine_splits(part_max_ptr, part_sum_ptr, part_out_ptr, out_ptr, num_splits, stride_ob, stride_oh,
                        HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
        """One (sequence, query head): the slices rescaled to their largest max, summed, normalised."""
        seq = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, SPLITS_PAD)
        offs_d = tl.arange(0, HEAD_DIM)
        part = (seq * tl.num_programs(1) + head) * num_splits + offs_s
        ok = offs_s < num_splits
        maxes = tl.load(part_max_ptr + part, mask=ok, other=float("-inf"))
        sums = tl.load(part_sum_ptr + part, mask=ok, other=0.0)
        outs = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=ok[:, None], other=0.0)
        top = tl.max(maxes, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)   # a padded row of a graph batch: no context
        weights = tl.exp(maxes - top)
        total = tl.sum(weights * sums, axis=0)
        total = tl.where(total == 0.0, 1.0, total)
        out = tl.sum(weights[:, None] * outs, axis=0) / total
        tl.store(out_ptr + seq * stride_ob + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def triton_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                            num_splits: int | None = None) -> torch.Tensor:
    """q: [B, H, D] → [B, H, D]; context_lens on the device (a CUDA graph replays new ones)."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    tile = max(TILE_TOKENS, block_size)
    if num_splits is None:
        num_splits = decode_splits(batch, num_kv_heads, block_tables.shape[1] * block_size, q.device)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be 1 to {MAX_SPLITS}, not {num_splits}")
    q = q.contiguous()
    out = torch.empty_like(q)
    parts = [torch.empty(batch, num_heads, num_splits, *extra, dtype=torch.float32, device=q.device)
             for extra in ((), (), (head_dim,))] if num_splits > 1 else [out] * 3   # max, sum, output
    _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, *parts, scale, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(triton.next_power_of_2(group), 1), BLOCK_SIZE=block_size,
        TILE=tile, HEAD_DIM=head_dim, SPLIT=num_splits > 1, NUM_STAGES=NUM_STAGES,
    )
    if num_splits > 1:
        _combine_splits[(batch, num_heads)](*parts, out, num_splits, out.stride(0), out.stride(1), HEAD_DIM=head_dim,
                                            SPLITS_PAD=MAX_SPLITS)
    return out
