"""Rotary position embedding, computed exactly as transformers does (same float32 math),
so greedy outputs match the reference token for token."""
from __future__ import annotations

import math

import torch
from torch import nn


def inverse_frequencies(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_frequencies(inv_freq, scaling)
    return inv_freq


def _llama3_frequencies(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3 keeps high frequencies, divides low ones by `factor`, blends in between."""
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict):
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cache", emb.cos(), persistent=False)
        # sin with the first half negated: rotate_half(x) * sin == x.roll(half) * signed sin,
        # exactly (negation is exact), in one op instead of chunk, neg and cat
        half = head_dim // 2
        self.register_buffer("sin_cache", torch.cat((-emb[:, :half].sin(), emb[:, half:].sin()), dim=-1),
                             persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Looked up once per forward pass and shared by every layer: [tokens, 1, head_dim]."""
        return (self.cos_cache[positions].to(dtype).unsqueeze(1),
                self.sin_cache[positions].to(dtype).unsqueeze(1))


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor):
    """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]; signed_sin from cos_sin.
    Each half is rotated into the other: x * cos + (-x2, x1) * sin."""
    half = q.shape[-1] // 2
    return q * cos + q.roll(half, -1) * signed_sin, k * cos + k.roll(half, -1) * signed_sin
