"""Find a checkpoint (local directory, the embedded default, or a hub id) and load its
safetensors into the engine's model, with errors that name the file or tensor at fault."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open

from kvscope.layers.parallel import (ColumnParallelLinear, RowParallelLinear, SliceReader, TPGroup,
                                     VocabParallelEmbedding)
from kvscope.models.config import ModelConfig
from kvscope.models.decoder import CausalLM

IGNORED_TENSORS = ("rotary_emb.inv_freq",)


class ModelLoadError(RuntimeError):
    """A checkpoint that cannot be used; the message says what and where."""


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
    return _download(model)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as exc:  # offline, unknown repo, no permission: one line, not a traceback
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"could not get {repo_id!r}: no local directory of that name, and the "
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
                    if name.endswith(IGNORED_TENSORS):
                        continue
                    _load_tensor(model, params, name, SliceReader(f, name), file, loaded)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"cannot read {file}: {exc}") from None
    if model.config.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"{path} lacks weights for: {', '.join(missing[:5])}"
                             f"{' …' if len(missing) > 5 else ''}")


def _load_tensor(model, params, name, reader: SliceReader, file, loaded) -> None:
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
    expected = _full_shape(module, params[target], shard)
    if reader.shape != expected:
        raise ModelLoadError(f"{file.name}: tensor {name!r} has shape {reader.shape}, "
                             f"the config implies {expected}")
    if hasattr(module, "load"):   # a tensor-parallel layer copies its own slice
        module.load(params[target], reader, shard)
    else:
        params[target].data.copy_(reader.full())
    loaded.add(target)   # a packed matrix is complete once every shard is copied


def _full_shape(module, param, shard: int) -> tuple[int, ...]:
    """The checkpoint shape this parameter (or this shard of a packed one) comes from."""
    tp = getattr(module, "tp", None)
    if isinstance(module, ColumnParallelLinear):
        return (module.local_sizes[shard] * tp.size, *param.shape[1:])
    if isinstance(module, RowParallelLinear):
        return (param.shape[0], module.local_in * tp.size)
    if isinstance(module, VocabParallelEmbedding):
        return (module.vocab_size, param.shape[1])
    return tuple(param.shape)


def init_dummy_weights(model: CausalLM, seed: int) -> None:
    """Random weights for benchmarks: small normal values, norms at one."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "norm" in name:
            p.data.fill_(1.0)
        else:
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def build_model(path: Path, cfg: ModelConfig, load_format: str, dtype: torch.dtype,
                device: torch.device, max_position: int, seed: int = 0, tp: TPGroup = TPGroup()) -> CausalLM:
    model = CausalLM(cfg, max_position, tp)
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        load_weights(model, path)
    return model.to(device=device, dtype=dtype).eval()


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
