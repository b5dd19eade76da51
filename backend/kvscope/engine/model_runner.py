"""Runs one scheduled step: flattens the batch (step_inputs.py), runs the model over it,
and samples the next tokens."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from kvscope.config import EngineConfig
from kvscope.engine.graphs import CompiledDecode, DecodeGraphs, compile_unavailable
from kvscope.engine.sampler import Sampler, SamplingBatch, apply_masks, logprob_entries
from kvscope.engine.scheduler import SchedulerOutput
from kvscope.engine.step_inputs import StepBuffers, prepare_inputs
from kvscope.layers import kernels
from kvscope.layers.attention import (FLASH_PAGE_MULTIPLE, SCALE_DTYPE, KVCacheFormat, PagedAttention, PrefillSpan,
                                      Routes, as_bytes, attention_context, flash_fits, kv_cache_format, pick_routes,
                                      span_metadata, step_metadata)
from kvscope.layers.kernels import HAS_TRITON
from kvscope.layers.parallel import TPGroup
from kvscope.models.decoder import CausalLM
from kvscope.models.loader import ModelConfig, build_model

log = logging.getLogger("kvscope.engine")


@dataclass
class StepPlan:
    """What a tensor-parallel worker needs to replay rank 0's forward pass (engine/distributed.py)."""
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: object                       # AttentionMetadata
    sample_rows: list[int]
    block_copies: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class StepResult:
    tokens: dict[int, list[int]] = field(default_factory=dict)      # seq_id -> tokens drawn
    logprobs: dict[int, list[dict]] = field(default_factory=dict)   # seq_id -> per token {logprob, top}
    spec_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # seq_id -> [k + 1, V] to verify
    spec: dict[int, object] = field(default_factory=dict)           # seq_id -> SpecVerdict
    logits: torch.Tensor | None = None   # the step's scored rows, as the model gave them (observers read a watched row)


@dataclass(frozen=True)
class ExecutionPlan:
    """How this engine runs, fixed at start-up and logged once (`engine.plan`): where, in
    which dtype, with which attention kernel, how decode steps run, and the KV pool. Stats,
    the hello event and the benchmarks read it here rather than from the runner."""
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    attention_backend: str
    attention: Routes         # which kernels take the spans and the decode rows
    decode: str               # "eager", "compiled (...)" or "cuda graphs"; an eager fallback says why
    kv_format: KVCacheFormat  # its name is vLLM's kv_cache_dtype
    kv_cache_bytes: int       # every layer's K, V and scales, allocated once
    num_blocks: int
    block_size: int           # tokens a block holds
    enable_prefix_caching: bool
    kv_cache_sizing: str      # how the pool's size was chosen
    tensor_parallel_size: int

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        ranks = f", {self.tensor_parallel_size} tensor-parallel ranks" if self.tensor_parallel_size > 1 else ""
        stored = f" stored as {self.kv_format.name}" if self.kv_format.quantized else ""
        return (f"{self.device}{ranks}, {self.dtype_name} ({self.dtype_reason}); attention {self.attention_backend} "
                f"({self.attention.describe()}), "
                f"decode {self.decode}; KV cache {self.kv_cache_sizing}, {self.block_size} tokens a block{stored}, "
                f"prefix caching {'on' if self.enable_prefix_caching else 'off'}")


# -- the device and the KV pool's size: what the engine picks for this machine --------------
# On a CPU the KV cache takes this share of the memory available at start-up (as
# vLLM's VLLM_CPU_KVCACHE_SPACE sizes it by hand), and never more than the scheduler
# could fill: max_num_seqs sequences of max_model_len tokens.
CPU_KV_FRACTION = 0.25


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but PyTorch sees no CUDA GPU")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}: use cpu or cuda")
    return device


def block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype, kv_cache_dtype: str = "auto") -> int:
    """One block's K and V across all layers, as stored (an 8-bit cache: half or a quarter)."""
    fmt = kv_cache_format(kv_cache_dtype, dtype)
    return block_size * fmt.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)


