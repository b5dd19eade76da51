"""Engine configuration: the knobs of the scheduler, the KV cache and the runner."""
from __future__ import annotations

from dataclasses import dataclass, field


ATTENTION_BACKENDS = ("auto", "torch", "cpu_paged", "triton", "flash_attn")


@dataclass
class StructuredOutputsConfig:
    """vLLM's engine-wide settings for structured outputs (the ones kvscope has)."""
    backend: str = "xgrammar"   # the one kvscope has ("auto" picks it)
    # JSON grammars (json schema, json_object) compiled without free whitespace, so a small
    # model cannot wander off into newlines (vLLM's default is False: any whitespace)
    disable_any_whitespace: bool = True

    def __post_init__(self):
        if self.backend not in ("auto", "xgrammar"):
            raise ValueError(f"structured outputs backend must be 'xgrammar' (or 'auto'), got {self.backend!r}")


SPECULATIVE_METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """The keys are vLLM's: {"method": "ngram", "num_speculative_tokens": k,
    "prompt_lookup_max": n, "prompt_lookup_min": m} or {"model": dir, "num_speculative_tokens": k}."""
    num_speculative_tokens: int
    method: str = "ngram"
    model: str | None = None
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1

    @classmethod
    def from_dict(cls, raw: dict | None) -> "SpeculativeConfig | None":
        if raw is None or isinstance(raw, SpeculativeConfig):
            return raw
        known = cls.__dataclass_fields__.keys()
        if unknown := raw.keys() - known:
            raise ValueError(f"unknown speculative_config key(s) {sorted(unknown)}; known: {sorted(known)}")
        if "num_speculative_tokens" not in raw:
            raise ValueError("speculative_config needs num_speculative_tokens")
        return cls(**{"method": "draft_model" if raw.get("model") else "ngram", **raw})

    def __post_init__(self):
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in 1..16, got {self.num_speculative_tokens}")
        if self.method == "draft_model" and not self.model:
            raise ValueError("a draft-model speculative_config needs 'model' (a checkpoint directory)")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")


@dataclass
class EngineConfig:
    model: str | None = None          # checkpoint dir or hub id; None = the embedded default
    device: str = "auto"              # auto | cpu | cuda | cuda:N
    dtype: str = "auto"               # auto | float32 | bfloat16 | float16
    load_format: str = "auto"         # auto | dummy (random weights from config.json)
    seed: int = 0
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # default: the model's max_position_embeddings (capped)
    enable_chunked_prefill: bool = True
    prefill_chunk_size: int | None = None   # cap on prompt tokens one sequence computes per step
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"   # sha256 | xxhash (vLLM's names)
    kv_cache_dtype: str = "auto"      # auto | fp8 | fp8_e4m3 | fp8_e5m2 | int8_per_token_head (layers/attention.py)
    # the KV cache's size (vLLM's name); default: on a CPU a share of the memory available
    # (engine/model_runner.py), on a GPU what gpu_memory_utilization leaves
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.90
    num_kv_blocks: int | None = None  # exact block count, overrides the budget (tests, demos)
    attention_backend: str = "auto"   # auto | torch | cpu_paged | triton | flash_attn
    # decode graphs (engine/graphs.py): a GPU captures CUDA graphs unless enforce_eager (vLLM's
    # switch); a CPU compiles its decode step with torch.compile only when cpu_compile asks
    # (seconds at start-up, so by default a notebook's first token is instant), never under enforce_eager
    enforce_eager: bool = False
    cpu_compile: bool = False
    num_threads: int | None = None    # CPU intra-op threads
    speculative_config: SpeculativeConfig | dict | None = None   # vLLM's keys (engine/spec_decode.py)
    tensor_parallel_size: int = 1     # ranks splitting every weight matrix (engine/distributed.py)
    structured_outputs_config: StructuredOutputsConfig | dict = field(default_factory=StructuredOutputsConfig)

    def __post_init__(self):
        from kvscope.layers.attention import KV_CACHE_DTYPES
        if isinstance(self.structured_outputs_config, dict):   # vLLM's LLM(structured_outputs_config={...})
            self.structured_outputs_config = StructuredOutputsConfig(**self.structured_outputs_config)
        self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)   # checked before any loading
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}; got {self.kv_cache_dtype!r}")
        if self.block_size < 1 or self.block_size > 256:
            raise ValueError(f"block_size must be in 1..256, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.prefill_chunk_size is not None and self.prefill_chunk_size < 1:
            raise ValueError(f"prefill_chunk_size must be >= 1 or None, got {self.prefill_chunk_size}")
        if self.prefill_chunk_size is not None and not self.enable_chunked_prefill:
            raise ValueError("prefill_chunk_size needs enable_chunked_prefill")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be 'auto' or 'dummy', got {self.load_format!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"unknown attention_backend {self.attention_backend!r}")
