"""From a checkpoint to a model: find it (a directory, the embedded default, a hub id), read its
architecture facts, choose the dtype, load its safetensors, with errors naming what is at fault."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from kvscope.hardware import cpu_bf16_flags
from kvscope.layers.parallel import (ColumnParallelLinear, RowParallelLinear, TPGroup, VocabParallelEmbedding,
                                     store_for_cpu_kernels)
from kvscope.models.decoder import CausalLM


# -- the architecture facts -----------------------------------------------------------------
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ModelConfigError(ValueError):
    """A config.json kvscope cannot run."""


@dataclass
class ModelConfig:
    architecture: str
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
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""

    @classmethod
    def from_dict(cls, cfg: dict, name: str = "") -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelConfigError(f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                                   f"kvscope runs {', '.join(SUPPORTED_ARCHITECTURES)}")
        try:
            heads = cfg["num_attention_heads"]
            hidden = cfg["hidden_size"]
            rope, rope_theta = _rope_settings(cfg)
            eos = cfg.get("eos_token_id")
            return cls(
                architecture=arch, name=name, vocab_size=cfg["vocab_size"], hidden_size=hidden,
                intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
                num_kv_heads=cfg.get("num_key_value_heads") or heads, head_dim=cfg.get("head_dim") or hidden // heads,
                rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                max_position_embeddings=cfg.get("max_position_embeddings", 4096),
                rope_theta=rope_theta, rope_scaling=rope, qk_norm=arch == "Qwen3ForCausalLM",
                qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
                eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)))
        except KeyError as missing:
            raise ModelConfigError(f"config.json lacks the field {missing}") from None

    @property
    def approx_params(self) -> int:   # from the shapes, before loading anything
        h = self.hidden_size
        attn, mlp = h * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads), 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp) + self.vocab_size * h * (1 if self.tie_word_embeddings else 2)


def _rope_settings(cfg: dict) -> tuple[dict, float]:
    """transformers 5 nests them in `rope_parameters`, older files in `rope_theta`/`rope_scaling`."""
    merged = {**(cfg.get("rope_parameters") or {}), **(cfg.get("rope_scaling") or {})}
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


def choose_dtype(name: str, device: torch.device, cfg: ModelConfig,
                 native_bf16: list[str] | None = None) -> tuple[torch.dtype, str]:
    """The dtype and why: bfloat16 on a GPU; on a CPU only where it computes bfloat16 natively
    (else each matmul converts), the checkpoint is 16-bit and the model is not cache-sized.
    `native_bf16`: the CPU's flags (read from /proc/cpuinfo when None)."""
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"unsupported dtype {name!r}: use one of {', '.join(DTYPES)}")
        return DTYPES[name], "asked for"
    if device.type == "cuda":
        return torch.bfloat16, "auto: GPUs compute bfloat16 natively"
    flags = cpu_bf16_flags() if native_bf16 is None else native_bf16
    stored = (cfg.torch_dtype or "float32").removeprefix("torch.")
    params = cfg.approx_params
    if not flags:
        return torch.float32, "auto: this CPU has no native bfloat16 (no avx512_bf16 or amx_bf16), so float32 is faster"
    if stored not in SIXTEEN_BIT:
        return torch.float32, f"auto: the checkpoint is stored in {stored}"
    if params < TINY_PARAMS:
        return torch.float32, (f"auto: a tiny model ({params / 1e6:.0f}M parameters) is not limited by memory "
                               "bandwidth, and float32 is exact")
    return torch.bfloat16, (f"auto: a {stored} checkpoint and a CPU with native bfloat16 ({', '.join(flags)}): "
                            "half the bytes per step")


# -- finding and loading a checkpoint ---------------------------------------------------------
class ModelLoadError(RuntimeError):
    """A checkpoint that cannot be used."""


