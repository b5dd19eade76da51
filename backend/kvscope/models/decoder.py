"""One decoder for Qwen3 (q/k norm), Qwen2 (qkv bias) and Llama 3 (scaled RoPE), q/k/v and gate/up
packed into one matrix each; under tensor parallelism each rank builds it with its slices."""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kvscope.layers.attention import AttentionContext, PagedAttention
from kvscope.layers.parallel import (ColumnParallelLinear, ParallelLMHead, RowParallelLinear, TPGroup,
                                     VocabParallelEmbedding, split)

if TYPE_CHECKING:   # the loader builds this model from a ModelConfig: imported for annotations only
    from kvscope.models.loader import ModelConfig


# -- rotary position embedding, in transformers' float32 math (greedy outputs match it token for token)
def inverse_frequencies(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind != "llama3":
        return inv_freq
    # Llama 3 keeps high frequencies, divides low ones by `factor`, blends in between
    factor, low, high = scaling["factor"], scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling.get("original_max_position_embeddings", 8192)
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
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]   # each half's angles
        self.register_buffer("cos_cache", torch.cat((freqs.cos(), freqs.cos()), dim=-1), persistent=False)
        # sin with its first half negated: rotate_half(x) * sin == x.roll(half) * signed sin, in one op
        self.register_buffer("sin_cache", torch.cat((-freqs.sin(), freqs.sin()), dim=-1), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Looked up once per forward pass and shared by every layer: [tokens, 1, head_dim]."""
        return (self.cos_cache[positions].to(dtype).unsqueeze(1),
                self.sin_cache[positions].to(dtype).unsqueeze(1))


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor):
    half = q.shape[-1] // 2
    return q * cos + q.roll(half, -1) * signed_sin, k * cos + k.roll(half, -1) * signed_sin


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # normalised in float32 as transformers does
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Elementwise:
    """A layer's element-wise steps; `fused()` compiles each into one kernel (as nano-vllm does):
    ~20 launches a layer become ~5 in CUDA graphs. Compiled once per process."""
    rotary, norm, activation = staticmethod(apply_rotary), staticmethod(rms_norm), staticmethod(silu_and_mul)

    @classmethod
    @functools.cache
    def fused(cls) -> "Elementwise":
        fused = cls()
        for name in ("rotary", "norm", "activation"):
            setattr(fused, name, torch.compile(getattr(cls, name), dynamic=True))
        return fused


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = Elementwise()   # its own: see parallel.own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.norm(x, self.weight, self.eps)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        heads = split(cfg.num_heads, tp, "num_attention_heads")
        kv_heads = split(cfg.num_kv_heads, tp, "num_key_value_heads")
        self.heads = [heads, kv_heads, kv_heads]   # this rank's q, k and v heads
        full_q, full_kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [full_q, full_kv, full_kv], cfg.qkv_bias, tp,
                                             "attention heads")
        self.o_proj = RowParallelLinear(full_q, cfg.hidden_size, tp, "attention heads")
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.attn = PagedAttention(heads, kv_heads, cfg.head_dim, layer_idx)
        self.ops = Elementwise()   # its own: see parallel.own

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).view(x.shape[0], -1, self.attn.head_dim).split(self.heads, dim=1)
        if self.q_norm is not None:   # Qwen3
            q, k = self.q_norm(q), self.k_norm(k)
        return self.o_proj(self.attn(*self.ops.rotary(q, k, *rope), v))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [inter, inter], False, tp, "intermediate_size")
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, tp, "intermediate_size")
        self.ops = Elementwise()   # its own: see parallel.own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.activation(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = SelfAttention(cfg, layer_idx, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, tp)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(rope, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, max_position: int, tp: TPGroup):
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(rope, x)
        return self.norm(x)


class CausalLM(nn.Module):
    # checkpoint name fragment -> (packed parameter, shard index)
    packed = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
              "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}

    def __init__(self, cfg: ModelConfig, max_position: int, tp: TPGroup = TPGroup()):
        super().__init__()
        self.config, self.tp = cfg, tp
        self.model = DecoderModel(cfg, max_position, tp)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.attention_context = AttentionContext()   # the step's metadata, read by every attention layer
        self.attention_layers = [m for m in self.modules() if isinstance(m, PagedAttention)]
        for layer in self.attention_layers:
            layer.attention_context = self.attention_context

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def fuse_elementwise(self) -> None:
        fused = Elementwise.fused()
        for module in self.modules():
            if hasattr(module, "ops"):
                module.ops = fused
