"""The start-up plan (`engine.plan`): the device, the attention backend, the KV pool's size."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from kvscope.config import EngineConfig
from kvscope.hardware import host_memory
from kvscope.layers import kernels
from kvscope.layers.attention import (FLASH_PAGE_MULTIPLE, KVCacheFormat, PrefillSpan, Routes, flash_fits,
                                      kv_cache_format, span_metadata, step_metadata)
from kvscope.layers.kernels import HAS_TRITON
from kvscope.models.loader import ModelConfig

log = logging.getLogger("kvscope.engine")


@dataclass(frozen=True)
class ExecutionPlan:
    """How this engine runs, fixed at start-up and logged once; stats, hello and benchmarks read it."""
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    attention_backend: str
    attention: Routes         # which kernels take the spans and the decode rows
    decode: str               # "eager", "compiled (...)" or "cuda graphs"; an eager fallback says why
    kv_format: KVCacheFormat  # its name is vLLM's kv_cache_dtype
    kv_cache_bytes: int       # every layer's K, V and scales, allocated once
    num_blocks: int
    block_size: int           # tokens a block holds
    enable_prefix_caching: bool
    kv_cache_sizing: str      # how the pool's size was chosen
    tensor_parallel_size: int
    scratch_slot: int         # the block past the pool's first slot: K/V written there is never read

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        ranks = f", {self.tensor_parallel_size} tensor-parallel ranks" if self.tensor_parallel_size > 1 else ""
        stored = f" stored as {self.kv_format.name}" if self.kv_format.quantized else ""
        return (f"{self.device}{ranks}, {self.dtype_name} ({self.dtype_reason}); attention {self.attention_backend} "
                f"({self.attention.describe()}), "
                f"decode {self.decode}; KV cache {self.kv_cache_sizing}, {self.block_size} tokens a block{stored}, "
                f"prefix caching {'on' if self.enable_prefix_caching else 'off'}")


# On a CPU the KV cache takes this share of the memory available (vLLM's VLLM_CPU_KVCACHE_SPACE
# sizes it by hand), never more than max_num_seqs sequences of max_model_len tokens fill.
CPU_KV_FRACTION = 0.25


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but PyTorch sees no CUDA GPU")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}: use cpu or cuda")
    return device


def block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    fmt = kv_cache_format(kv_cache_dtype, dtype)
    return block_size * fmt.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)


def kv_cache_blocks(config: EngineConfig, cfg: ModelConfig, model, device: torch.device,
                    dtype: torch.dtype, max_model_len: int) -> tuple[int, str]:
    """The pool's size in blocks, and how it was chosen (printed at start-up)."""
    per_block = block_bytes(cfg, config.block_size, dtype, config.kv_cache_dtype)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, f"{config.num_kv_blocks} blocks, as asked for"
    if config.kv_cache_memory_bytes is not None:
        budget, why = config.kv_cache_memory_bytes, "kv_cache_memory_bytes"
    elif device.type == "cuda":
        budget = _free_gpu_budget(config, cfg, model, device)
        why = f"{config.gpu_memory_utilization:.0%} of the GPU, less weights and activations"
    else:
        available = host_memory()[1]
        share = int(available * CPU_KV_FRACTION)
        fillable = config.max_num_seqs * max_model_len * per_block // config.block_size
        budget = min(share, fillable)
        why = (f"what {config.max_num_seqs} sequences of {max_model_len} tokens fill; " if fillable <= share
               else f"{CPU_KV_FRACTION:.0%} of the ") + f"{available / 2**30:.1f} GiB of memory available"
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget / 2**20:.1f} MiB) is smaller than one block "
                         f"({per_block / 2**20:.2f} MiB)")
    return int(blocks), f"{int(blocks) * per_block / 2**20:,.0f} MiB, {int(blocks)} blocks ({why})"


@torch.inference_mode()
def _free_gpu_budget(config: EngineConfig, cfg: ModelConfig, model, device: torch.device) -> int:
    """A fraction of the card, less the weights and the peak of the largest prefill the scheduler
    can issue (run against a one-block cache)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    n = config.max_num_batched_tokens
    dtype = next(model.parameters()).dtype
    for layer in model.attention_layers:
        layer.k_cache = torch.zeros(1, 1, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
        layer.v_cache = torch.zeros_like(layer.k_cache)
    zeros = torch.zeros(n, dtype=torch.long, device=device)   # token 0 everywhere, its K/V all to slot 0
    pos = torch.arange(n, device=device) % model.model.rotary.cos_cache.shape[0]
    with step_metadata(model, span_metadata(zeros, PrefillSpan(0, n, 0))):
        hidden = model(zeros, pos)
    model.compute_logits(hidden[-min(n, config.max_num_seqs):])
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_allocated(device)
    return max(0, int(total * config.gpu_memory_utilization) - used_by_others - peak)


def pick_attention_backend(requested: str, device: torch.device, dtype: torch.dtype, block_size: int,
                           head_dim: int, kv_format: KVCacheFormat) -> str:
    if kv_format.quantized:   # the kernels read unquantized caches; the reference dequantizes what it reads
        if requested not in ("auto", "torch"):
            raise ValueError(f"kv_cache_dtype={kv_format.name!r} is read by the 'torch' attention backend only, "
                             f"not {requested!r}")
        return "torch"
    triton_fits = HAS_TRITON and all(n > 0 and n & (n - 1) == 0 for n in (head_dim, block_size))   # powers of two
    if requested == "auto":
        if device.type != "cuda":
            # the C kernel reads K/V in place; where it cannot run, the reference gathers
            reason = kernels.cpu_unavailable(dtype)
            if reason and dtype in kernels.CPU_DTYPES:
                log.warning("attention: the CPU kernel is unavailable (%s); using the PyTorch reference", reason)
            return "torch" if reason else "cpu_paged"
        return "flash_attn" if flash_fits(dtype, block_size) else "triton" if triton_fits else "torch"
    if requested == "cpu_paged":
        reason = "it runs on CPUs" if device.type != "cpu" else kernels.cpu_unavailable(dtype)
        if reason:
            raise ValueError(f"attention_backend='cpu_paged' cannot run here: {reason}")
    if requested == "triton" and not triton_fits:
        raise ValueError("attention_backend='triton' needs the triton package, and a head_dim and "
                         "block_size that are powers of two")
    if requested == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the triton backend runs on CUDA (or on CPU under TRITON_INTERPRET=1)")
    if requested == "flash_attn" and not (device.type == "cuda" and flash_fits(dtype, block_size)):
        raise ValueError(f"attention_backend='flash_attn' needs flash-attn, CUDA, float16 or bfloat16 and a "
                         f"block_size multiple of {FLASH_PAGE_MULTIPLE}")
    return requested

