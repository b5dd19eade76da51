"""Small random-weight Hugging Face checkpoints built in the test (no download), one per
supported family, saved as real checkpoint directories."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 512


def family_config(family: str, **overrides):
    """overrides: other sizes (vLLM's CPU attention needs heads of at least 32: hidden_size=128)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  initializer_range=0.1, tie_word_embeddings=False, eos_token_id=VOCAB - 1,
                  bos_token_id=VOCAB - 2)
    common.update(overrides)
    if family == "qwen3":
        return Qwen3Config(head_dim=32, rms_norm_eps=1e-6, **common)
    if family == "qwen2":
        return Qwen2Config(rms_norm_eps=1e-6, **common)
    if family == "llama":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256, "rope_theta": 500000.0}
        return LlamaConfig(rope_scaling=rope, rms_norm_eps=1e-5, **common)
    raise ValueError(family)


def make_checkpoint(family: str, directory: Path, seed: int = 0, tie: bool = False, **overrides) -> Path:
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = family_config(family, **overrides)
    cfg.tie_word_embeddings = tie
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if family == "qwen2":   # random (non-zero) qkv biases so the bias path is exercised
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.1)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    return directory


def hf_greedy(directory: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Reference: transformers' own greedy generation, one unpadded prompt at a time."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=max_new_tokens)
            outs.append(gen[0, len(p):].tolist())
    return outs