def host_memory() -> tuple[int, int]:
    """(total, available) host RAM in bytes, from /proc/meminfo (sysconf elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            info = {key: int(rest.split()[0]) * 1024 for key, rest in (line.split(":", 1) for line in f)}
    except (OSError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total
    return info.get("MemTotal", 0), info.get("MemAvailable", info.get("MemFree", 0))


def kv_cache_blocks(config: EngineConfig, cfg: ModelConfig, model, device: torch.device,
                    dtype: torch.dtype, max_model_len: int) -> tuple[int, str]:
    """The pool's size in blocks, and how it was chosen (printed at start-up)."""
    per_block = block_bytes(cfg, config.block_size, dtype, config.kv_cache_dtype)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks, f"{config.num_kv_blocks} blocks, as asked for"
    if config.kv_cache_memory_bytes is not None:
        budget, why = config.kv_cache_memory_bytes, "kv_cache_memory_bytes"
    elif device.type == "cuda":
        budget = _free_gpu_budget(config, cfg, model, device)
        why = f"{config.gpu_memory_utilization:.0%} of the GPU, less weights and activations"
    else:
        budget, why = _free_cpu_budget(config, cfg, dtype, max_model_len)
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(f"the KV budget ({budget / 2**20:.1f} MiB) is smaller than one block "
                         f"({per_block / 2**20:.2f} MiB)")
    return int(blocks), f"{int(blocks) * per_block / 2**20:,.0f} MiB, {int(blocks)} blocks ({why})"


def _free_cpu_budget(config: EngineConfig, cfg: ModelConfig, dtype: torch.dtype,
                     max_model_len: int) -> tuple[int, str]:
    available = host_memory()[1]
    share = int(available * CPU_KV_FRACTION)
    per_token = block_bytes(cfg, 1, dtype, config.kv_cache_dtype)
    fillable = config.max_num_seqs * max_model_len * per_token
    if fillable <= share:
        return fillable, (f"what {config.max_num_seqs} sequences of {max_model_len} tokens fill; "
                          f"{available / 2**30:.1f} GiB of memory available")
    return share, f"{CPU_KV_FRACTION:.0%} of the {available / 2**30:.1f} GiB of memory available"


