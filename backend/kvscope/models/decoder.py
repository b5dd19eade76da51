"""One decoder-only transformer covering Qwen3 (q/k RMSNorm), Qwen2 (qkv bias) and
Llama 3 (scaled RoPE). Weights are laid out as in Hugging Face checkpoints, except that
q/k/v and gate/up are packed into one matrix each (one matmul instead of three or two).
Under tensor parallelism (`tp`) each rank builds the same model with its slice of every
matrix: its share of the query and KV heads, of the MLP width and of the vocabulary."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvscope.layers.attention import PagedAttention
from kvscope.layers.parallel import (ColumnParallelLinear, ParallelLMHead, RowParallelLinear, TPGroup,
                                     VocabParallelEmbedding, split)
from kvscope.layers.rotary import RotaryEmbedding, apply_rotary
from kvscope.models.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalised in float32 as transformers does, in one fused op (fewer kernels per step)
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, tp: TPGroup):
        super().__init__()
        self.num_heads = split(cfg.num_heads, tp, "num_attention_heads")
        self.num_kv_heads = split(cfg.num_kv_heads, tp, "num_key_value_heads")
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * cfg.head_dim
        self.kv_size = self.num_kv_heads * cfg.head_dim
        full_q, full_kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = ColumnParallelLinear(cfg.hidden_size, [full_q, full_kv, full_kv], cfg.qkv_bias, tp,
                                             "attention heads")
        self.o_proj = RowParallelLinear(full_q, cfg.hidden_size, tp, "attention heads")
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, cfg.head_dim, layer_idx)

    def forward(self, rope: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k = self._rotated_queries_and_keys(qkv, rope)
        v = qkv[:, self.q_size + self.kv_size:].view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(q, k, v))

    def _rotated_queries_and_keys(self, qkv: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k out of the packed qkv rows, normalised (Qwen3) and rotated by RoPE."""
        q = qkv[:, :self.q_size].view(-1, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size:self.q_size + self.kv_size].view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, k, *rope)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(cfg.hidden_size, [inter, inter], False, tp, "intermediate_size")
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, tp, "intermediate_size")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


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
    packed = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, max_position: int, tp: TPGroup = TPGroup()):
        super().__init__()
        self.config, self.tp = cfg, tp
        self.model = DecoderModel(cfg, max_position, tp)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

