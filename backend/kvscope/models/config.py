"""The architecture facts the engine needs, read from a Hugging Face config.json."""
from __future__ import annotations

from dataclasses import dataclass, field

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
