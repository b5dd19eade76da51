"""The engine in its own thread, each request an async iterator of deltas; commands run there between steps."""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kvscope.engine import LLMEngine
from kvscope.server.service.pacing import Pacing
from kvscope.engine.sequence import Sequence
from kvscope.llm import RequestOutput
from kvscope.sampling_params import SamplingParams


@dataclass
class StreamDelta:
    request_id: str
    token_id: int | None
    text: str
    logprob: dict | None = None
    finished: bool = False
    output: RequestOutput | None = None    # set on the last delta: this choice alone, in outputs[0]
    index: int = 0                         # which of the request's n choices


class AsyncEngine:
    def __init__(self, engine: LLMEngine, idle_wait: float = 0.05):
        engine.stream_text()
        self.engine = engine
        self.idle_wait = idle_wait
        self.paused = False
        self.pacing = Pacing(engine)                 # slow motion, per-request paces, holds
        self._commands: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        # seq_id -> (loop, queue, choice, when its tokens arrived)
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue, int, list[float]]] = {}
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvscope-engine", daemon=True)
        self._thread.start()

    # -- called from the event loop ----------------------------------------------------
    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread between steps and await its result."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._commands.put((fn, loop, future))
        self._wake.set()
        return await future

    async def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str = "",
                       on_added: Callable[[Sequence], None] | None = None,
                       cache_salt: str | None = None) -> AsyncIterator[StreamDelta]:
        """Deltas of every choice (params.n of them, told apart by `index`), until all finished."""
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue = asyncio.Queue()

        def add() -> list[Sequence]:
            seq = self.engine.add_request(prompt, params, request_id, cache_salt=cache_salt)
            for index, choice in enumerate(seq.choices):
                self._streams[choice.seq_id] = (loop, deltas, index, [])
                if choice.is_finished:   # refused at admission: the reason is the last delta
                    self._close(choice)
            return seq.choices

        choices = await self.call(add)
        if on_added is not None:
            on_added(choices[0])
        open_choices = set(range(len(choices)))
        try:
            while open_choices:
                delta = await deltas.get()
                if delta.finished:
                    open_choices.discard(delta.index)
                yield delta
        finally:
            if open_choices:   # the consumer went away: free its blocks now
                rids = [choices[i].request_id for i in open_choices]
                await self.call(lambda: [self._abort_now(rid) for rid in rids])

    async def abort(self, request_id: str) -> bool:
        return await self.call(lambda: self._abort_now(request_id))

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Steps run again, at the pace they had: slow motion and per-request paces stay."""
        self.paused = False
        self._wake.set()

    async def step_now(self) -> int | None:
        """Run one engine step now and return its number; None when no request can advance."""
        def one():
            if not self.engine.has_unfinished():
                return None
            self._step_and_push()
            return self.engine.num_steps
        return await self.call(one)

    async def reset(self) -> int:
        """Abort every request (their streams end with reason 'abort') and empty the KV pool."""
        def do():
            aborted = self.engine.reset()
            for seq in aborted:
                self._close(seq)
            return len(aborted)
        return await self.call(do)

    def shutdown(self) -> None:
        """Stop the thread, then the engine; open streams and pending calls are answered. Safe twice."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=10)
        if not self._thread.is_alive():   # else the thread, stuck in a step, still owns the engine
            for seq in self.engine.live_sequences():
                self._finish(seq, "abort")
            self._drain_commands(refuse=RuntimeError("the engine shut down"))
            self.engine.shutdown()

    # -- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._drain_commands()
            now = time.perf_counter()
            due = self.pacing.gate(now)
            if self.paused or not self.engine.has_unfinished():
                self._sleep(self.idle_wait if due is None else min(self.idle_wait, due - now))
                continue
            wait = self.pacing.wait_before_step(now)
            if wait > 0:   # slow motion: the room watches each step
                self._sleep(wait)
                continue
            if not self._step_and_push():   # nothing could run (e.g. all held): sleep, do not spin
                self._sleep(self.idle_wait)

    def _sleep(self, seconds: float) -> None:
        """Wait up to `seconds`, waking early for a command."""
        self._wake.wait(max(seconds, 0.001))
        self._wake.clear()

    def _step_and_push(self) -> bool:
        """One engine step and its deltas out; False when no request advanced."""
        before = [(seq, seq.num_computed_tokens) for seq in self.engine.live_sequences()]
        try:
            deltas, finished = self.engine.step()
        except Exception as exc:   # never leave a stream waiting forever
            self.error = exc
            for seq in self.engine.live_sequences():
                self._finish(seq, "error", f"engine error: {exc}")
            return True
        advanced = [seq for seq, computed in before if seq.num_computed_tokens != computed or seq.is_finished]
        now = time.perf_counter()
        self.pacing.stepped(advanced, deltas, finished, now)
        for d in deltas:
            self._push(d.seq, StreamDelta(d.seq.request_id, d.token_id, d.text, d.logprob), now)
        for seq in finished:
            self._close(seq)
        return bool(deltas or finished or advanced)

    def _drain_commands(self, refuse: Exception | None = None) -> None:
        """Run the waiting commands, or answer each with `refuse` (the engine is gone)."""
        while True:
            try:
                fn, loop, future = self._commands.get_nowait()
            except queue.Empty:
                return
            result, error = None, refuse
            if refuse is None:
                try:
                    result = fn()
                except Exception as exc:
                    error = exc
            loop.call_soon_threadsafe(_settle, future, result, error)

    def _abort_now(self, request_id: str) -> bool:
        seq = self.engine.find(request_id)
        if seq is not None:
            self._finish(seq, "abort")
        return seq is not None

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        group = seq.choices   # choices not forked yet end with their prompt
        self.engine.finish(seq, reason, error)   # observers hear of it too
        for choice in group:
            self._close(choice)

    def _push(self, seq: Sequence, delta: StreamDelta, now: float) -> None:
        stream = self._streams.get(seq.seq_id)
        if stream is not None:
            loop, q, delta.index, token_times = stream
            token_times.append(now)
            loop.call_soon_threadsafe(q.put_nowait, delta)

    def _close(self, seq: Sequence) -> None:
        self.pacing.forget(seq)
        stream = self._streams.pop(seq.seq_id, None)
        if stream is not None:
            loop, q, index, token_times = stream
            output = RequestOutput.from_sequences([seq], tokenizer=self.engine.tokenizer, indices=[index],
                                                  token_times=token_times)
            final = StreamDelta(seq.request_id, None, "", finished=True, output=output, index=index)
            loop.call_soon_threadsafe(q.put_nowait, final)


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
