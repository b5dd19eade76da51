"""Device, dtype and KV-cache sizing defaults: what a sensible engine picks on CPU or GPU."""
from __future__ import annotations

import torch

from kvscope.config import EngineConfig
from kvscope.models.config import ModelConfig

DEFAULT_CPU_KV_MIB = 256


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but PyTorch sees no CUDA GPU")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}: use cpu or cuda")
    return device


def block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return block_size * cfg.kv_elements_per_token * torch.empty(0, dtype=dtype).element_size()


def kv_cache_blocks(config: EngineConfig, cfg: ModelConfig, model, device: torch.device,
                    dtype: torch.dtype) -> int:
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = block_bytes(cfg, config.block_size, dtype)
    if config.kv_cache_mib is not None:
        budget = config.kv_cache_mib * 2**20
    elif device.type == "cuda":
        budget = _free_gpu_budget(config, cfg, model, device)
    else:
        budget = DEFAULT_CPU_KV_MIB * 2**20
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget / 2**20:.1f} MiB) is smaller than one block "
                         f"({per_block / 2**20:.2f} MiB)")
    return int(blocks)


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
