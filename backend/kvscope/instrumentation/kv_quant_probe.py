"""What an 8-bit KV cache (kv_cache_dtype) buys and costs, measured on the engine's own weights.

Buys: blocks. The same memory budget divided by the bytes of one block, as stored
(layers/kv_quant.py counts them, per-token-head scales included).

Costs: logit error. One prompt is decoded greedily twice on the same weights, once with an
unquantized cache and once with the quantized one, and the next-token logits of each step
are compared while both runs still pick the same tokens (after the first disagreement they
condition on different text, so their logits no longer measure the cache). The prompt's
own step reads the fresh keys and values, as a prefill does, so the error starts with the
first decode step, the first read of the cache.

Both runs use modules of their own (a copy of the model's module tree sharing its weights)
with a cache of a few blocks, read by the PyTorch reference attention: the engine's
modules (their attributes never rebound, which a compiled decode's graph reads), its pool
and its requests are untouched. Call it between engine steps (on the engine thread).
scripts/bench_kv_cache_dtype.py compares whole engines with `compare_greedy` too."""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch

from kvscope.layers.attention import (SCALE_DTYPE, KVCacheFormat, PrefillSpan, kv_cache_format, span_metadata,
                                      step_metadata)
from kvscope.models.loader import ModelConfig


@dataclass(frozen=True)
class CacheFit:
    """How one kv_cache_dtype stores a block, and how many blocks a budget holds."""
    kv_cache_dtype: str
    bytes_per_token: int
    bytes_per_block: int
    num_blocks: int


