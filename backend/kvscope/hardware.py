"""What the device can do: memory, peak bandwidth and FLOP/s — public spec-sheet figures
for known GPUs, a measured copy bandwidth for the host CPU — and how a host tensor reaches
it without waiting."""
from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import asdict, dataclass

import torch

# name fragment -> (HBM bytes/s, dense bf16 FLOP/s); public spec-sheet figures
GPU_SPECS = {
    "H200": (4.8e12, 989e12),
    "H100 PCIe": (2.0e12, 756e12),
    "H100": (3.35e12, 989e12),
    "A100": (2.0e12, 312e12),
    "L40S": (0.864e12, 362e12),
    "L4": (0.3e12, 121e12),
    "RTX 4090": (1.008e12, 165e12),
    "RTX 4070": (0.504e12, 58e12),
}
H100_SXM = {"name": "NVIDIA H100 SXM", "hbm_bytes": 80e9, "hbm_bandwidth_bytes_per_s": 3.35e12,
            "l2_bytes": 50e6, "num_sms": 132, "shared_memory_per_sm_bytes": 228 * 1024,
            "peak_bf16_flops": 989e12, "pcie_bytes_per_s": 64e9, "nvlink_bytes_per_s": 900e9}


@dataclass
class DeviceSpec:
    type: str
    name: str
    total_memory_bytes: int
    peak_bandwidth_bytes_per_s: float
    peak_flops: float
    bandwidth_source: str   # "spec sheet" or "measured"

    def as_dict(self) -> dict:
        return asdict(self)


def device_spec(device: torch.device) -> DeviceSpec:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        bw, flops = next((v for k, v in GPU_SPECS.items() if k in props.name), (1e12, 100e12))
        return DeviceSpec("cuda", props.name, props.total_memory, bw, flops, "spec sheet")
    return _cpu_spec()


@functools.lru_cache(maxsize=1)
def _cpu_spec() -> DeviceSpec:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), name)
    except OSError:
        pass
    return DeviceSpec("cpu", name, host_memory()[0], measure_copy_bandwidth(), measure_matmul_flops(), "measured")


def host_memory() -> tuple[int, int]:
    """(total, available) host RAM in bytes, from /proc/meminfo (sysconf elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            info = {key: int(rest.split()[0]) * 1024 for key, rest in (line.split(":", 1) for line in f)}
    except (OSError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total
    return info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))


@functools.lru_cache(maxsize=1)
def cpu_bf16_flags() -> list[str]:
    """The CPU feature flags that mean bfloat16 arithmetic in hardware (x86 Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    except OSError:
        return []
    return [f for f in ("avx512_bf16", "amx_bf16") if f in flags]


def measure_matmul_flops(size: int = 512, repeats: int = 5) -> float:
    """FLOP/s of a float32 matrix multiply on the threads torch uses, best of a few runs."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * size ** 3 / best


def measure_copy_bandwidth(size_mib: int = 128, repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy (read + write counted), best of a few runs."""
    src = torch.ones(size_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() * 4 / best


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. To a GPU through pinned memory without waiting: a plain copy
    from pageable memory blocks the host until the GPU has done all it was given (the profile's
    cudaStreamSynchronize a copy); a decode step's one wait is then its sampled ids."""
    return host if device.type == "cpu" else host.pin_memory().to(device, non_blocking=True)