def _free_gpu_budget(config: EngineConfig, cfg: ModelConfig, model, device: torch.device) -> int:
    """A fraction of the card, less the weights and the peak of one full-budget forward."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    _profile_forward(config, cfg, model, device)
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = total - free - torch.cuda.memory_reserved(device)
    peak = torch.cuda.max_memory_allocated(device)
    return max(0, int(total * config.gpu_memory_utilization) - used_by_others - peak)


@torch.inference_mode()
def _profile_forward(config: EngineConfig, cfg: ModelConfig, model, device: torch.device) -> None:
    """Run the largest prefill the scheduler can issue, against a one-block cache."""
    n = config.max_num_batched_tokens
    dtype = next(model.parameters()).dtype
    for layer in model.modules():
        if isinstance(layer, PagedAttention):
            layer.k_cache = torch.zeros(1, 1, cfg.num_kv_heads, cfg.head_dim, dtype=dtype, device=device)
            layer.v_cache = torch.zeros_like(layer.k_cache)
    ids = torch.zeros(n, dtype=torch.long, device=device)
    rope_len = model.model.rotary.cos_cache.shape[0]
    pos = torch.arange(n, device=device) % rope_len
    md = span_metadata(torch.zeros(n, dtype=torch.long, device=device), PrefillSpan(0, n, 0))
    with step_metadata(model, md):
        hidden = model(ids, pos)
    model.compute_logits(hidden[-min(n, config.max_num_seqs):])
    torch.cuda.synchronize(device)


def pick_attention_backend(requested: str, device: torch.device, dtype: torch.dtype, block_size: int,
                           head_dim: int, kv_format: KVCacheFormat) -> str:
    if kv_format.quantized:   # the kernels read unquantized caches; the reference dequantizes what it reads
        if requested not in ("auto", "torch"):
            raise ValueError(f"kv_cache_dtype={kv_format.name!r} is read by the 'torch' attention backend only, "
                             f"not {requested!r}")
        return "torch"
    triton_fits = HAS_TRITON and _power_of_two(head_dim) and _power_of_two(block_size)
    if requested == "auto":
        if device.type != "cuda":
            # the C kernel reads K/V in place; where it cannot run, the reference gathers
            reason = kernels.cpu_unavailable(dtype)
            if reason and dtype in kernels.CPU_DTYPES:
                log.warning("attention: the CPU kernel is unavailable (%s); using the PyTorch reference", reason)
            return "torch" if reason else "cpu_paged"
        if flash_fits(dtype, block_size):
            return "flash_attn"
        return "triton" if triton_fits else "torch"
    if requested == "cpu_paged":
        reason = "it runs on CPUs" if device.type != "cpu" else kernels.cpu_unavailable(dtype)
        if reason:
            raise ValueError(f"attention_backend='cpu_paged' cannot run here: {reason}")
    if requested == "triton" and not triton_fits:
        raise ValueError("attention_backend='triton' needs the triton package, and a head_dim and "
                         "block_size that are powers of two")
    if requested == "triton" and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the triton backend runs on CUDA (or on CPU under TRITON_INTERPRET=1)")
    if requested == "flash_attn" and not (device.type == "cuda" and flash_fits(dtype, block_size)):
        raise ValueError(f"attention_backend='flash_attn' needs flash-attn, CUDA, float16 or bfloat16 and a "
                         f"block_size multiple of {FLASH_PAGE_MULTIPLE}")
    return requested


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class ModelRunner:
    def __init__(self, config: EngineConfig, model: CausalLM, device: torch.device,
                 dtype: torch.dtype, num_blocks: int, max_model_len: int):
        self.config, self.model, self.device, self.dtype = config, model, device, dtype
        self.block_size, self.num_blocks, self.max_model_len = config.block_size, num_blocks, max_model_len
        self.kv_format = kv_cache_format(config.kv_cache_dtype, dtype)
        self.attention_backend = pick_attention_backend(config.attention_backend, device, dtype, self.block_size,
                                                        model.config.head_dim, self.kv_format)
        self.routes = pick_routes(self.attention_backend, None, dtype, self.block_size)   # until a graph is made
        self.attn_layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
        attention_context(model)   # bound now, before any graph traces the model
        self._allocate_kv_cache()
        self.sampler = Sampler(device, config.seed)
        self.buffers = StepBuffers(device)
        self.graphs = self.compiled = None
        self.workers = None        # the other tensor-parallel ranks, which replay every forward pass

    def prepare_decode(self) -> str:
        """Capture CUDA graphs (GPU) or compile the decode step (CPU) where they apply; says
        how decode steps run, and why (the engine's ExecutionPlan reports it)."""
        captures = not self.config.enforce_eager if self.device.type == "cuda" else self.config.enforce_eager is False
        if not captures:
            return "eager"
        return self._capture_graphs() if self.device.type == "cuda" else self._compile_decode()

    def _capture_graphs(self) -> str:
        # only these backends read context lengths on the device, which a captured graph needs
        if self.attention_backend not in ("triton", "flash_attn"):
            return f"eager: CUDA graphs need the triton or flash_attn backend, not {self.attention_backend}"
        if self.config.tensor_parallel_size > 1:
            return "eager: tensor-parallel ranks run eagerly"
        self.routes = pick_routes(self.attention_backend, "cuda graphs", self.dtype, self.block_size)
        self.graphs = DecodeGraphs(self, max_batch=min(self.config.max_num_seqs, 512))
        return "cuda graphs"

    def _compile_decode(self) -> str:
        reason = compile_unavailable(self)
        if reason is None:
            try:
                self.routes = pick_routes(self.attention_backend, "compiled", self.dtype, self.block_size)
                self.compiled = CompiledDecode(self)
                return f"compiled (torch.compile, {self.compiled.compile_seconds:.0f} s at start-up)"
            except Exception as exc:   # e.g. no C++ compiler: inductor cannot build its kernels
                reason = f"torch.compile failed ({type(exc).__name__}: {str(exc)[:200]})"
                self.routes = pick_routes(self.attention_backend, None, self.dtype, self.block_size)
        log.warning("compiled decode: running eagerly: %s", reason)
        return f"eager: {reason}"

    # -- KV cache ----------------------------------------------------------------------
    def _allocate_kv_cache(self) -> None:
        layer = self.attn_layers[0]    # under tensor parallelism, this rank's KV heads only
        shape = (self.num_blocks + 1, self.block_size, layer.num_kv_heads, layer.head_dim)
        fmt = self.kv_format
        for layer in self.attn_layers:
            layer.kv_format = fmt
            layer.k_cache = torch.zeros(shape, dtype=fmt.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=fmt.dtype, device=self.device)
            if fmt.per_token_head:   # one scale per token and KV head, beside the values
                layer.k_scales = torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=self.device)
                layer.v_scales = torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=self.device)

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        """Every layer's K and V caches, and their scales where the format keeps any."""
        return [t for layer in self.attn_layers for t in (layer.k_cache, layer.v_cache, layer.k_scales, layer.v_scales)
                if t is not None]

    def release(self) -> None:
        """Give the KV cache, the captured graphs and the weights back (the engine is shut
        down): on a GPU the next engine sizes its pool from the memory left free."""
        for layer in self.attn_layers:
            layer.k_cache = layer.v_cache = torch.empty(0)
            layer.k_scales = layer.v_scales = None
        self.graphs = self.compiled = None
        self.model.to("meta")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def scratch_slot(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches)

    @staticmethod
    def _replayable(out: SchedulerOutput) -> bool:
        """The one rule for a step a decode graph may run: decode rows only (no prompt, no
        drafts), each sampled once from its own row (no choices forking from it)."""
        return all(e.kind == "decode" and not e.forks for e in out.entries)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: give each (src, dst) pair's dst block the K/V of src, every layer."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for cache in self.kv_caches:
            raw = as_bytes(cache)    # fp8 has no indexing kernels on CPU; its bytes copy the same
            raw[dst] = raw[src]

    # -- one step ----------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, out: SchedulerOutput, generators: dict[int, torch.Generator], eager: bool = False) -> StepResult:
        """One step. `eager`: an observer's forward hooks must see every layer, so neither a
        CUDA graph nor the compiled graph may run it."""
        self.copy_blocks(out.block_copies)
        replay = not eager and self._replayable(out)
        compiled = replay and self.compiled is not None and self.compiled.fits(len(out.entries))
        route = self.routes.graph if compiled else self.routes.eager
        inputs = prepare_inputs(out, self.block_size, self.buffers, route)
        ids, pos, md, seqs = inputs.input_ids, inputs.positions, inputs.metadata, inputs.sample_seqs
        if self.workers is not None:
            self.workers.send(StepPlan(ids, pos, md, inputs.sample_rows, out.block_copies))
        result = StepResult()
        logits = None
        if replay and self.graphs is not None and self.graphs.fits(len(ids)):
            hidden = self.graphs.run(ids, pos, md)
        elif compiled:
            logits = self.compiled.run(inputs)    # every row is sampled: the graph scores them all
        else:
            with step_metadata(self.model, md):
                hidden = self.model(ids, pos)
        if not seqs:
            return result
        if logits is None:
            logits = self.model.compute_logits(hidden[inputs.sample_rows]).float()
        result.logits = logits
        drafts = {e.seq.seq_id: len(e.spec_token_ids) for e in out.entries if e.spec_token_ids}
        plain, plain_rows = (seqs, None) if not drafts else self._split_drafts(seqs, drafts, logits, result)
        if plain:
            if plain_rows is not None and len(plain_rows) < logits.shape[0]:   # indexing copies every row
                logits = logits[plain_rows]
            batch = SamplingBatch([s.params for s in plain], [generators.get(s.seq_id) for s in plain])
            raw = logits
            if any(s.grammar is not None for s in plain):
                # logprobs stay those of the model's own distribution, as in vLLM
                logits = logits.clone()   # the model's own rows stay: logprobs and observers read them
                apply_masks(logits, [s.grammar for s in plain])
            self._collect(result, plain, raw, self.sampler(logits, batch))
        return result

    @staticmethod
    def _split_drafts(seqs, drafts: dict[int, int], logits, result) -> tuple[list, list[int]]:
        """Rows of a sequence with k drafts (k + 1 rows) go to the verifier; returns the
        sequences sampled plainly and their rows."""
        plain, plain_rows, row = [], [], 0
        while row < len(seqs):
            seq, k = seqs[row], drafts.get(seqs[row].seq_id, 0)
            if k:
                result.spec_logits[seq.seq_id] = logits[row:row + k + 1]
            else:
                plain.append(seq)
                plain_rows.append(row)
            row += k + 1
        return plain, plain_rows

    def _collect(self, result, seqs, logits, tokens) -> None:
        result.tokens = {s.seq_id: [t] for s, t in zip(seqs, tokens.tolist())}
        if wants := [i for i, s in enumerate(seqs) if s.params.logprobs is not None]:
            entries = logprob_entries(logits[wants], tokens[wants], [seqs[i].params.logprobs for i in wants])
            for i, entry in zip(wants, entries):
                result.logprobs[seqs[i].seq_id] = [entry]