def cache_fit(kv_cache_dtype: str, model_dtype: torch.dtype, cfg: ModelConfig, block_size: int,
              budget_bytes: int) -> CacheFit:
    per_token = kv_cache_format(kv_cache_dtype, model_dtype).bytes_per_token(cfg.num_layers, cfg.num_kv_heads,
                                                                             cfg.head_dim)
    per_block = per_token * block_size
    return CacheFit(kv_cache_dtype, per_token, per_block, budget_bytes // per_block)


@dataclass(frozen=True)
class GreedyComparison:
    """Two greedy runs of one prompt: a reference and one with a quantized cache."""
    agree: int                 # leading tokens both runs chose alike
    total: int                 # tokens the reference drew
    step_errors: list[float]   # largest |logit difference| per step, up to the first disagreement
    step_kl: list[float]       # KL(reference ‖ quantized) of the next-token distributions, same steps

    @property
    def max_error(self) -> float:
        return max(self.step_errors, default=0.0)

    @property
    def mean_error(self) -> float:
        return sum(self.step_errors) / len(self.step_errors) if self.step_errors else 0.0


def compare_greedy(ref_tokens: list[int], ref_logits: list[torch.Tensor], got_tokens: list[int],
                   got_logits: list[torch.Tensor]) -> GreedyComparison:
    """Logits are [vocab] per step. Steps are compared up to and including the first one
    where the runs pick different tokens: until then both saw the same text."""
    same = next((i for i, (a, b) in enumerate(zip(ref_tokens, got_tokens)) if a != b), len(ref_tokens))
    pairs = list(zip(ref_logits, got_logits))[:same + 1]
    errors = [(a.float() - b.float()).abs().max().item() for a, b in pairs]
    kl = [torch.nn.functional.kl_div(b.float().log_softmax(-1), a.float().log_softmax(-1), log_target=True,
                                     reduction="sum").clamp_min(0).item() for a, b in pairs]
    return GreedyComparison(same, len(ref_tokens), errors, kl)


def probe_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model`'s module tree that shares its weights (every parameter and buffer)
    but has attention layers (and attention context) of its own, their caches empty until
    `bind_cache`. The engine's modules, which its compiled decode reads, are never rebound."""
    caches = [t for m in model.attention_layers for t in (m.k_cache, m.v_cache, m.k_scales, m.v_scales) if t is not None]
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    memo.update({id(t): torch.empty(0) for t in caches})   # the engine's pool is not copied
    return copy.deepcopy(model, memo)


def bind_cache(model: torch.nn.Module, fmt: KVCacheFormat, num_blocks: int, block_size: int,
               device: torch.device) -> None:
    """Give every attention layer of `model` (a `probe_model`) a fresh cache of `num_blocks`
    blocks in format `fmt`, read by the PyTorch reference attention."""
    for m in model.attention_layers:
        shape = (num_blocks, block_size, m.num_kv_heads, m.head_dim)
        m.k_cache = torch.zeros(shape, dtype=fmt.dtype, device=device)
        m.v_cache = torch.zeros(shape, dtype=fmt.dtype, device=device)
        scales = (lambda: torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=device)) if fmt.per_token_head else None
        m.k_scales, m.v_scales = (scales(), scales()) if scales else (None, None)
        m.kv_format, m.k_scale, m.v_scale, m.backend = fmt, 1.0, 1.0, "torch"


@torch.inference_mode()
def greedy_on_own_cache(model, prompt_ids: list[int], max_tokens: int, fmt: KVCacheFormat, block_size: int,
                        device: torch.device) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and each step's next-token logits (float32, [vocab]): the prompt in one
    pass, then one token a pass, each reading its context back from the cache. `model`: a
    `probe_model`, whose caches this rebinds."""
    total = len(prompt_ids) + max_tokens
    num_blocks = -(-total // block_size)
    blocks = torch.arange(num_blocks, device=device)
    tokens, logits = [], []
    bind_cache(model, fmt, num_blocks, block_size, device)
    ids, start = list(prompt_ids), 0
    for _ in range(max_tokens):
        n = len(ids)
        span = PrefillSpan(0, n, start, blocks[:-(-(start + n) // block_size)] if start else None)
        md = span_metadata(torch.arange(start, start + n, device=device), span)
        with step_metadata(model, md):
            hidden = model(torch.tensor(ids, device=device), torch.arange(start, start + n, device=device))
        row = model.compute_logits(hidden[-1:]).float()[0]
        logits.append(row.cpu())
        tokens.append(int(row.argmax()))
        ids, start = [tokens[-1]], start + n
    return tokens, logits


@dataclass(frozen=True)
class KVQuantMeasurement:
    kv_cache_dtype: str
    model_dtype: str
    block_size: int
    budget_bytes: int
    auto: CacheFit
    quantized: CacheFit
    blocks_gained: float           # quantized blocks ÷ auto blocks at the same budget
    num_prompt_tokens: int
    ref_token_ids: list[int]
    token_ids: list[int]
    greedy_agree: int
    greedy_total: int
    max_abs_logit_error: float
    mean_abs_logit_error: float
    max_kl: float
    step_errors: list[float]
    step_kl: list[float]

    def as_dict(self) -> dict:
        return asdict(self)


def measure_kv_cache_dtype(model, cfg: ModelConfig, model_dtype: torch.dtype, device: torch.device,
                           prompt_ids: list[int], kv_cache_dtype: str, max_tokens: int, block_size: int,
                           budget_bytes: int) -> KVQuantMeasurement:
    """Blocks gained and logit error of `kv_cache_dtype` against the unquantized cache."""
    fmt = kv_cache_format(kv_cache_dtype, model_dtype)
    reference = kv_cache_format("auto", model_dtype)
    probe = probe_model(model)
    ref_tokens, ref_logits = greedy_on_own_cache(probe, prompt_ids, max_tokens, reference, block_size, device)
    got_tokens, got_logits = greedy_on_own_cache(probe, prompt_ids, max_tokens, fmt, block_size, device)
    cmp = compare_greedy(ref_tokens, ref_logits, got_tokens, got_logits)
    auto = cache_fit("auto", model_dtype, cfg, block_size, budget_bytes)
    quantized = cache_fit(kv_cache_dtype, model_dtype, cfg, block_size, budget_bytes)
    return KVQuantMeasurement(
        kv_cache_dtype, str(model_dtype).removeprefix("torch."), block_size, budget_bytes, auto, quantized,
        quantized.num_blocks / auto.num_blocks if auto.num_blocks else 0.0, len(prompt_ids),
        ref_tokens, got_tokens, cmp.agree, cmp.total, cmp.max_error, cmp.mean_error,
        max(cmp.step_kl, default=0.0), cmp.step_errors, cmp.step_kl)