def resolve_model_path(model: str | None) -> Path:
    if model is None:
        from kvscope.default_model import DefaultModelMissing, default_model_path
        try:
            return Path(default_model_path())
        except DefaultModelMissing as exc:
            raise ModelLoadError(str(exc)) from None
    from kvscope.default_model import DEFAULT_DRAFT_NAME, default_draft_path
    if model == DEFAULT_DRAFT_NAME and default_draft_path() is not None:
        return Path(default_draft_path())
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a model checkpoint: it has no config.json")
        return path
    if path.exists():
        raise ModelLoadError(f"{path} is a file; --model takes a checkpoint directory or a hub id")
    if model.count("/") != 1 or model.startswith((".", "/", "~")):
        raise ModelLoadError(f"no checkpoint directory at {model!r} (and it is not a hub id like 'Qwen/Qwen3-0.6B')")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as exc:  # offline, unknown repo, no permission: one line, not a traceback
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"could not get {model!r}: no local directory of that name, and the "
                             f"Hugging Face hub download failed ({reason[:160]})") from None


def read_model_config(path: Path) -> ModelConfig:
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path / 'config.json'}: {exc}") from None
    return ModelConfig.from_dict(raw, name=path.name)


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ModelLoadError(f"{path} is missing shard(s) named in {index.name}: {', '.join(missing)}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights (load_format='dummy' builds random ones)")
    return files


def load_weights(model: CausalLM, path: Path) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if not name.endswith("rotary_emb.inv_freq"):   # older checkpoints keep RoPE's frequencies
                        _load_tensor(model, params, name, f.get_slice(name), file, loaded)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"cannot read {file}: {exc}") from None
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"{path} lacks weights for: {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}")


def _load_tensor(model, params, name, tensor, file, loaded) -> None:
    """`tensor`: safetensors' lazy slice, so a tensor-parallel layer reads only its part."""
    target, shard = name, 0
    for fragment, (packed, index) in CausalLM.packed.items():
        if f".{fragment}." in name and name.replace(fragment, packed) in params:
            target, shard = name.replace(fragment, packed), index
            break
    if name == "lm_head.weight" and model.config.tie_word_embeddings:
        return   # tied: the embedding matrix already is the head
    if target not in params:
        raise ModelLoadError(f"{file.name}: unexpected tensor {name!r} for {model.config.architecture}")
    module = model.get_submodule(target.rsplit(".", 1)[0])
    shape, expected = tuple(tensor.get_shape()), _full_shape(module, params[target], shard)
    if shape != expected:
        raise ModelLoadError(f"{file.name}: tensor {name!r} has shape {shape}, the config implies {expected}")
    if hasattr(module, "load"):   # a tensor-parallel layer copies its own slice
        module.load(params[target], tensor, shard)
    else:
        params[target].data.copy_(tensor[:])
    loaded.add(target)   # a packed matrix is complete once every shard is copied


def _full_shape(module, param, shard: int) -> tuple[int, ...]:
    if isinstance(module, ColumnParallelLinear):
        return (module.local_sizes[shard] * module.tp.size, *param.shape[1:])
    if isinstance(module, RowParallelLinear):
        return (param.shape[0], module.local_in * module.tp.size)
    if isinstance(module, VocabParallelEmbedding):
        return (module.vocab_size, param.shape[1])
    return tuple(param.shape)


def build_model(path: Path, cfg: ModelConfig, load_format: str, dtype: torch.dtype,
                device: torch.device, max_position: int, seed: int = 0, tp: TPGroup = TPGroup()) -> CausalLM:
    model = CausalLM(cfg, max_position, tp)
    if load_format == "dummy":   # benchmarks: small normal values, norms at one
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            p.data.copy_(torch.ones(p.shape) if "norm" in name else torch.randn(p.shape, generator=gen) * 0.02)
    else:
        load_weights(model, path)
    model = model.to(device=device, dtype=dtype).eval()
    store_for_cpu_kernels(model)
    return model


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it ships none (dummy benchmark configs)."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {exc}") from None
