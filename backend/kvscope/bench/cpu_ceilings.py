"""What this CPU can do at most, measured (no spec sheet knows a laptop): how fast it
reads memory, how fast a matrix-vector product streams weights (the shape of a batch-1
decode step), and how many FLOP/s a large matrix multiply reaches (prefill, big batches).
`kvscope bench` divides what the engine achieved by these, so the fraction is honest."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class CpuCeilings:
    dtype: torch.dtype
    read_bytes_per_s: float     # summing a large tensor: reads only
    gemv_bytes_per_s: float     # a [N, N] weight times one vector, in `dtype`: weight bytes / time
    matmul_flops: float         # a square matrix multiply in `dtype`

    @property
    def bandwidth(self) -> float:
        """The read ceiling: the faster of a plain sum and a weight-streaming gemv."""
        return max(self.read_bytes_per_s, self.gemv_bytes_per_s)

    def limit_seconds(self, bytes_read: float, flops: float) -> tuple[float, str]:
        """The least time a run that reads `bytes_read` and computes `flops` can take here,
        and which ceiling binds it."""
        memory, compute = bytes_read / self.bandwidth, flops / self.matmul_flops
        return (memory, "memory-bound") if memory >= compute else (compute, "compute-bound")

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        return (f"CPU ceilings (measured, {threads_phrase()}): memory read "
                f"{self.read_bytes_per_s / 1e9:.1f} GB/s, {name} matrix-vector {self.gemv_bytes_per_s / 1e9:.1f} GB/s "
                f"of weights, {name} matmul {self.matmul_flops / 1e9:.0f} GFLOP/s")


def threads_phrase() -> str:
    n = torch.get_num_threads()
    return f"{n} thread" if n == 1 else f"{n} threads"


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@torch.inference_mode()
def measure(dtype: torch.dtype, size_mib: int = 256, repeats: int = 5) -> CpuCeilings:
    big = torch.ones(size_mib * 2**20 // 4)
    read = big.numel() * 4 / _best_seconds(big.sum, repeats)
    n = int((size_mib * 2**20 / torch.empty(0, dtype=dtype).element_size()) ** 0.5)
    weight, row = torch.randn(n, n).to(dtype), torch.randn(1, n).to(dtype)
    gemv = weight.numel() * weight.element_size() / _best_seconds(lambda: F.linear(row, weight), repeats)
    del big, weight
    a, b = torch.randn(1024, 1024).to(dtype), torch.randn(1024, 1024).to(dtype)
    flops = 2 * 1024 ** 3 / _best_seconds(lambda: a @ b, repeats)
    return CpuCeilings(dtype, read, gemv, flops)


def report(engine, seconds: float, bytes_read: float, flops: float, ceilings: CpuCeilings | None = None) -> list[str]:
    """The ceilings line, then what a run that read `bytes_read` and computed `flops` in
    `seconds` reached of them. Empty on a GPU (the roofline line uses its spec sheet).
    `ceilings`: measured already (at the bench's start); measured now when not given."""
    if engine.device.type != "cpu":
        return []
    c = ceilings or measure(engine.dtype)
    achieved_bw, achieved_flops = bytes_read / seconds, flops / seconds
    return [c.describe(),
            f"achieved: {achieved_bw / 1e9:.1f} GB/s of weights and KV read = {100 * achieved_bw / c.gemv_bytes_per_s:.0f}% "
            f"of the matrix-vector ceiling; {achieved_flops / 1e9:.1f} GFLOP/s = "
            f"{100 * achieved_flops / c.matmul_flops:.0f}% of the matmul ceiling"]
