"""The engine as the server sees it and the operations every way in shares, run on its thread."""
from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from kvscope.server.service.async_engine import AsyncEngine, StreamDelta
from kvscope.instrumentation.kv_quant_probe import measure_kv_cache_dtype
from kvscope.engine import LLMEngine
from kvscope.heap import freeze_start_up, thaw
from kvscope.instrumentation.facts import hello_event
from kvscope.instrumentation.observer import Clock, Instrumentation, RequestLabel
from kvscope.instrumentation.tokens import tokens_event
from kvscope.instrumentation.watch import WatchRegistry, WatchSpec
from kvscope.llm import apply_chat_template
from kvscope.sampling_params import SamplingParams, StructuredOutputsParams
from kvscope.server.config import ServerConfig
from kvscope.server.classroom.hub import Hub
from kvscope.server.service.metrics import Metrics
from kvscope.server.classroom.policy import Policy, message_texts
from kvscope.server.classroom.sweeps import SYNTHETIC_PROMPTS, SweepAccounts
from kvscope.server.errors import CommandError


@dataclass
class Submitted:
    request_id: str
    num_prompt_tokens: int
    error: str | None = None


class ClassService(SweepAccounts):
    """What both services keep for the class: hub, policy, metrics, request ids, sweeps."""
    default_learner_share = 16

    def __init__(self, config: ServerConfig, watches: WatchRegistry | None = None):
        self.sweeps = {}   # by owner: one sweep per viewer at a time (SweepAccounts)
        self.config, self.clock, self.started_at = config, Clock(), time.time()
        self.metrics = Metrics()
        self.policy = Policy(config)
        self.hub = Hub(self.clock, self.metrics, watches)
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        # tokenizing a long prompt (or probing a server) takes a while: one worker thread, never the event loop
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvscope-worker")

    def new_request_id(self) -> str:
        return f"r{next(self._ids)}"

    def spawn(self, coro) -> None:
        """Run `coro` on the event loop, kept alive until it ends (or the server stops)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._worker.shutdown(wait=False, cancel_futures=True)

    async def drop_viewer(self, viewer_id: str, request_ids: list[str]) -> None:
        """A viewer left: its requests are cancelled."""
        for rid in request_ids:
            await self.cancel(rid)

    async def off_loop(self, fn, *args):
        """fn(*args) on the worker thread, so the event loop keeps serving everyone."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    @property
    def learner_share(self) -> int:
        """Requests learners may have in flight together: below the engine's capacity."""
        limit = self.config.limits.max_learner_requests
        return limit if limit is not None else self.default_learner_share


