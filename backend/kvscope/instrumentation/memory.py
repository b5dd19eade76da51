"""The `memory` event: where the device's memory goes (weights, KV cache allocated and in
use, activations) against what the device has."""
from __future__ import annotations

import os

import torch

from kvscope.hardware import host_memory
from kvscope.instrumentation.facts import ModelFacts


def process_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def activation_bytes(facts: ModelFacts, num_tokens: int, num_sampled: int) -> int:
    """The largest tensors alive at once in one layer for a step of `num_tokens`: the
    residual stream and its normed copy, packed q/k/v, the MLP's gate+up and product, and
    the float32 logits of the sampled rows."""
    qkv = (facts.num_heads + 2 * facts.num_kv_heads) * facts.head_dim
    per_token = 2 * facts.hidden_size + qkv + 3 * facts.intermediate_size
    return num_tokens * per_token * facts.dtype_bytes + num_sampled * facts.vocab_size * 4


def memory_event(engine, facts: ModelFacts, last_tokens: int, last_sampled: int, ts: float) -> dict:
    plan, knobs, used = engine.plan, engine.knobs(), engine.num_used_blocks
    block_bytes = facts.kv_bytes_per_token * plan.block_size
    activations = activation_bytes(facts, last_tokens, last_sampled)
    peak = activation_bytes(facts, knobs["max_num_batched_tokens"], knobs["max_num_seqs"])
    if plan.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(plan.device)
        measured = torch.cuda.max_memory_allocated(plan.device) - facts.weight_bytes - plan.kv_cache_bytes
        peak = max(peak, measured)
        process = torch.cuda.memory_reserved(plan.device)
    else:
        total, free = host_memory()
        process = process_rss()
    return {"type": "memory", "ts": ts, "device_total_bytes": int(total), "device_free_bytes": int(free),
            "weights_bytes": facts.weight_bytes, "kv_cache_bytes": plan.kv_cache_bytes,
            "kv_used_bytes": used * block_bytes, "kv_used_blocks": used,
            "num_blocks": plan.num_blocks, "block_bytes": block_bytes,
            "activations_bytes": int(activations), "activations_peak_bytes": int(max(peak, 0)),
            "process_bytes": int(process), "kv_cache_dtype": plan.kv_format.name}
