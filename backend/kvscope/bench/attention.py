"""`kvscope bench attention`: one layer's decode attention on a CPU, the reference (gather
each context, then scaled_dot_product_attention) against the C kernel that reads blocks in
place, on the same step: a batch of sequences whose blocks are scattered over a pool of the
engine's default size, prepared exactly as the engine prepares a decode step."""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import StepBuffers, prepare_inputs
from kvscope.layers import attention, kernels
from kvscope.engine.block_manager import cdiv
from kvscope.sampling_params import SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--context-len", type=int, nargs=2, metavar=("MIN", "MAX"), default=[32, 512])
    p.add_argument("--heads", type=int, default=8, help="query heads (default: the embedded model's)")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--pool-mib", type=int, default=256, help="K and V pool of one layer, MiB each")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=5, help="alternate the two N times; report medians")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def decode_step(args, batch: int, num_blocks: int, rng: random.Random):
    """A decode step of `batch` sequences whose blocks are drawn at random from the pool."""
    free = rng.sample(range(num_blocks), k=num_blocks)
    out = SchedulerOutput(step=0)
    for _ in range(batch):
        length = rng.randint(*args.context_len)
        seq = Sequence([0] * length, SamplingParams())
        seq.block_table = [free.pop() for _ in range(cdiv(length, args.block_size))]
        seq.num_computed_tokens = length - 1
        out.entries.append(ScheduledSeq.row(seq, 1))
    return prepare_inputs(out, args.block_size, StepBuffers(torch.device("cpu")), "torch").metadata


def _time(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def run(args) -> int:
    dtype = getattr(torch, args.dtype)
    reason = kernels.cpu_unavailable(dtype)
    if reason:
        print(f"the C kernel cannot run here: {reason}")
        return 1
    bytes_per_slot = args.kv_heads * args.head_dim * dtype.itemsize
    num_blocks = args.pool_mib * 2**20 // (args.block_size * bytes_per_slot)
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    k_cache, v_cache = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    scale = args.head_dim ** -0.5
    print(f"decode attention, one layer: {args.heads} query heads over {args.kv_heads} KV heads of "
          f"{args.head_dim}, {args.dtype}, contexts {args.context_len[0]}-{args.context_len[1]} tokens, "
          f"blocks of {args.block_size} scattered over {num_blocks} ({args.pool_mib} MiB each for K and V), "
          f"{torch.get_num_threads()} thread(s); medians of {args.repeats}")
    rng = random.Random(args.seed)
    for batch in args.batch:
        md = decode_step(args, batch, num_blocks, rng)
        q = torch.randn(batch, args.heads, args.head_dim).to(dtype)
        reference = lambda: attention.decode_attention(q, k_cache, v_cache, md, scale)   # noqa: E731
        kernel = lambda: kernels.cpu_decode(q, k_cache, v_cache, md.block_tables, md.context_lens, scale)  # noqa: E731
        error = (kernel().float() - reference().float()).abs().max().item()
        calls = max(3, 2000 // batch)
        times = {"reference": [], "kernel": []}
        for _ in range(args.repeats):     # alternated, so both see the same machine load
            times["reference"].append(_time(reference, calls))
            times["kernel"].append(_time(kernel, calls))
        ref, ker = (statistics.median(times[k]) for k in ("reference", "kernel"))
        kv_bytes = 2 * int(md.context_lens.sum()) * bytes_per_slot
        print(f"batch {batch:>4}: reference {ref * 1e6:>8,.0f} µs, kernel {ker * 1e6:>8,.0f} µs "
              f"({ref / ker:.1f}x faster, reads K/V at {kv_bytes / ker / 1e9:.1f} GB/s; "
              f"max difference {error:.1e})")
    return 0
