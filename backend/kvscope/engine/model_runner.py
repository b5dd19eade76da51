"""Runs one scheduled step: flattens the batch (step_inputs.py), runs the model, samples."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from kvscope.config import EngineConfig
from kvscope.engine.graphs import record_decode
from kvscope.engine.plan import pick_attention_backend
from kvscope.engine.sampler import logprob_entries, sample
from kvscope.engine.scheduler import SchedulerOutput
from kvscope.engine.step_inputs import StepBuffers, prepare_inputs, sampled_rows
from kvscope.hardware import to_device
from kvscope.layers.attention import (SCALE_DTYPE, KeptQueries, as_bytes, kv_cache_format, pick_routes,
                                      step_metadata)
from kvscope.layers.parallel import TPGroup
from kvscope.models.decoder import CausalLM
from kvscope.models.loader import build_model
from kvscope.structured_output import apply_masks

@dataclass
class StepResult:
    tokens: dict[int, list[int]] = field(default_factory=dict)      # seq_id -> tokens drawn
    logprobs: dict[int, list[dict]] = field(default_factory=dict)   # seq_id -> per token {logprob, top}
    spec_logits: dict[int, torch.Tensor] = field(default_factory=dict)  # seq_id -> [k + 1, V] to verify
    spec: dict[int, object] = field(default_factory=dict)           # seq_id -> SpecVerdict
    logits: torch.Tensor | None = None   # the step's scored rows, as the model gave them (observers read a watched row)


class ModelRunner:
    def __init__(self, config: EngineConfig, path, model_config, dtype: torch.dtype, device: torch.device,
                 max_model_len: int, num_blocks: Callable[[CausalLM], int], tp: TPGroup = TPGroup(),
                 load_format: str | None = None):
        """The one way a model and its runner are made (the engine's, a tensor-parallel rank's, the
        draft's); `num_blocks(model)` sizes the KV pool once the weights are in."""
        self.model = model = build_model(path, model_config, load_format or config.load_format, dtype, device,
                                         max_model_len, config.seed, tp)
        self.config, self.device, self.dtype = config, device, dtype
        self.block_size, self.num_blocks, self.max_model_len = config.block_size, num_blocks(model), max_model_len
        self.kv_format = kv_cache_format(config.kv_cache_dtype, dtype)
        self.attention_backend = pick_attention_backend(config.attention_backend, device, dtype, self.block_size,
                                                        model.config.head_dim, self.kv_format)
        self.routes = pick_routes(self.attention_backend, None, dtype, self.block_size)   # until a graph is made
        self.attn_layers = model.attention_layers
        self._allocate_kv_cache()
        self.generator = torch.Generator(device=device).manual_seed(config.seed)   # for rows without a seed
        self.buffers = StepBuffers(device)
        self.workers = None        # the other tensor-parallel ranks, which replay every forward pass
        # while someone watches (instrumentation/capture.py): (the step, decode only?) -> rows whose queries it keeps
        self.keep_queries: Callable[[SchedulerOutput, bool], KeptQueries | None] | None = None
        # decode steps recorded once (CUDA graphs or a compiled step), and how decode steps run
        self.graphs, self.compiled, self.decode = record_decode(self)

    # -- KV cache ----------------------------------------------------------------------
    def _allocate_kv_cache(self) -> None:
        layer = self.attn_layers[0]    # under tensor parallelism, this rank's KV heads only
        shape = (self.num_blocks + 1, self.block_size, layer.num_kv_heads, layer.head_dim)
        fmt = self.kv_format
        for layer in self.attn_layers:
            layer.kv_format = replace(fmt)   # each layer's own: see parallel.own
            layer.k_cache = torch.zeros(shape, dtype=fmt.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=fmt.dtype, device=self.device)
            if fmt.per_token_head:   # one scale per token and KV head, beside the values
                layer.k_scales = torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=self.device)
                layer.v_scales = torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=self.device)

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        return [t for layer in self.attn_layers for t in (layer.k_cache, layer.v_cache, layer.k_scales, layer.v_scales)
                if t is not None]

    def release(self) -> None:
        """Give the memory back: on a GPU the next engine sizes its pool from what is free."""
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

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: each (src, dst) pair's dst block gets src's K/V, every layer."""
        if not copies:
            return
        src, dst = (to_device(torch.tensor(column), self.device) for column in zip(*copies))
        for cache in self.kv_caches:   # fp8 has no indexing kernels on CPU; its bytes copy the same
            as_bytes(cache)[dst] = as_bytes(cache)[src]

    # -- one step ----------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, out: SchedulerOutput, generators: dict[int, torch.Generator], eager: bool = False) -> StepResult:
        """One step. `eager`: an observer's forward hooks must see every layer, so no graph runs it."""
        self.copy_blocks(out.block_copies)
        # the one rule for a step a decode graph may run: decode rows only, none forking
        replay = not eager and all(e.kind == "decode" and not e.forks for e in out.entries)
        compiled = replay and self.compiled is not None and self.compiled.fits(len(out.entries))
        route = self.routes.graph if compiled else self.routes.eager
        inputs = prepare_inputs(out, self.block_size, self.buffers, route)
        ids, pos, md, seqs = inputs.input_ids, inputs.positions, inputs.metadata, inputs.sample_seqs
        if self.workers is not None:
            self.workers.send(replace(inputs, sample_seqs=[]))   # the other ranks replay the forward pass
        result = StepResult()
        if self.keep_queries is not None:
            md.queries = self.keep_queries(out, replay)
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
            logits = self.model.compute_logits(sampled_rows(hidden, inputs.sample_rows)).float()
        result.logits = logits
        if drafted := {e.seq.seq_id for e in out.entries if e.spec_token_ids}:   # k drafts: k + 1 rows, the verifier's
            for seq_id in drafted:
                rows = [r for r, s in enumerate(seqs) if s.seq_id == seq_id]
                result.spec_logits[seq_id] = logits[rows[0]:rows[-1] + 1]
            rows = [r for r, s in enumerate(seqs) if s.seq_id not in drafted]
            seqs, logits = [seqs[r] for r in rows], logits[rows]
        masked = logits   # the model's own rows stay: logprobs (as in vLLM) and observers read them
        if any(s.grammar is not None for s in seqs):
            masked = logits.clone()
            apply_masks(masked, [s.grammar for s in seqs])
        tokens = sample(masked, [s.params for s in seqs], [generators.get(s.seq_id) for s in seqs], self.generator)
        result.tokens = {s.seq_id: [t] for s, t in zip(seqs, tokens.tolist())}
        if wants := [i for i, s in enumerate(seqs) if s.params.logprobs is not None]:
            entries = logprob_entries(logits[wants], tokens[wants], [seqs[i].params.logprobs for i in wants])
            result.logprobs.update((seqs[i].seq_id, [entry]) for i, entry in zip(wants, entries))
        return result


def run_isolating(runner: ModelRunner, out: SchedulerOutput, generators: dict[int, torch.Generator],
                  eager: bool = False) -> tuple[StepResult, dict[int, str]]:
    """The step's result and {seq_id: why its step failed}: a failed step tries each request alone
    and runs again without those that fail (safe: K/V writes are idempotent, seeded generators
    are rewound); an error no single request explains is raised again."""
    states = {seq_id: gen.get_state() for seq_id, gen in generators.items()}

    def rerun(entries: list) -> StepResult:
        for seq_id, state in states.items():
            generators[seq_id].set_state(state)
        return runner.run(replace(out, entries=entries), generators, eager)
    try:
        return runner.run(out, generators, eager), {}
    except Exception as error:
        failed = {}
        for entry in out.entries:
            try:
                rerun([entry])
            except Exception as alone:
                failed[entry.seq.seq_id] = f"{type(alone).__name__}: {alone}"
        if not failed:
            raise error
    kept = [e for e in out.entries if e.seq.seq_id not in failed]
    return rerun(kept) if kept else StepResult(), failed

