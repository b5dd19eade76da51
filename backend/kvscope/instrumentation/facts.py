"""Static facts about the loaded model, the device and the engine: the `hello` event, and
the constants the per-step cost model needs."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kvscope import __version__
from kvscope.hardware import H100_SXM, device_spec
from kvscope.instrumentation.schema import CAPABILITIES, SCHEMA_VERSION


def h100_reference() -> dict:
    """The public H100 SXM figures, in the hello event's field names."""
    h = H100_SXM
    return {"name": h["name"], "memory_bytes": int(h["hbm_bytes"]),
            "bandwidth_bytes_per_s": h["hbm_bandwidth_bytes_per_s"], "l2_bytes": int(h["l2_bytes"]),
            "num_sms": h["num_sms"], "smem_per_sm_bytes": h["shared_memory_per_sm_bytes"],
            "peak_flops_bf16": h["peak_bf16_flops"], "pcie_bytes_per_s": h["pcie_bytes_per_s"],
            "nvlink_bytes_per_s": h["nvlink_bytes_per_s"]}


@dataclass(frozen=True)
class ModelFacts:
    num_params: int          # unique parameters (tied embeddings counted once)
    dtype_bytes: int
    layer_matmul_params: int  # weights every token multiplies, per decoder stack (all layers)
    lm_head_params: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    kv_bytes_per_token: int

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def read_weight_bytes(self) -> int:
        """Weights a step reads: every decoder matrix plus the LM head."""
        return (self.layer_matmul_params + self.lm_head_params) * self.dtype_bytes


def model_facts(engine) -> ModelFacts:
    cfg, model, plan = engine.model_config, engine.model, engine.plan
    dtype_bytes = torch.empty(0, dtype=plan.dtype).element_size()
    whole = whole_numels(model)   # under tensor parallelism, the whole model, not this rank's slice
    layer_params = sum(whole[id(p)] for p in model.model.layers.parameters() if p.dim() == 2)
    return ModelFacts(
        num_params=sum(whole.values()), dtype_bytes=dtype_bytes,
        layer_matmul_params=layer_params, lm_head_params=whole[id(model.lm_head.weight)],
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,   # as stored: an 8-bit cache (kv_cache_dtype) halves or quarters it
        kv_bytes_per_token=plan.kv_format.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim))


def whole_numels(model) -> dict[int, int]:
    """id(parameter) -> its element count in the whole model (a tied matrix counted once):
    a tensor-parallel layer holds 1/N of its matrix on each rank."""
    from kvscope.layers.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    whole = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if isinstance(module, VocabParallelEmbedding):
                whole[id(p)] = module.vocab_size * p.shape[1]
            elif isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
                whole[id(p)] = p.numel() * module.tp.size
            else:
                whole[id(p)] = p.numel()
    return whole


def device_facts(engine) -> dict:
    spec = device_spec(engine.plan.device)
    return {"type": spec.type, "name": spec.name, "total_memory_bytes": int(spec.total_memory_bytes),
            "peak_bandwidth_bytes_per_s": float(spec.peak_bandwidth_bytes_per_s),
            "peak_flops": float(spec.peak_flops)}


def backend_facts(engine: str, version: str, capabilities: list[str],
                  attached_url: str | None = None) -> dict:
    """hello.backend: which engine answers, and what it can show (names from CAPABILITIES)."""
    unknown = set(capabilities) - set(CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown capabilities: {sorted(unknown)}")
    return {"engine": engine, "version": version, "attached_url": attached_url,
            "capabilities": [c for c in CAPABILITIES if c in capabilities]}


def kvscope_backend(engine) -> dict:
    """kvscope's own engine shows everything; speculation and tensor parallelism only when on,
    the quantized-KV probe (kv_quant) only on one rank."""
    optional = {"speculation": engine.speculator is not None,
                "tensor_parallel": engine.plan.tensor_parallel_size > 1,
                "kv_quant": engine.plan.tensor_parallel_size == 1}
    return backend_facts("kvscope", __version__, [c for c in CAPABILITIES if optional.get(c, True)])


def hello_event(engine, facts: ModelFacts, device: dict | None = None, ts: float = 0.0,
                started_at: float | None = None) -> dict:
    cfg, plan, knobs = engine.model_config, engine.plan, engine.knobs()   # knobs: in force now
    device = device or device_facts(engine)
    return {
        "type": "hello", "ts": ts, "schema_version": SCHEMA_VERSION,
        "server": f"kvscope {__version__}",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_at or time.time())),
        "backend": kvscope_backend(engine),
        "model": {
            "name": cfg.name or engine.model_path.name, "architecture": cfg.architecture,
            "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
            "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rope_theta": float(cfg.rope_theta), "num_params": facts.num_params,
            "dtype": plan.dtype_name, "dtype_reason": plan.dtype_reason,
            "dtype_bytes": facts.dtype_bytes,
            "weight_bytes": facts.weight_bytes, "kv_bytes_per_token": facts.kv_bytes_per_token,
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        "device": device,
        "engine": {
            "block_size": plan.block_size, "num_blocks": plan.num_blocks, "kv_cache_bytes": plan.kv_cache_bytes,
            "max_num_batched_tokens": knobs["max_num_batched_tokens"], "max_num_seqs": knobs["max_num_seqs"],
            "max_model_len": engine.max_model_len, "enable_prefix_caching": plan.enable_prefix_caching,
            "attention_backend": plan.attention_backend,
            "prefill_attention": plan.attention.eager.prefill, "decode_attention": plan.attention.describe_decode(),
            "decode": plan.decode,
            "kv_cache": plan.kv_cache_sizing,   # the pool's size and the rule that chose it
            "kv_cache_dtype": plan.kv_format.name,
            "speculative": speculative_facts(engine),
            "tensor_parallel_size": plan.tensor_parallel_size,
            "rank_weight_bytes": sum({id(p): p.numel() * p.element_size() for p in engine.model.parameters()}.values()),
        },
        "h100": h100_reference(),
    }


def speculative_facts(engine) -> dict | None:
    """The live engine's speculative_config (None when it does not speculate)."""
    spec = engine.speculator
    if spec is None:
        return None
    return {"method": spec.config.method, "num_speculative_tokens": spec.config.num_speculative_tokens,
            "model": spec.config.model, "prompt_lookup_max": spec.config.prompt_lookup_max,
            "prompt_lookup_min": spec.config.prompt_lookup_min}
