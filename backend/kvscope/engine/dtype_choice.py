"""What `dtype="auto"` picks, and why (the reason is shown to the user).

On a GPU: bfloat16. On a CPU, bfloat16 halves the bytes every decode step reads, but it
only pays where the cores compute it natively (AVX512-BF16 or AMX); elsewhere each bf16
matmul converts to float32 on the fly and is slower than plain float32. A checkpoint
stored in float32 stays float32 (halving it would change its numbers), and a tiny model
whose weights sit in the CPU caches gains nothing from fewer bytes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope.hardware import cpu_bf16_flags
from kvscope.models.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SIXTEEN_BIT = {"bfloat16", "float16"}
TINY_PARAMS = 50_000_000   # below this the weights are cache-sized: bandwidth is not the limit


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


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
