"""Turns the engine's publication points into schema events and hands them, a batch at a
time, to a sink (the server's fan-out, a recorder, a benchmark counter).

Runs on the engine thread. A step's events (its tokens, a watched request's `sampling` and
`attention`, the finishes, then `step`, `kv`, `memory`) go to the sink in one call at the end of the step;
events between steps (a request added, aborted, a reset) go at once."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kvscope.detokenizer import output_text
from kvscope.engine.llm_engine import EngineObserver, StepRecord, TokenDelta
from kvscope.engine.scheduler import ScheduledSeq
from kvscope.engine.spec_decode import SpecStats
from kvscope.engine.step_inputs import StepBuffers
from kvscope.engine.sequence import Sequence
from kvscope.instrumentation.cost import step_cost
from kvscope.instrumentation.facts import model_facts
from kvscope.instrumentation import internals
from kvscope.instrumentation.kv_state import KVTracker
from kvscope.instrumentation.capture import Capture, QueryKeeper, WatchedRows, capture, watched_rows
from kvscope.instrumentation.memory import memory_event
from kvscope.instrumentation.spec import spec_events
from kvscope.instrumentation.watch import (Watch, WatchRegistry, WatchSpec, grammar_allowed, sampling_events,
                                           token_texts)

Sink = Callable[[list[dict]], None]
PROMPT_PREVIEW = 300


class Clock:
    """Seconds since a shared start, the `ts` of every event."""
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return round(time.perf_counter() - self.t0, 6)

    def at(self, perf_counter_time: float) -> float:
        return round(perf_counter_time - self.t0, 6)


@dataclass
class RequestLabel:
    """What the engine does not know about a request: who sent it and how it was asked."""
    owner: str | None = None
    source: str = "api"          # which door it came through (the WebSocket, generate, openai, synthetic)
    prompt: str | None = None
    held: bool = False
    watched: bool = False


def attention_event(seq: Sequence, step: int, layers: list[int], positions: list[int], context: int,
                    token_ids: list[int], weights, mean, heads: list[int], kv_heads: list[int], num_heads: int,
                    ts: float, recomputed: bool = False) -> dict:
    """weights: [len(layers), len(heads), rows, context] and mean (over every head): [len(layers),
    rows, context], arrays (float16, possibly still on their way to the host: encode.py reads
    them off the engine thread); token_ids: the ids at the context's last len(token_ids)
    positions; `recomputed`: rows the prefix cache spared the engine, rebuilt by the side pass."""
    return {"type": "attention", "ts": ts, "request_id": seq.request_id, "step": step, "layers": layers,
            "heads": heads, "kv_heads": kv_heads, "num_heads": num_heads,
            "query_positions": positions, "context_len": context, "token_ids": token_ids,
            "weights": weights, "mean": mean, "recomputed": recomputed}


def row_reason(row: ScheduledSeq) -> str:
    """Why a row is in the step, in the explainer's words."""
    if row.admitted:
        return "resumed after preemption" if row.seq.num_preemptions else "new request"
    return {"verify": "verify drafts", "decode": "decode", "prefill": "prefill chunk"}[row.kind]