class EngineService(ClassService):
    def __init__(self, engine: LLMEngine, config: ServerConfig):
        watches = WatchRegistry()   # one record of who watches what, shared by the hub
        super().__init__(config, watches)
        self.engine = engine
        self.instr = Instrumentation(engine, self.hub.publish_threadsafe, self.clock, watches=watches)
        self.hub.publish_threadsafe([self.instr.kv_snapshot(), self.instr.memory()])
        self.model_name = engine.model_config.name or engine.model_path.name
        self.hello = hello_event(engine, self.instr.facts, started_at=self.started_at)
        self.aengine: AsyncEngine | None = None
        self.held_since: dict[str, float] = {}   # a learner's held request -> when it was last stepped
        self.default_learner_share = max(1, engine.config.max_num_seqs // 2)

    def start(self) -> None:
        self.hub.loop = asyncio.get_running_loop()
        self.aengine = AsyncEngine(self.engine)
        self.spawn(self._cancel_stale_holds())
        freeze_start_up()   # the engine is built and compiled: what it made stays out of the GC's walks

    def stop(self) -> None:
        super().stop()
        self.hub.stop_recording()
        if self.aengine is not None:
            self.aengine.shutdown()
        thaw()

    def mark_held(self, rid: str, held: bool) -> None:
        """Held or not on the pages; a learner's held request starts its hold timeout."""
        self.hub.set_held(rid, held)
        owner = self.hub.viewers.get(self.hub.owners.get(rid, ""))
        if held and (owner is None or not owner.is_instructor):
            self.held_since[rid] = time.monotonic()
        else:
            self.held_since.pop(rid, None)

    async def _cancel_stale_holds(self) -> None:
        """A held request keeps its slot and blocks; one nobody steps is cancelled."""
        while True:
            timeout = self.config.limits.hold_timeout_s
            await asyncio.sleep(min(5.0, max(0.2, timeout / 4)))
            now = time.monotonic()
            for rid, since in list(self.held_since.items()):
                if rid not in self.hub.requests or now - since > timeout:
                    self.held_since.pop(rid, None)
                    if rid in self.hub.requests:
                        await self.cancel(rid)

    def tokenize(self, text: str, chat: bool = False) -> dict:
        tok = self._tokenizer()
        if chat:
            text = apply_chat_template(tok, [{"role": "user", "content": text}])
        return tokens_event(tok, text, ts=self.clock())

    def prompt_ids(self, prompt: str | None = None, messages: list[dict] | None = None,
                   token_ids: list[int] | None = None) -> tuple[list[int], str | None]:
        """(token ids, prompt text) from whichever form the client used."""
        if token_ids is not None:
            try:
                return self.engine.tokenize(list(token_ids)), None
            except ValueError as exc:
                raise CommandError("invalid_field", f"prompt_token_ids: {exc}") from None
        if messages is not None:
            try:
                prompt = apply_chat_template(self._tokenizer(), messages)
            except ValueError as exc:
                raise CommandError("invalid_field", f"messages: {exc}") from None
        if not prompt:
            raise CommandError("invalid_field", "give one of prompt, messages or prompt_token_ids")
        return self._tokenizer().encode(prompt, add_special_tokens=False), prompt

    async def checked_prompt(self, body: dict, instructor: bool) -> tuple[list[int], str | None]:
        """(token ids, text) of the prompt in `body`: characters checked first, tokenized off the event loop."""
        if "prompt" in body:
            self.policy.check_prompt_text(body["prompt"], instructor)
        for text in message_texts(body.get("messages") or []):
            self.policy.check_prompt_text(text, instructor, "a message")
        ids, text = await self.off_loop(self.prompt_ids, body.get("prompt"), body.get("messages"),
                                        body.get("prompt_token_ids"))
        if text is not None:
            self.policy.check_prompt_text(text, instructor)
        self.policy.check_prompt_tokens(ids, instructor)
        return ids, text

    def _tokenizer(self):
        if self.engine.tokenizer is None:
            raise CommandError("engine", "this model has no tokenizer: submit prompt_token_ids")
        return self.engine.tokenizer

    async def compile_grammar(self, constraint: StructuredOutputsParams) -> None:
        """Off the engine thread: a bad grammar is the caller's ValueError, and no step waits on a compile."""
        await self.off_loop(self.engine.compile_grammar, constraint)

    async def submit(self, rid: str, ids: list[int], params: SamplingParams, source: str,
                     label: RequestLabel, watch: tuple[str, WatchSpec] | None = None,
                     pace_s: float = 0.0, prefill_chunk_tokens: int | None = None,
                     cache_salt: str | None = None) -> Submitted:
        """A request whose events reach its owner through the hub; `prefill_chunk_tokens` caps its prompt's chunks,
        `cache_salt` (vLLM's field): only equal salts share prefix-cache blocks."""
        done = await self.aengine.call(lambda: self._admit(rid, ids, params, source, label, watch, pace_s,
                                                            prefill_chunk_tokens, cache_salt))
        if label.held and not done.error:
            self.mark_held(rid, True)
        return done

    def _admit(self, rid: str, ids: list[int], params: SamplingParams, source: str, label: RequestLabel,
               watch: tuple[str, WatchSpec] | None = None, pace_s: float = 0.0,
               prefill_chunk_tokens: int | None = None, cache_salt: str | None = None) -> Submitted:
        """Add one request to the engine; runs on the engine thread, between two steps."""
        self.instr.labels[rid] = replace(label, source=source)
        try:
            seq = self.engine.add_request(ids, params, rid, cache_salt=cache_salt, prefill_chunk_size=prefill_chunk_tokens)
        except ValueError as exc:
            self.instr.labels.pop(rid, None)
            return Submitted(rid, len(ids), str(exc))
        if seq.is_finished:
            return Submitted(rid, seq.num_prompt_tokens, seq.error or "refused")
        if label.held:
            self.aengine.pacing.hold(seq)
        elif pace_s:
            self.aengine.pacing.pace(seq, pace_s)
        if watch is not None:
            self.instr.watch(rid, watch[0], watch[1], seq)
        return Submitted(rid, seq.num_prompt_tokens)

    def stream(self, rid: str, ids: list[int], params: SamplingParams, source: str,
               label: RequestLabel, cache_salt: str | None = None) -> AsyncIterator[StreamDelta]:
        """A request's token deltas (OpenAI routes); leaving early aborts it."""
        self.instr.labels[rid] = replace(label, source=source)
        return self.aengine.generate(ids, params, rid, cache_salt=cache_salt)

    async def cancel(self, rid: str) -> bool:
        return await self.aengine.abort(rid)

    def _live(self, rid: str):
        """A live request (on the engine thread), or the caller's unknown_request."""
        seq = self.engine.find(rid)
        if seq is None:
            raise CommandError("unknown_request", f"no request {rid!r} is in flight")
        return seq

    async def on_request(self, rid: str, fn) -> None:
        await self.aengine.call(lambda: fn(self._live(rid)))

    async def hold(self, rid: str) -> None:
        await self.on_request(rid, self.aengine.pacing.hold)   # stepped by its owner now, not by time
        self.mark_held(rid, True)

    async def next_token(self, rid: str) -> None:
        def release_one(seq):
            if not seq.paused:
                raise CommandError("invalid_field", f"request {rid!r} is not held: send hold first")
            self.aengine.pacing.grant(seq)
        await self.on_request(rid, release_one)
        if rid in self.held_since:
            self.held_since[rid] = time.monotonic()

    async def release(self, rid: str) -> None:
        await self.on_request(rid, self.aengine.pacing.release)
        self.mark_held(rid, False)

    async def pace(self, rids: list[str], seconds: float) -> None:
        """Step these requests at most once per `seconds`; paced together, so held ones start together."""
        def pace():
            for seq in [self._live(rid) for rid in rids]:   # all found before any is paced
                self.aengine.pacing.pace(seq, seconds)
        await self.aengine.call(pace)
        for rid in rids:
            self.mark_held(rid, False)

    async def watch(self, rid: str, viewer_id: str, spec: WatchSpec) -> None:
        await self.on_request(rid, lambda seq: self.instr.watch(rid, viewer_id, spec, seq))

    async def unwatch(self, rid: str, viewer_id: str) -> None:
        await self.aengine.call(lambda: self.instr.unwatch(rid, viewer_id))

    async def drop_viewer(self, viewer_id: str, request_ids: list[str]) -> None:
        await super().drop_viewer(viewer_id, request_ids)
        await self.aengine.call(lambda: self.instr.drop_viewer(viewer_id))

    # the instructor's controls (pause, resume, step and reset are AsyncEngine's own)
    async def slow_motion(self, seconds: float) -> float:
        """The minimum interval between two engine steps (0: full speed)."""
        return await self.aengine.call(lambda: self.aengine.pacing.set_slow_motion(seconds))

    async def set_knobs(self, knobs: dict) -> dict:
        def apply():
            try:
                return self.engine.set_knobs(**knobs)
            except ValueError as exc:
                raise CommandError("invalid_field", str(exc)) from None
        return await self.aengine.call(apply)

    async def sweep_prompt_ids(self) -> list[list[int]]:
        tok = self._tokenizer()
        return [tok.encode(p, add_special_tokens=False) for p in SYNTHETIC_PROMPTS]

    async def run_sweep_request(self, rid: str, ids: list[int], params: SamplingParams, label: RequestLabel) -> None:
        async for _ in self.stream(rid, ids, params, "ws", label):
            pass

    async def measure_kv_cache_dtype(self, ids: list[int], kv_cache_dtype: str, max_tokens: int) -> dict:
        """Blocks gained and logit error of `kv_cache_dtype` at this engine's KV budget, between two steps."""
        engine = self.engine
        if engine.plan.tensor_parallel_size > 1:
            raise CommandError("engine", "kv_quant runs the model on one rank; this engine is tensor-parallel")

        def run() -> dict:
            block_size = engine.config.block_size   # the pool as this engine stores it
            budget = engine.plan.num_blocks * block_size * self.instr.facts.kv_bytes_per_token
            start = time.perf_counter()
            result = measure_kv_cache_dtype(engine.model, engine.model_config, engine.dtype, engine.device, ids,
                                            kv_cache_dtype, max_tokens, block_size, budget)
            return {**result.as_dict(), "elapsed_s": time.perf_counter() - start}
        return await self.aengine.call(run)

    async def inject(self, n: int, max_tokens: int = 32, prompt_tokens: int | None = None) -> list[str]:
        """N synthetic requests, as if N learners had pressed submit at once."""
        tok = self._tokenizer()
        requests = []
        for i in range(n):
            ids = tok.encode(SYNTHETIC_PROMPTS[i % len(SYNTHETIC_PROMPTS)], add_special_tokens=False)
            if prompt_tokens:
                ids = (ids * (prompt_tokens // len(ids) + 1))[:prompt_tokens]
            params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, seed=i)
            requests.append((self.new_request_id(), ids, params, RequestLabel(prompt=tok.decode(ids))))
        # All N between the same two steps: the next step sees every one of them, as a class's burst.
        await self.aengine.call(lambda: [self._admit(rid, ids, params, "synthetic", label)
                                         for rid, ids, params, label in requests])
        return [rid for rid, *_ in requests]

    def engine_state(self, reason: str) -> dict:
        engine, rec = self.engine, self.hub.recorder
        return {"type": "engine", "ts": self.clock(), "reason": reason,
                "paused": bool(self.aengine and self.aengine.paused), "step": engine.num_steps,
                "slow_motion_s": self.aengine.pacing.min_step_interval_s if self.aengine else 0.0,
                "knobs": engine.knobs(), "num_running": engine.num_running,
                "num_waiting": engine.num_waiting, "num_viewers": len(self.hub.viewers),
                "recording": None if rec is None else {"name": rec.name, "events": rec.events}}

    def health(self) -> dict:
        engine, aengine = self.engine, self.aengine
        return {"status": "ok" if aengine and aengine.error is None else "degraded", "model": self.model_name,
                "step": engine.num_steps, "paused": bool(aengine and aengine.paused), "running": engine.num_running,
                "waiting": engine.num_waiting, "viewers": len(self.hub.viewers), "free_blocks": engine.num_free_blocks,
                "num_blocks": engine.plan.num_blocks}

    def recording_preamble(self) -> list[dict]:
        """What a recording starts with, so a replay opens like a live connection."""
        state = self.engine_state("recording")
        return [{**self.hello, "ts": self.clock()}, state,
                *self.hub.snapshots({"kv", "memory", "request"})]
