"""The fused CPU elementwise kernels (layers/cpu_fused.c) against the PyTorch expressions
the model uses everywhere else: RMSNorm, q/k norm with RoPE, and SwiGLU's gate."""
import pytest
import torch
import torch.nn.functional as F

from kvscope.layers import cpu_fused
from kvscope.layers.rotary import RotaryEmbedding, apply_rotary
from kvscope.models.config import ModelConfig
from kvscope.models.decoder import CausalLM


def test_the_kernels_build_here():
    assert cpu_fused.applies(torch.zeros(1)), "the fused kernels should build on the test machines"


def reference_norm(x, weight, eps):
    return weight * F.rms_norm(x, x.shape[-1:], eps=eps)


# 40,000 rows of 32 and 300 of 256 cross the size at which rows are split among threads
@pytest.mark.parametrize("rows,dim", [(1, 8), (7, 256), (300, 256), (40_000, 32)])
def test_rms_norm_equals_pytorch(rows, dim):
    g = torch.Generator().manual_seed(rows + dim)
    x, weight = torch.randn(rows, dim, generator=g) * 3, torch.randn(dim, generator=g)
    torch.testing.assert_close(cpu_fused.rms_norm(x, weight, 1e-6), reference_norm(x, weight, 1e-6))


def test_rms_norm_reads_heads_in_place_from_a_packed_matrix():
    qkv = torch.randn(13, 8 * 16 + 2 * 2 * 16)
    k = qkv[:, 128:160].view(-1, 2, 16)          # strided: rows 192 floats apart
    weight = torch.randn(16)
    got = cpu_fused.rms_norm(k, weight, 1e-5)
    assert got.shape == (13, 2, 16) and got.is_contiguous()
    torch.testing.assert_close(got, reference_norm(k, weight, 1e-5))
    x = torch.randn(4, 6, 32).transpose(0, 1)    # last dimension not contiguous: copied first
    torch.testing.assert_close(cpu_fused.rms_norm(x, weight.repeat(2), 1e-5),
                               reference_norm(x, weight.repeat(2), 1e-5))


def test_rms_norm_of_zeros_is_zero():
    assert cpu_fused.rms_norm(torch.zeros(3, 64), torch.ones(64), 1e-6).abs().max() == 0


@pytest.mark.parametrize("head_dim", [16, 32, 128])
@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("tokens", [1, 9, 700])
def test_qk_norm_rope_equals_norm_then_rotary(head_dim, normed, tokens):
    heads, kv_heads = 4, 2
    g = torch.Generator().manual_seed(head_dim * tokens + normed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=g)
    q = qkv[:, :heads * head_dim].view(-1, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(-1, kv_heads, head_dim)
    q_weight, k_weight = (torch.randn(head_dim, generator=g) for _ in range(2))
    rope = RotaryEmbedding(head_dim, 4096, 10000.0, {}).cos_sin(
        torch.randint(0, 4096, (tokens,), generator=g), torch.float32)
    if normed:
        q, k = reference_norm(q, q_weight, 1e-6), reference_norm(k, k_weight, 1e-6)
    want_q, want_k = apply_rotary(q, k, *rope)
    got_q, got_k = cpu_fused.qk_norm_rope(qkv, heads, kv_heads, head_dim, q_weight if normed else None,
                                          k_weight if normed else None, 1e-6, *rope)
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(got_k, want_k)


def test_qk_norm_rope_refuses_heads_past_its_buffer():
    with pytest.raises(ValueError, match="head_dim 1024"):
        cpu_fused.qk_norm_rope(torch.zeros(1, 3 * 1024), 1, 1, 1024, None, None, 0.0,
                               torch.zeros(1, 1, 1024), torch.zeros(1, 1, 1024))


@pytest.mark.parametrize("rows,inter", [(1, 8), (5, 768), (64, 768)])
def test_silu_mul_equals_pytorch(rows, inter):
    gate_up = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(rows)) * 4
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_fused.silu_mul(gate_up), F.silu(gate) * up)


def test_silu_mul_stays_finite_where_exp_overflows():
    # the kernel is built with -ffast-math, which assumes exp never overflows
    gate = torch.tensor([-3e38, -1e4, -100.0, -88.0, -87.0, 0.0, 88.0, 1e4])
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)])[None]
    got = cpu_fused.silu_mul(gate_up)
    assert not got.isnan().any()
    torch.testing.assert_close(got, F.silu(gate)[None] * 2)


def test_not_for_bfloat16_gpus_or_compiled_graphs():
    assert not cpu_fused.applies(torch.zeros(2, dtype=torch.bfloat16))
    assert not cpu_fused.applies(torch.zeros(2, device="meta"))
    seen = []

    @torch.compile(fullgraph=True, backend="eager")
    def traced(x):
        seen.append(cpu_fused.applies(x))
        return x + 1

    traced(torch.zeros(2))
    assert seen == [False]


@pytest.mark.parametrize("qk_norm,qkv_bias,head_dim", [(True, False, 16), (False, True, 16), (True, False, 520)])
def test_a_model_forward_is_the_same_with_and_without_the_kernels(monkeypatch, qk_norm, qkv_bias, head_dim):
    """head_dim 520 is past qk_norm_rope's buffer: those heads keep PyTorch's expressions."""
    cfg = ModelConfig(architecture="Qwen3ForCausalLM", family="qwen3", vocab_size=64, hidden_size=64,
                      intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=head_dim,
                      rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling={}, qk_norm=qk_norm,
                      qkv_bias=qkv_bias, tie_word_embeddings=False, max_position_embeddings=128)
    torch.manual_seed(0)
    model = CausalLM(cfg, 128)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    layer = model.model.layers[0]
    x = torch.randn(11, 64)
    rope = model.model.rotary.cos_sin(torch.arange(11), torch.float32)
    calls = []
    for name in ("rms_norm", "qk_norm_rope", "silu_mul"):
        real = getattr(cpu_fused, name)
        monkeypatch.setattr(cpu_fused, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    attention = layer.self_attn.attn
    monkeypatch.setattr(attention, "forward", lambda q, k, v: q.flatten(1) * 0.5)   # no KV cache here
    fused = layer(rope, x)
    heads_fused = {"qk_norm_rope"} if head_dim <= cpu_fused.MAX_HEAD_DIM else set()
    assert set(calls) == {"rms_norm", "silu_mul"} | heads_fused
    monkeypatch.setattr(cpu_fused, "_lib", lambda: None)
    calls.clear()
    torch.testing.assert_close(fused, layer(rope, x))
    assert calls == []
