"""The roofline cost of one step: bytes it must read and write, FLOPs it must do, what the
engine achieved, and what the same step would take on an H100 at its roofline.

Decode is memory-bound: every weight is read once per step whatever the batch, so
batching more sequences into a step raises FLOPs per byte (arithmetic intensity)."""
from __future__ import annotations

from kvscope.hardware import H100_SXM
from kvscope.instrumentation.facts import ModelFacts

H100_DTYPE_BYTES = 2   # the same step in bfloat16


def attention_pairs(start: int, num_tokens: int) -> int:
    """Query-key pairs a causal chunk computes: query at position p sees p + 1 keys."""
    first, last = start + 1, start + num_tokens
    return (first + last) * num_tokens // 2


def step_cost(facts: ModelFacts, work: list[tuple[int, int, bool]], model_seconds: float) -> dict:
    """work: (start, num_tokens, samples) per scheduled sequence."""
    tokens = sampled = context = pairs = 0
    for start, n, samples in work:   # one pass: every step of a served class computes this
        tokens += n
        sampled += samples
        context += start + n
        pairs += attention_pairs(start, n)
    kv_token = facts.kv_bytes_per_token
    weight_bytes = facts.read_weight_bytes
    kv_read, kv_write = context * kv_token, tokens * kv_token
    total = weight_bytes + kv_read + kv_write
    flops = (2 * facts.layer_matmul_params * tokens
             + 4 * facts.num_layers * facts.num_heads * facts.head_dim * pairs
             + 2 * facts.lm_head_params * sampled)
    seconds = max(model_seconds, 1e-9)
    h100_bytes = total * H100_DTYPE_BYTES // facts.dtype_bytes
    mem_t = h100_bytes / H100_SXM["hbm_bandwidth_bytes_per_s"]
    cmp_t = flops / H100_SXM["peak_bf16_flops"]
    return {
        "weight_bytes": weight_bytes, "kv_read_bytes": kv_read, "kv_write_bytes": kv_write,
        "bytes": total, "flops": flops,
        "achieved_bytes_per_s": total / seconds, "achieved_flops_per_s": flops / seconds,
        "arithmetic_intensity": flops / total if total else 0.0,
        "h100": {"dtype": "bfloat16", "bytes": h100_bytes, "flops": flops,
                 "memory_time_s": mem_t, "compute_time_s": cmp_t, "time_s": max(mem_t, cmp_t),
                 "bound": "memory" if mem_t >= cmp_t else "compute"},
    }
