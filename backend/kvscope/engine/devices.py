"""Device, dtype and KV-cache sizing defaults: what a sensible engine picks on CPU or GPU.

What `dtype="auto"` picks, and why (the reason is shown to the user): on a GPU, bfloat16.
On a CPU, bfloat16 halves the bytes every decode step reads, but it only pays where the
cores compute it natively (AVX512-BF16 or AMX); elsewhere each bf16 matmul converts to
float32 on the fly and is slower than plain float32. A checkpoint stored in float32 stays
float32 (halving it would change its numbers), and a tiny model whose weights sit in the
CPU caches gains nothing from fewer bytes."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kvscope.config import EngineConfig
from kvscope.hardware import cpu_bf16_flags
from kvscope.layers.kv_quant import kv_cache_format
from kvscope.models.config import ModelConfig

# On a CPU the KV cache takes this share of the memory available at start-up (as
# vLLM's VLLM_CPU_KVCACHE_SPACE sizes it by hand), and never more than the scheduler
# could fill: max_num_seqs sequences of max_model_len tokens.
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
    """One block's K and V across all layers, as stored (an 8-bit cache: half or a quarter)."""
    fmt = kv_cache_format(kv_cache_dtype, dtype)
    return block_size * fmt.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)


def host_memory() -> tuple[int, int]:
    """(total, available) host RAM in bytes, from /proc/meminfo (sysconf elsewhere)."""
    info = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, rest = line.split(":", 1)
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total
    return info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))


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
        budget, why = _free_cpu_budget(config, cfg, dtype, max_model_len)
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget / 2**20:.1f} MiB) is smaller than one block "
                         f"({per_block / 2**20:.2f} MiB)")
    return int(blocks), f"{int(blocks) * per_block / 2**20:,.0f} MiB, {int(blocks)} blocks ({why})"


def _free_cpu_budget(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype,
                     max_model_len: int) -> tuple[int, str]:
    available = host_memory()[1]
    share = int(available * CPU_KV_FRACTION)
    per_token = block_bytes(cfg, 1, dtype, config.kv_cache_dtype)
    fillable = config.max_num_seqs * max_model_len * per_token
    if fillable <= share:
        return fillable, (f"what {config.max_num_seqs} sequences of {max_model_len} tokens fill; "
                          f"{available / 2**30:.1f} GiB of memory available")
    return share, f"{CPU_KV_FRACTION:.0%} of the {available / 2**30:.1f} GiB of memory available"


def _free_gpu_budget(config: EngineConfig, cfg: ModelConfig, model, device: torch.device) -> int:
    """A fraction of the card, less the weights and the peak of one full-budget forward."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    _profile_forward(config, cfg, model, device)
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_allocated(device)
    return max(0, int(total * config.gpu_memory_utilization) - used_by_others - peak)


@torch.inference_mode()
def _profile_forward(config: EngineConfig, cfg: ModelConfig, model, device: torch.device) -> None:
    """Run the largest prefill the scheduler can issue, against a one-block cache."""
    from kvscope.layers.attention import PagedAttention
    from kvscope.layers.context import AttentionMetadata, PrefillSpan, step_metadata
    n = config.max_num_batched_tokens
    dtype = next(model.parameters()).dtype
    for layer in model.modules():
        if isinstance(layer, PagedAttention):
            layer.k_cache = torch.zeros(1, 1, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
            layer.v_cache = torch.zeros_like(layer.k_cache)
    ids = torch.zeros(n, dtype=torch.long, device=device)
    rope_len = model.model.rotary.cos_cache.shape[0]
    pos = torch.arange(n, device=device) % rope_len
    md = AttentionMetadata(slot_mapping=torch.zeros(n, dtype=torch.long, device=device),
                           prefills=[PrefillSpan(0, n, 0)], num_prefill_tokens=n)
    with step_metadata(md):
        hidden = model(ids, pos)
    model.compute_logits(hidden[-min(n, config.max_num_seqs):])
    torch.cuda.synchronize(device)


# -- dtype ---------------------------------------------------------------------------
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SIXTEEN_BIT = {"bfloat16", "float16"}
TINY_PARAMS = 50_000_000   # below this the weights are cache-sized: bandwidth is not the limit


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str


def approx_params(cfg: ModelConfig) -> int:
    """Parameters from the shapes in config.json (before loading anything)."""
    h, layers = cfg.hidden_size, cfg.num_layers
    attn = h * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = 3 * h * cfg.intermediate_size
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return layers * (attn + mlp) + embed


def choose_dtype(name: str, device: torch.device, cfg: ModelConfig,
                 native_bf16: list[str] | None = None) -> DtypeChoice:
    """`native_bf16`: the CPU's bf16 feature flags (read from /proc/cpuinfo when None)."""
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r}: use one of {', '.join(DTYPES)}")
        return DtypeChoice(DTYPES[name], "asked for")
    if device.type == "cuda":
        return DtypeChoice(torch.bfloat16, "auto: GPUs compute bfloat16 natively")
    flags = cpu_bf16_flags() if native_bf16 is None else native_bf16
    stored = (cfg.torch_dtype or "float32").removeprefix("torch.")
    params = approx_params(cfg)
    if not flags:
        return DtypeChoice(torch.float32, "auto: this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16), "
                                          "so float32 is faster")
    if stored not in SIXTEEN_BIT:
        return DtypeChoice(torch.float32, f"auto: the checkpoint is stored in {stored}")
    if params < TINY_PARAMS:
        return DtypeChoice(torch.float32, f"auto: a tiny model ({params / 1e6:.0f}M parameters) is not "
                                          "limited by memory bandwidth, and float32 is exact")
    return DtypeChoice(torch.bfloat16, f"auto: a {stored} checkpoint and a CPU with native bfloat16 "
                                       f"({', '.join(flags)}): half the bytes per step")
