"""The architecture facts the engine needs, read from a Hugging Face config.json, and the
dtype they run in.

What `dtype="auto"` picks, and why (the reason is shown to the user): on a GPU, bfloat16.
On a CPU, bfloat16 halves the bytes every decode step reads, but it only pays where the
cores compute it natively (AVX512-BF16 or AMX); elsewhere each bf16 matmul converts to
float32 on the fly and is slower than plain float32. A checkpoint stored in float32 stays
float32 (halving it would change its numbers), and a tiny model whose weights sit in the
CPU caches gains nothing from fewer bytes."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.hardware import cpu_bf16_flags

SUPPORTED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    torch_dtype: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""

    @classmethod
    def from_dict(cls, cfg: dict, name: str = "") -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelConfigError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                f"kvscope runs {', '.join(SUPPORTED_ARCHITECTURES)}")
        family = SUPPORTED_ARCHITECTURES[arch]
        try:
            heads = cfg["num_attention_heads"]
            hidden = cfg["hidden_size"]
            rope, rope_theta = _rope_settings(cfg)
            eos = cfg.get("eos_token_id")
            return cls(
                architecture=arch, family=family, name=name,
                vocab_size=cfg["vocab_size"], hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"],
                num_layers=cfg["num_hidden_layers"], num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or hidden // heads,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                max_position_embeddings=cfg.get("max_position_embeddings", 4096),
                rope_theta=rope_theta, rope_scaling=rope,
                qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
                qk_norm=family == "qwen3",
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
                bos_token_id=cfg.get("bos_token_id"),
                eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            )
        except KeyError as missing:
            raise ModelConfigError(f"config.json lacks the field {missing}") from None

    @property
    def kv_elements_per_token(self) -> int:
        """K and V, every layer, every KV head: cache elements one token takes (times the dtype size = bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim


def _rope_settings(cfg: dict) -> tuple[dict, float]:
    """transformers 5 nests rope settings in `rope_parameters`; older files use
    `rope_theta` and `rope_scaling`. Both are accepted."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**params, **scaling}
    theta = float(merged.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelConfigError(f"unsupported rope scaling {rope_type!r}; "
                               f"kvscope supports {', '.join(SUPPORTED_ROPE_TYPES)}")
    merged["rope_type"] = rope_type
    return merged, theta


# -- the dtype ---------------------------------------------------------------------------
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