# -- a failed step -------------------------------------------------------------------
def run_isolating(runner: ModelRunner, out: SchedulerOutput, generators: dict[int, torch.Generator],
                  eager: bool = False) -> tuple[StepResult, dict[int, str]]:
    """The step's result and {seq_id: why its step failed}. When a step fails, each request's
    part is tried alone and the step runs again without the ones that fail, so one bad
    request ends alone instead of taking every stream with it (an error no single request
    explains is raised again). Only the error path pays. Running a step again is safe:
    writing a position's K/V is idempotent, and the seeded generators are rewound so the
    rest draw exactly what they would have drawn."""
    states = {seq_id: gen.get_state() for seq_id, gen in generators.items()}
    try:
        return runner.run(out, generators, eager), {}
    except Exception as error:
        failed = {}
        for entry in out.entries:
            _rewind(generators, states)
            try:
                runner.run(replace(out, entries=[entry]), generators, eager)
            except Exception as alone:
                failed[entry.seq.seq_id] = f"{type(alone).__name__}: {alone}"
        if not failed:
            raise error
    kept = [e for e in out.entries if e.seq.seq_id not in failed]
    _rewind(generators, states)
    if not kept:
        return StepResult(), failed
    return runner.run(replace(out, entries=kept), generators, eager), failed


def _rewind(generators: dict[int, torch.Generator], states: dict[int, torch.Tensor]) -> None:
    for seq_id, state in states.items():
        generators[seq_id].set_state(state)


def load_model_and_runner(config: EngineConfig, path, model_config, dtype: torch.dtype, device: torch.device,
                          max_model_len: int, num_blocks: Callable[[CausalLM], int], tp: TPGroup = TPGroup(),
                          load_format: str | None = None) -> tuple[CausalLM, ModelRunner, str]:
    """The one way a model and the runner that steps it are made: the engine's (rank 0),
    a tensor-parallel rank's slice, the draft model's. `num_blocks(model)` sizes the KV
    pool once the weights are in (on a GPU it measures what they leave free; a rank hears
    rank 0's size). Also returns how decode steps run (ModelRunner.prepare_decode)."""
    model = build_model(path, model_config, load_format or config.load_format, dtype, device, max_model_len,
                        config.seed, tp)
    runner = ModelRunner(config, model, device, dtype, num_blocks(model), max_model_len)
    return model, runner, runner.prepare_decode()