class Instrumentation(EngineObserver):
    def __init__(self, engine, sink: Sink, clock: Clock | None = None, memory_interval: float = 0.25,
                 watches: WatchRegistry | None = None):
        self.engine = engine
        self.sink = sink
        self.clock = clock or Clock()
        self.memory_interval = memory_interval
        self.facts = model_facts(engine)
        self.tensor_parallel = engine.plan.tensor_parallel_size > 1
        self.kv = KVTracker(engine)
        self.labels: dict[str, RequestLabel] = {}   # request id -> label, set before submitting
        # request id -> who watches it. A registry shared with a fan-out is the fan-out's to
        # prune: it forgets a request once it has delivered the request's last event
        self.watches = watches if watches is not None else WatchRegistry()
        self._prune_watches = watches is None
        self._watched: list[WatchedRows] = []      # this step's watched rows, captured after it
        self._keeper: QueryKeeper | None = None     # tells the runner whose queries a step keeps; made on first use
        self._side_buffers: StepBuffers | None = None   # the side pass's own input arrays, made on first use
        self._embedding_facts: internals.EmbeddingFacts | None = None   # computed on first use
        self._token_text = token_texts(engine.tokenizer)
        self.watch_next = 0                         # benchmarks: watch the next N requests added
        self._token_times: dict[int, list[float]] = {}   # seq_id -> when its tokens were heard
        self._spec_stats: dict[int, SpecStats] = {}       # seq_id -> its drafts' running totals
        self._last_memory = float("-inf")
        self._last_work = (0, 0)
        engine.add_observer(self)

    def detach(self) -> None:
        self.engine.remove_observer(self)
        self._stop_keeping()

    def _stop_keeping(self) -> None:
        if self._keeper is not None and self.engine.keep_queries is self._keeper:
            self.engine.keep_queries = None
            self._keeper.release()

    # -- between steps -----------------------------------------------------------------
    def on_request_added(self, seq: Sequence) -> None:
        label = self.labels.get(seq.request_id) or RequestLabel()
        p = seq.params
        prompt = label.prompt[:PROMPT_PREVIEW] if label.prompt is not None else None
        self.sink([{
            "type": "request.added", "ts": self.clock(), "request_id": seq.request_id,
            "source": label.source, "owner": label.owner, "prompt": prompt,
            "prompt_token_ids": list(seq.prompt_token_ids), "num_prompt_tokens": seq.num_prompt_tokens,
            "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                       "seed": p.seed, "max_tokens": p.max_tokens, "stop": list(p.stop),
                       "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos,
                       "logprobs": p.logprobs},
            "watched": label.watched or self.watch_next > 0, "held": label.held}])
        if self.watch_next > 0 and not seq.is_finished:   # each by a viewer of its own
            self.watch_next -= 1
            self.watch(seq.request_id, f"bench-{seq.request_id}", WatchSpec(), seq)

    def on_request_finished(self, seq: Sequence) -> None:
        self.labels.pop(seq.request_id, None)
        if seq.finish_reason in ("stop", "length"):   # inside a step: published with the step (on_step)
            return
        self._spec_stats.pop(seq.seq_id, None)
        event = self._finished_event(seq, self.clock())
        self._forget_watch(seq)
        # abort, error, reset: between steps, publish now
        delta = self.kv.update([seq], [], self.engine.take_block_events(), self.engine.num_steps, self.clock())
        self.sink([event] + ([delta] if delta else []))

    def _finished_event(self, seq: Sequence, ts: float) -> dict:
        times = self._token_times.pop(seq.seq_id, [])
        end = times[-1] if times else time.perf_counter()
        return {"type": "request.finished", "ts": ts, "request_id": seq.request_id,
                "reason": seq.finish_reason, "error": seq.error, "text": output_text(seq, self.engine.tokenizer)[0],
                "num_prompt_tokens": seq.num_prompt_tokens, "num_output_tokens": seq.num_output_tokens,
                "num_cached_tokens": seq.num_cached_tokens, "num_preemptions": seq.num_preemptions,
                "ttft_s": seq.ttft, "e2e_s": max(0.0, end - seq.arrival_time),
                "itl_s": [round(b - a, 6) for a, b in zip(times, times[1:])]}

    def on_reset(self) -> None:
        self.kv = KVTracker(self.engine)   # reset: an empty pool
        self.watches.clear()
        self._token_times.clear()
        self._spec_stats.clear()
        self.sink([self.kv_snapshot()])

    def kv_snapshot(self) -> dict:
        return self.kv.snapshot(self.engine.num_steps, self.clock())

    # -- inside a step -----------------------------------------------------------------
    def on_scheduled(self, scheduled) -> bool:
        """Note where the watched sequences sit in this step, and ask the step to keep the
        queries of those whose attention is drawn (capture.py). Never asks for an eager
        step: every row keeps its fast path."""
        if not self.watches:
            self._stop_keeping()   # after a step that failed before on_step
            return False
        self._watched = watched_rows(scheduled, self.watches.by_seq_id(), self.facts.num_heads)
        if self._keeper is not None:
            self._keeper.kept = None
        keep = [r for r in self._watched if (r.layers is None or r.layers) and not r.side]
        if keep and not self.tensor_parallel:   # a rank's queries are its own heads only: sampling only there
            self._keeper = self._keeper or QueryKeeper(self.engine)
            self._keeper.rows, self._keeper.seq_ids = keep, {r.seq.seq_id for r in keep}
            self.engine.keep_queries = self._keeper
        else:
            self._stop_keeping()
        return False

    def _token_event(self, d: TokenDelta, step: int, ts: float) -> dict:
        seq = d.seq
        event = {"type": "request.token", "ts": ts,
                 "request_id": seq.request_id, "index": d.index, "token_id": d.token_id, "text": d.text,
                 "step": step}
        lp = d.logprob
        if lp is not None:
            event["logprob"] = lp["logprob"]
            event["top"] = [{"id": i, "logprob": v} for i, v in lp["top"]]
        allowed = grammar_allowed(seq.grammar, seq.grammar.vocab_size) if seq.grammar is not None else None
        if allowed is not None:
            event["allowed_tokens"] = int(allowed.sum())   # what the grammar's mask let through
        return event

    def on_step(self, record: StepRecord) -> None:
        now = time.perf_counter()
        out, ts = record.scheduled, self.clock.at(now)
        for d in record.tokens:
            self._token_times.setdefault(d.seq.seq_id, []).append(now)
        # the step's tokens, what a watcher sees of how they were computed and drawn (before the
        # finishes: a widget may stop listening at its request's end), the step's finishes, then
        # the step itself
        events = [self._token_event(d, out.step, ts) for d in record.tokens]
        if self._watched:
            events += self._watched_events(record, self._watched, ts)
            self._watched = []
            self._stop_keeping()
        events += [self._finished_event(seq, ts) for seq in record.finished]
        step_event = self._step_event(record, ts)
        events.append(step_event)
        touched = [s for e in out.entries for s in (e.seq, *e.forks)] + out.preempted + record.finished
        ranges = [(e.seq, e.start, e.num_new_tokens) for e in out.entries]
        delta = self.kv.update(touched, ranges, record.block_events, out.step, ts)
        if delta:
            events.append(delta)
        if record.result.spec:
            events += spec_events(record, self.engine, ts, self._spec_stats,
                                  set(self.watches.by_seq_id()) if self.watches else set())
        for seq in record.finished:
            self._forget_watch(seq)
            self._spec_stats.pop(seq.seq_id, None)
        self._last_work = (step_event["num_batched_tokens"], sum(1 for e in out.entries if e.samples))
        if ts - self._last_memory >= self.memory_interval:
            self._last_memory = ts
            events.append(self.memory())
        self.sink(events)

    def memory(self) -> dict:
        return memory_event(self.engine, self.facts, *self._last_work, self.clock())

    def _step_event(self, record: StepRecord, ts: float) -> dict:
        out = record.scheduled
        seqs = [{"request_id": e.seq.request_id,
                 "kind": "prefill" if e.kind == "prefill" else "decode",   # a verify pass draws tokens
                 "start": e.start, "num_tokens": e.num_new_tokens, "context_len": e.start + e.num_new_tokens,
                 "cached_tokens": e.seq.num_cached_tokens, "samples": e.samples,
                 "num_drafts": len(e.spec_token_ids), "reason": row_reason(e),
                 "last_block_recomputed": e.admitted and e.seq.last_block_recomputed} for e in out.entries]
        work = [(e.start, e.num_new_tokens, e.samples) for e in out.entries]
        event = {"type": "step", "ts": ts, "step": out.step, "seqs": seqs,
                "num_batched_tokens": out.num_batched_tokens, "token_budget": record.token_budget,
                "max_num_seqs": record.max_num_seqs, "preempted": [s.request_id for s in out.preempted],
                "finished": [s.request_id for s in record.finished],
                "queues": {"waiting": record.num_waiting, "running": record.num_running},
                "duration_s": record.total_seconds, "schedule_s": record.schedule_seconds,
                "model_s": record.model_seconds, "cost": step_cost(self.facts, work, record.model_seconds)}
        if self.tensor_parallel:   # what rank 0 sent through all-reduces and gathers
            event["allreduce_bytes"] = record.comm_bytes
        return event

    # -- watched requests --------------------------------------------------------------
    def watch(self, request_id: str, viewer: str, spec: WatchSpec, seq: Sequence | None = None) -> Watch:
        """Start (or change) `viewer`'s watch of a live request. Engine thread only."""
        seq = seq or self.engine.find(request_id)
        if seq is None:
            raise KeyError(request_id)
        return self.watches.add(request_id, viewer, spec, seq)

    def _forget_watch(self, seq: Sequence) -> None:
        if self._prune_watches:
            self.watches.forget(seq.request_id)

    def unwatch(self, request_id: str, viewer: str) -> None:
        self.watches.remove(request_id, viewer)

    def drop_viewer(self, viewer: str) -> None:
        self.watches.drop_viewer(viewer)

    def _watched_events(self, record: StepRecord, watched: list[WatchedRows], ts: float) -> list[dict]:
        """Sampling from the step's own logits rows, then attention from the queries it kept
        (and internals, from a side pass)."""
        watches: dict[int, Watch] = self.watches.by_seq_id()
        step, drawn = record.scheduled.step, record.result.tokens
        num_heads = self.facts.num_heads
        sampled, with_logits = [], []   # the rows whose draw is shown, and which also send their logits
        for r in watched:
            if (w := watches.get(r.seq.seq_id)) is None:
                continue
            w.covered = max(w.covered, r.end)
            if r.sample_row is not None and r.seq.seq_id in drawn and (wanted := w.wanted(num_heads)).sampling:
                sampled.append(r)
                with_logits.append(wanted.internals)
        events = []
        if sampled and record.result.logits is not None:   # one copy to the host for every watched row
            logits = record.result.logits[[r.sample_row for r in sampled]].float().cpu()
            events += sampling_events([r.seq for r in sampled], step, logits,
                                      [drawn[r.seq.seq_id][0] for r in sampled], self._token_text, ts, with_logits)
        drawn_rows = [r for r in watched if r.internals or r.layers is None or r.layers]
        if not drawn_rows or self.tensor_parallel:   # a side pass would need every rank: sampling only there
            return events
        if self._side_buffers is None:
            self._side_buffers = StepBuffers(self.engine.device)
        kept = self._keeper.take() if self._keeper is not None else None
        caught = capture(self.engine, drawn_rows, kept, self._side_buffers)
        return events + self._attention_events(caught, watches, step, ts) + self._internals_events(caught, step, ts)

    def _attention_events(self, capture: Capture, watches: dict[int, Watch], step: int, ts: float) -> list[dict]:
        """One event a watched request and step, every layer it watches in it (and one more
        for the rows the side pass recomputed, which end at another context)."""
        rows = {r.seq.seq_id: r for r in capture.watched}
        num_heads, group = self.facts.num_heads, self.facts.num_heads // self.facts.num_kv_heads
        every_head = list(range(num_heads))
        events = []
        for (seq_id, recomputed), (layers, positions, weights, mean) in sorted(
                capture.attention.items(), key=lambda item: (item[0][0], not item[0][1])):
            if (w := watches.get(seq_id)) is None:
                continue
            r = rows[seq_id]
            context = positions[-1] + 1 if recomputed else r.end
            heads = r.heads if r.heads is not None else every_head
            # the tokens new since its last event (every one for a viewer that just joined)
            start, w.fresh = 0 if w.fresh else positions[0], False
            events.append(attention_event(r.seq, step, layers, positions, context, r.seq.token_ids[start:context],
                                          weights, mean, heads, [h // group for h in heads], num_heads, ts,
                                          recomputed))
        return events

    def _internals_events(self, capture: Capture, step: int, ts: float) -> list[dict]:
        events = []
        model, tokenizer = self.engine.model, self.engine.tokenizer
        for r in capture.watched:
            if not r.internals:
                continue
            sid = r.seq.seq_id
            layers = [{what: capture.tensors[(sid, i, what)]
                       for what in ("input", "attention", "mlp", "output", "gate", "up")}
                      for i in range(len(model.model.layers))]
            if self._embedding_facts is None:
                used = len(tokenizer) if tokenizer is not None else None
                self._embedding_facts = internals.EmbeddingFacts.of(model.model.embed_tokens.weight, used)
            if r.positions[0] == 0:
                events.append(internals.rope_event(r.seq, step, self.engine.model_config, ts))
            events += [
                internals.embeddings_event(r.seq, step, r.positions, layers[0]["input"], self._embedding_facts,
                                           tokenizer, ts),
                internals.residual_event(r.seq, step, r.positions, layers, model, ts),
                internals.mlp_event(r.seq, step, r.positions, layers, ts),
                internals.logit_lens_event(r.seq, step, r.positions, layers, model, tokenizer, ts)]
        return events
