"""Where the embedded default model (kvscope-mini) lives: package data, not the current directory."""
from __future__ import annotations

import os
from importlib import resources

DEFAULT_MODEL_NAME = "kvscope-mini"
DEFAULT_DRAFT_NAME = "kvscope-mini-draft"   # a smaller model with kvscope-mini's tokenizer
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class DefaultModelMissing(FileNotFoundError):
    pass


def default_model_path() -> str:
    """Directory of the shipped kvscope-mini checkpoint, usable by `from_pretrained` and `LLM()`.

    Found through the installed `kvscope` package (importlib.resources), so it works from any
    working directory and from a wheel install as well as an editable one.
    """
    folder = resources.files("kvscope") / "assets" / DEFAULT_MODEL_NAME
    path = os.fspath(folder) if isinstance(folder, os.PathLike) else None
    missing = [f for f in _REQUIRED if path is None or not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise DefaultModelMissing(
            f"the embedded default model is missing or incomplete at {folder} "
            f"(no {', '.join(missing)}). Reinstall kvscope from a checkout that contains "
            f"backend/kvscope/assets/{DEFAULT_MODEL_NAME}/, retrain it with "
            f"`python -m kvscope.training.train --out backend/kvscope/assets/{DEFAULT_MODEL_NAME}`, "
            f"or pass --model with a Hugging Face checkpoint.")
    return path


def default_draft_path() -> str | None:
    """Directory of the shipped draft model for speculative decoding, or None if absent.
    `speculative_config={"model": "kvscope-mini-draft", ...}` names it."""
    folder = resources.files("kvscope") / "assets" / DEFAULT_DRAFT_NAME
    path = os.fspath(folder) if isinstance(folder, os.PathLike) else None
    ok = path is not None and all(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "model.safetensors"))
    return path if ok else None
