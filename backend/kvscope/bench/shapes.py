"""Model shapes the benchmarks can build without a download: `--model shape:NAME` writes
the shape's config.json to a temporary directory and loads random weights (dummy)."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": False,
          "bos_token_id": 0, "eos_token_id": 1, "max_position_embeddings": 4096}

SHAPES = {
    # 33M parameters: big enough that the matmuls, not the per-step overhead, dominate
    "m30": {**_QWEN3, "vocab_size": 8192, "hidden_size": 512, "num_hidden_layers": 8,
            "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 4,
            "head_dim": 64, "tie_word_embeddings": False, "torch_dtype": "float32"},
    # Qwen3-0.6B's shape, stored in bfloat16 as the real checkpoint is
    "qwen3-0.6b": {**_QWEN3, "vocab_size": 151936, "hidden_size": 1024, "num_hidden_layers": 28,
                   "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
                   "max_position_embeddings": 40960},
}
PREFIX = "shape:"


def resolve(model: str | None, load_format: str) -> tuple[str | None, str]:
    """(checkpoint directory or hub id, load format) for a --model value."""
    if model is None or not model.startswith(PREFIX):
        return model, load_format
    name = model.removeprefix(PREFIX)
    if name not in SHAPES:
        raise ValueError(f"unknown benchmark shape {name!r}; known: {', '.join(sorted(SHAPES))}")
    directory = Path(tempfile.mkdtemp(prefix="kvscope-shape-")) / name   # the model is named after it
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(SHAPES[name], indent=1))
    return str(directory), "dummy"


def checkpoint(model: str | None, seed: int = 0) -> str | None:
    """A directory with real weights for a --model value, so that another engine (vLLM,
    transformers) loads exactly the weights kvscope does: a shape:NAME gets random weights
    written once (seeded) under ~/.cache/kvscope/shapes/; anything else is returned as is."""
    if model is None or not model.startswith(PREFIX):
        return model
    name = model.removeprefix(PREFIX)
    if name not in SHAPES:
        raise ValueError(f"unknown benchmark shape {name!r}; known: {', '.join(sorted(SHAPES))}")
    directory = Path.home() / ".cache" / "kvscope" / "shapes" / f"{name}-seed{seed}" / name
    if not directory.is_dir():   # written under another name, then renamed: never half there
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        print(f"writing random {name} weights (seed {seed}) to {directory}, once...", flush=True)
        staging = directory.with_name(name + ".partial")
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "config.json").write_text(json.dumps(SHAPES[name], indent=1))
        torch.manual_seed(seed)
        dtype = getattr(torch, SHAPES[name]["torch_dtype"])
        model_ = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(staging), dtype=dtype)
        model_.save_pretrained(staging)
        staging.rename(directory)
    return str(directory)
