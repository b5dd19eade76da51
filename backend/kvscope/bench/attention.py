"""`kvscope bench attention`: one layer's decode attention, each backend that can run on this
device, at the memory limit or not: the bytes of K and V it must read (every context token's,
once) over its time, against the device's bandwidth (hardware.py: a GPU's spec sheet, the
CPU's measured copy). On a CPU the C kernel (cpu_paged) and the reference (gather each context,
then SDPA); on a GPU the Triton kernel, flash_attn's when installed, and the reference. The step
is a batch of sequences whose blocks are scattered over the pool, prepared as the engine does."""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from kvscope.engine.block_manager import cdiv
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import StepBuffers, prepare_inputs
from kvscope.hardware import device_spec
from kvscope.layers import attention, kernels
from kvscope.layers.attention import Route
from kvscope.sampling_params import SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 256])
    p.add_argument("--context-len", type=int, nargs=2, metavar=("MIN", "MAX"), default=[512, 2048])
    p.add_argument("--heads", type=int, default=16, help="query heads (default: Qwen3-0.6B's)")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeats", type=int, default=5, help="alternate the backends N times; report medians")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def decode_step(args, batch: int, num_blocks: int, rng: random.Random) -> SchedulerOutput:
    """A decode step of `batch` sequences whose blocks are drawn at random from the pool."""
    free = rng.sample(range(num_blocks), k=num_blocks)
    out = SchedulerOutput(step=0)
    for _ in range(batch):
        length = rng.randint(*args.context_len)
        seq = Sequence([0] * length, SamplingParams())
        seq.block_table = [free.pop() for _ in range(cdiv(length, args.block_size))]
        seq.num_computed_tokens = length - 1
        out.entries.append(ScheduledSeq.row(seq, 1))
    return out


def backends(device: torch.device, dtype: torch.dtype, block_size: int) -> dict[str, str | None]:
    """Each backend this device has: None when it runs, else why not."""
    if device.type == "cpu":
        return {"cpu_paged": kernels.cpu_unavailable(dtype), "torch": None}
    return {"triton": None if kernels.HAS_TRITON else "triton is not installed",
            "flash_attn": None if attention.flash_fits(dtype, block_size)
            else "flash-attn is not installed, or the dtype or block size does not suit it",
            "torch": None}


def kernel_call(name: str, q, k_cache, v_cache, rows, groups, scale):
    if name == "cpu_paged":
        return lambda: kernels.cpu_decode(q, k_cache, v_cache, rows.block_tables, rows.context_lens, scale)
    if name == "triton":
        return lambda: kernels.triton_decode_attention(q, k_cache, v_cache, rows.block_tables, rows.context_lens,
                                                       scale)
    if name == "flash_attn":
        return lambda: attention.flash_attn_with_kvcache(
            q.unsqueeze(1), k_cache, v_cache, cache_seqlens=rows.context_lens, block_table=rows.block_tables,
            softmax_scale=scale, causal=True)
    return lambda: attention.decode_attention(q, k_cache, v_cache, groups, scale)


def seconds_per_call(fn, device: torch.device, budget: float = 0.2) -> float:
    """Mean time of back-to-back calls, about `budget` seconds of them (the device drained)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    start = time.perf_counter()
    fn()
    sync()
    calls = max(3, min(2000, int(budget / max(time.perf_counter() - start, 1e-6))))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def run(args) -> int:
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    dtype = getattr(torch, args.dtype)
    spec = device_spec(device)
    available = backends(device, dtype, args.block_size)
    for name, why in available.items():
        if why:
            print(f"{name}: not measured ({why})")
    names = [n for n, why in available.items() if why is None]
    bytes_per_token = 2 * args.kv_heads * args.head_dim * dtype.itemsize    # K and V, one layer
    max_blocks = max(args.batch) * cdiv(args.context_len[1], args.block_size)
    num_blocks = max_blocks + max_blocks // 4     # the batch's blocks scattered over a larger pool
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    k_cache = torch.randn(shape, device=device).to(dtype)
    v_cache = torch.randn(shape, device=device).to(dtype)
    scale = args.head_dim ** -0.5
    threads = f", {torch.get_num_threads()} thread(s)" if device.type == "cpu" else ""
    print(f"decode attention, one layer, on {spec.name}{threads}: {args.heads} query heads over {args.kv_heads} KV "
          f"heads of {args.head_dim}, {args.dtype}, contexts {args.context_len[0]}-{args.context_len[1]} tokens, "
          f"blocks of {args.block_size} scattered over {num_blocks}; device bandwidth "
          f"{spec.peak_bandwidth_bytes_per_s / 1e9:,.0f} GB/s ({spec.bandwidth_source}); medians of {args.repeats}")
    rng = random.Random(args.seed)
    for batch in args.batch:
        step = decode_step(args, batch, num_blocks, rng)
        rows = prepare_inputs(step, args.block_size, StepBuffers(device), Route.TRITON).metadata.decode
        groups = prepare_inputs(step, args.block_size, StepBuffers(device), Route.REFERENCE).metadata.decode
        q = torch.randn(batch, args.heads, args.head_dim, device=device).to(dtype)
        calls = {n: kernel_call(n, q, k_cache, v_cache, rows, groups, scale) for n in names}
        if device.type == "cpu":   # the C kernel takes the reference's layout on the host
            rows.block_tables, rows.context_lens = rows.block_tables.contiguous(), rows.context_lens.contiguous()
        reference = calls["torch"]().float()
        kv_bytes = bytes_per_token * int(rows.context_lens.sum())
        times = {n: [] for n in names}
        for _ in range(args.repeats):     # alternated, so all see the same machine load
            for n in names:
                times[n].append(seconds_per_call(calls[n], device))
        for n in names:
            t = statistics.median(times[n])
            error = (calls[n]().float().view_as(reference) - reference).abs().max().item()
            rate = kv_bytes / t
            print(f"batch {batch:>4} {n:>10}: {t * 1e6:>10,.1f} µs, K/V read {kv_bytes / 2**20:>8,.1f} MiB at "
                  f"{rate / 1e9:>7,.1f} GB/s = {100 * rate / spec.peak_bandwidth_bytes_per_s:>5.1f}% of the device's "
                  f"(max difference from the reference {error:.1e})")
    return 0
