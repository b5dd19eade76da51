"""The engine: load a model, size the KV cache, then schedule → run → postprocess, step
after step. Synchronous; the async front end drives it from a thread."""
from __future__ import annotations

import functools
import json
import logging
import os
import time
import weakref
from dataclasses import dataclass, field

import torch

from kvscope.config import EngineConfig
from kvscope.detokenizer import Detokenizer
from kvscope.engine.block_manager import BlockManager
from kvscope.engine.model_runner import ModelRunner, StepResult, run_isolating
from kvscope.engine.plan import ExecutionPlan, kv_cache_blocks, resolve_device
from kvscope.engine.scheduler import Scheduler, SchedulerOutput, TokenDelta, check_chunking
from kvscope.engine.distributed import TPWorkers
from kvscope.engine.sequence import Sequence
from kvscope.engine.spec_decode import Speculator
from kvscope.layers.parallel import TPGroup
from kvscope.models.loader import choose_dtype, load_tokenizer, read_model_config, resolve_model_path
from kvscope.sampling_params import SamplingParams
from kvscope.structured_output import StructuredOutputManager, grammar_key

# the scheduler's settings an instructor may change between steps (set_knobs)
KNOBS = ("max_num_batched_tokens", "max_num_seqs", "prefill_chunk_size", "enable_chunked_prefill")
MAX_ROPE_CACHE = 1 << 17   # positions precomputed for RoPE; longer contexts are capped here
# set for the whole process, where unset, by loading a tokenizer (models/loader.py); unset at shutdown
PROCESS_ENV = ("TOKENIZERS_PARALLELISM",)

log = logging.getLogger("kvscope.engine")


# -- the engine's named publication points -----------------------------------------------
# Instrumentation subclasses EngineObserver and registers with `engine.add_observer`; with no
# observer the engine builds no payload, so listening costs nothing when nobody listens.
@dataclass
class StepRecord:
    """Everything one step did, handed to observers after it."""
    scheduled: SchedulerOutput
    result: StepResult
    tokens: list[TokenDelta]
    finished: list[Sequence]
    block_events: list[tuple] = field(default_factory=list)  # (kind, block_id, detail)
    comm_bytes: int = 0   # what rank 0 sent through all-reduces and gathers (tensor parallelism)
    schedule_seconds: float = 0.0
    model_seconds: float = 0.0
    total_seconds: float = 0.0
    num_waiting: int = 0
    num_running: int = 0
    token_budget: int = 0    # the knobs in force this step (set_knobs may change them between steps)
    max_num_seqs: int = 0


class EngineObserver:
    def on_request_added(self, seq: Sequence) -> None: ...
    # after scheduling, before the model runs: the moment to install forward hooks on the
    # model for the sequences about to run; True asks for an eager forward this step (a
    # CUDA graph or compiled graph would run past the hooks)
    def on_scheduled(self, scheduled: SchedulerOutput) -> bool: return False
    def on_step(self, record: StepRecord) -> None: ...
    def on_request_finished(self, seq: Sequence) -> None: ...
    def on_reset(self) -> None: ...   # every request aborted, the KV pool emptied


def release(workers: TPWorkers | None, runner, num_threads: int, unset: list[str]) -> None:
    """What shutting an engine down gives back: torch's threads as they were, and the PROCESS_ENV
    variables that were unset unset again; run once, by shutdown() or when the engine is dropped."""
    if workers is not None:
        workers.shutdown()
    if runner is not None:
        runner.release()
    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
    for key in unset:
        os.environ.pop(key, None)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, **kwargs):
        self.config = config = config or EngineConfig(**kwargs)
        process_state = torch.get_num_threads(), [k for k in PROCESS_ENV if k not in os.environ]
        self.closed = False
        self.workers: TPWorkers | None = None
        try:
            self._start(config)
        except BaseException:   # the ranks, their process group and the threads go back too
            release(self.workers, None, *process_state)
            raise
        # Dropping the last reference releases the engine as shutdown() does (vLLM's examples
        # end with `del llm`). The finalizer holds only what it releases, none of which points
        # back at the engine, so it runs as soon as the engine is unreachable.
        self._release = weakref.finalize(self, release, self.workers, self.runner, *process_state)
        log.info("engine: %s on %s", self.model_path.name, self.plan.describe())

    def _start(self, config: EngineConfig) -> None:
        """Everything the engine steps with; what it settles is kept in `self.plan`."""
        device = resolve_device(config.device)
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_path = resolve_model_path(config.model)
        self.model_config = read_model_config(self.model_path)
        dtype, dtype_reason = choose_dtype(config.dtype, device, self.model_config)
        self.max_model_len = min(config.max_model_len or self.model_config.max_position_embeddings,
                                 self.model_config.max_position_embeddings, MAX_ROPE_CACHE)
        check_chunking(config.enable_chunked_prefill, config.max_num_batched_tokens, self.max_model_len)
        if config.tensor_parallel_size > 1:
            self.workers = TPWorkers(config, self.model_config, dtype, self.max_model_len, device)
            device = self.workers.device
        sizing = ""   # how the pool's size was chosen

        def size_kv_cache(model) -> int:
            """The KV pool's blocks, chosen once the weights are in; the other ranks hear it."""
            nonlocal sizing
            num_blocks, sizing = kv_cache_blocks(config, self.model_config, model, device, dtype, self.max_model_len)
            if self.workers is not None:
                self.workers.send(num_blocks)
            return num_blocks
        self.runner = runner = ModelRunner(config, self.model_path, self.model_config, dtype, device,
                                           self.max_model_len, size_kv_cache,
                                           self.workers.group if self.workers else TPGroup())
        runner.workers, self.model = self.workers, runner.model
        self.plan = ExecutionPlan(
            device=device, dtype=dtype, dtype_reason=dtype_reason,
            attention_backend=runner.attention_backend, attention=runner.routes, decode=runner.decode,
            kv_format=runner.kv_format, kv_cache_bytes=runner.kv_cache_bytes, num_blocks=runner.num_blocks,
            kv_cache_sizing=sizing, block_size=config.block_size, enable_prefix_caching=config.enable_prefix_caching,
            tensor_parallel_size=config.tensor_parallel_size, scratch_slot=runner.scratch_slot)
        self.device, self.dtype = device, dtype   # the plan's, at hand
        self.tokenizer = load_tokenizer(self.model_path)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching,
                                          config.prefix_caching_hash_algo)
        self.scheduler = Scheduler(config, self.block_manager, self.max_model_len, self._eos_ids())
        self.observers: list[EngineObserver] = []
        self.generators: dict[int, torch.Generator] = {}
        self.detokenizer = Detokenizer()   # the async front end streams every token's text
        self.failure: str | None = None   # set when a tensor-parallel rank died: nothing runs any more
        spec = config.speculative_config
        self.speculator = Speculator(spec, self) if spec is not None else None

    def shutdown(self) -> None:
        """Abort what is queued and release(), so another engine can start; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for seq in self.live_sequences():
            self.finish(seq, "abort")
        self._release()
        self.failure = self.failure or "the engine was shut down"

    @functools.cached_property
    def structured_outputs(self) -> StructuredOutputManager:   # made on first use: xgrammar is optional
        return StructuredOutputManager(self.tokenizer, self.model_config.vocab_size, sorted(self._eos_ids()),
                                       self.config.structured_outputs_config.disable_any_whitespace)

    def _eos_ids(self) -> set[int]:
        ids = set(self.model_config.eos_token_ids)
        gen_cfg = self.model_path / "generation_config.json"
        if gen_cfg.is_file():
            eos = json.loads(gen_cfg.read_text()).get("eos_token_id")
            ids |= {eos} if isinstance(eos, int) else set(eos or [])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # -- requests ----------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this checkpoint has no tokenizer: pass token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        ids, vocab = list(prompt), self.model_config.vocab_size
        if bad := [t for t in ids if not isinstance(t, int) or not 0 <= t < vocab]:
            raise ValueError(f"token ids must be integers in [0, {vocab}); got {bad[:3]}")
        return ids

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str = "", cache_salt: str | None = None,
                    prefill_chunk_size: int | None = None) -> Sequence:
        """Queue a request; with n > 1 it is choice 0, and choices 1..n-1 (`seq.forks`, ids
        `<id>-<i>`) fork from it once its prompt is computed. `prefill_chunk_size` cuts this
        request's prompt into chunks of at most that many tokens a step."""
        params = params or SamplingParams()
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this checkpoint has none")
        ids = self.tokenize(prompt)
        constraint = params.structured_outputs
        if constraint is not None:
            self.compile_grammar(constraint)   # a bad grammar fails here, not in a step
        seq = self._new_sequence(ids, params.for_choice(0) if params.n > 1 else params, request_id)
        seq.forks = [self._new_sequence(ids, params.for_choice(i), f"{seq.request_id}-{i}")
                     for i in range(1, params.n)]
        for s in seq.choices:
            s.cache_salt, s.prefill_chunk_size = cache_salt, prefill_chunk_size
            if constraint is not None:
                s.grammar = self.structured_outputs.matcher_for(constraint)
        error = self.failure or self.scheduler.admission_error(seq)
        for obs in self.observers:
            for s in seq.choices:
                obs.on_request_added(s)
        if error:
            self.finish(seq, "error", error)
        else:
            self.scheduler.add(seq)
        return seq

    def _new_sequence(self, ids: list[int], params: SamplingParams, request_id: str) -> Sequence:
        seq = Sequence(ids, params, request_id=request_id)
        if params.seed is not None:
            self.generators[seq.seq_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        self.detokenizer.add(seq, self.tokenizer)
        return seq

    def compile_grammar(self, constraint) -> None:
        """Compile a structured-output constraint into the engine's cache; a bad one raises
        ValueError. A server calls it before add_request, off the engine thread: no step waits."""
        self.structured_outputs.compile(grammar_key(constraint))

    def stream_text(self) -> None:
        """From now on every token's text is decoded, not only for requests with stop strings
        (a streaming front end)."""
        self.detokenizer.stream = True

    @property
    def keep_queries(self):
        """Picks, before each step, the rows whose queries the step hands back (None: none)."""
        return self.runner.keep_queries

    @keep_queries.setter
    def keep_queries(self, keeper) -> None:
        self.runner.keep_queries = keeper

    def find(self, request_id: str) -> Sequence | None:
        """A live request, or a choice still waiting to fork, by its id."""
        return self.scheduler.find(request_id)

    def abort(self, request_id: str) -> bool:
        if (seq := self.find(request_id)) is not None:
            self.finish(seq, "abort")
        return seq is not None

    def pause(self, request_id: str, paused: bool = True) -> bool:
        """Leave a request out of the steps, its blocks kept, until resume() (the server's pacing)."""
        if (seq := self.find(request_id)) is not None:
            seq.paused = paused
        return seq is not None

    def resume(self, request_id: str) -> bool:
        return self.pause(request_id, paused=False)

    def has_unfinished(self) -> bool:
        """The one "is there work" check: a request is queued or running and not paused."""
        return any(not s.paused for s in self.live_sequences())

    # -- what observers read between steps (besides the step record) --------------------
    @property
    def num_steps(self) -> int:
        return self.scheduler.num_steps

    @property
    def num_used_blocks(self) -> int:
        return self.block_manager.num_used_blocks

    def take_block_events(self) -> list[tuple]:
        return self.block_manager.take_events()

    # -- what the server and the explainer read between steps, instead of the engine's parts --
    def live_sequences(self) -> list[Sequence]:
        """Every request the engine holds: the running ones, then the waiting ones."""
        return [*self.scheduler.running, *self.scheduler.waiting]

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks

    def block_hashes(self) -> list[bytes | None]:
        return [b.hash for b in self.block_manager.blocks]

    @property
    def num_prefix_hits(self) -> int:   # blocks reused from the prefix cache (since the last reset)
        return self.block_manager.num_prefix_hits

    @property
    def num_evictions(self) -> int:     # cached blocks that made room for others
        return self.block_manager.num_evictions

    def add_observer(self, observer: EngineObserver) -> None:
        self.observers.append(observer)
        self.block_manager.record_events(True)

    def remove_observer(self, observer: EngineObserver) -> None:
        self.observers.remove(observer)
        if not self.observers:
            self.block_manager.record_events(False)

    # -- live controls (between steps) ---------------------------------------------------
    def knobs(self) -> dict:
        return {k: getattr(self.config, k) for k in KNOBS}

    def set_knobs(self, **knobs) -> dict:
        """Change scheduler knobs between steps, validated as at start-up; returns those in force."""
        if unknown := set(knobs) - set(KNOBS):
            raise ValueError(f"unknown knob(s) {sorted(unknown)}; knobs are {', '.join(KNOBS)}")
        merged = {**self.knobs(), **knobs}
        check_chunking(merged["enable_chunked_prefill"], merged["max_num_batched_tokens"], self.max_model_len)
        EngineConfig(**{**vars(self.config), **merged})   # runs the config's checks
        vars(self.config).update(merged)
        return self.knobs()

    def reset(self) -> list[Sequence]:
        """Abort every request and empty the KV pool and prefix cache. Returns the aborted."""
        aborted = [s for seq in self.live_sequences() for s in seq.choices]
        for seq in aborted:
            self.finish(seq, "abort")
        bm = self.block_manager
        self.block_manager = self.scheduler.block_manager = BlockManager(
            bm.num_blocks, bm.block_size, bm.enable_prefix_caching, bm.hash_algo)
        self.block_manager.record_events(bool(self.observers))
        for obs in self.observers:
            obs.on_reset()
        return aborted

    # -- one step ----------------------------------------------------------------------
    def step(self) -> tuple[list[TokenDelta], list[Sequence]]:
        """Schedule, run the model, append tokens. Returns (new tokens, finished sequences)."""
        t0 = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        if not out.entries:
            return [], []
        t1 = time.perf_counter()
        eager = any([obs.on_scheduled(out) for obs in self.observers])   # every observer hears it
        if self.workers is None:
            result, failed = run_isolating(self.runner, out, self.generators, eager)
            ended = self._fail_alone(out, failed)
        else:
            ended = []
            try:
                result = self.runner.run(out, self.generators, eager)
            except RuntimeError as exc:
                return [], self._fail_everything(f"a tensor-parallel worker failed: {exc}")
        if result.spec_logits:
            self.speculator.verify(out, result, self.generators, self.runner.generator)
        t2 = time.perf_counter()
        deltas, finished = self.scheduler.postprocess(out, result.tokens)
        if self.detokenizer.live:
            deltas = self._detokenize(deltas, finished)
        if result.logprobs:   # each appended token's {logprob, top}, in the order its sequence drew them
            drawn = {seq_id: iter(entries) for seq_id, entries in result.logprobs.items()}
            for d in deltas:
                if d.seq.seq_id in drawn:
                    d.logprob = next(drawn[d.seq.seq_id])
                    d.seq.logprobs.append(d.logprob)
        for seq in finished:
            self._cleanup(seq)
        comm = self.workers.group.comm.take() if self.workers is not None else 0   # counted every step
        if self.observers:
            record = StepRecord(out, result, deltas, finished, self.take_block_events(), comm, schedule_seconds=t1 - t0,
                                model_seconds=t2 - t1, total_seconds=time.perf_counter() - t0,
                                num_waiting=len(self.scheduler.waiting), num_running=len(self.scheduler.running),
                                token_budget=self.config.max_num_batched_tokens, max_num_seqs=self.config.max_num_seqs)
            for obs in self.observers:
                obs.on_step(record)
        return deltas, ended + finished

    def _detokenize(self, deltas: list[TokenDelta], finished: list[Sequence]) -> list[TokenDelta]:
        """The tokens' text; a stop string ends its sequence there (later tokens are dropped)."""
        deltas, stopped = self.detokenizer.process(deltas)
        for seq, num_output in stopped.items():
            del seq.token_ids[seq.num_prompt_tokens + num_output:]
            if seq.is_finished:
                seq.finish_reason = "stop"
            else:
                self.scheduler.finish(seq, "stop")
                finished.append(seq)
        return deltas

    def _fail_alone(self, out, failed: dict[int, str]) -> list[Sequence]:
        """Requests whose own row failed end with the error (the step went on without them)."""
        ended = []
        for entry in out.entries:
            if entry.seq.seq_id in failed:
                ended += entry.seq.choices
                self.finish(entry.seq, "error", f"this request's step failed: {failed[entry.seq.seq_id]}")
        return ended

    def _fail_everything(self, reason: str) -> list[Sequence]:
        """A rank is gone: every request fails with the reason and the other ranks stop."""
        self.workers.shutdown()
        failed = self.live_sequences()
        for seq in failed:
            self.finish(seq, "error", reason)
        self.failure = reason
        return failed

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        """Finish `seq`; its choices not forked yet end with it (their prompt is its prompt)."""
        orphans, seq.forks = seq.forks, []
        for s in (seq, *orphans):
            if not s.is_finished:
                self.scheduler.finish(s, reason, error)
                self._cleanup(s)

    def _cleanup(self, seq: Sequence) -> None:
        self.generators.pop(seq.seq_id, None)
        self.detokenizer.drop(seq)
        if self.speculator is not None:
            self.speculator.release(seq)
        for obs in self.observers:
            obs.on_request_finished(seq)
