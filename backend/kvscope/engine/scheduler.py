"""Continuous batching, vLLM V1's rule: under one token budget a step, each sequence's computed
count catches up with its tokens (and drafts), running ones first, then waiting ones from their
prefix-cache hits; when blocks run out the last admitted is preempted and recomputed later."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvscope.config import EngineConfig
from kvscope.engine.block_manager import BlockManager
from kvscope.engine.sequence import Sequence


@dataclass(slots=True)   # one per row and step: slots make it cheaper to build and read
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    start: int            # num_computed_tokens when scheduled: first position computed
    samples: bool         # this chunk reaches the last known token, so a new token is drawn
    kind: str             # "decode" (the newest token), "verify" (it and drafts), "prefill" (a prompt chunk)
    forks: list[Sequence] = field(default_factory=list)   # choices that draw from the same row, then fork
    spec_token_ids: list[int] = field(default_factory=list)   # drafts verified in this pass
    admitted: bool = False   # taken from the waiting queue this step (new, or back after preemption)

    @classmethod
    def row(cls, seq: Sequence, n: int, drafts: list[int] = (), admitted: bool = False) -> "ScheduledSeq":
        """`seq` computes n tokens: the known ones, then as many drafts as fit."""
        known = seq.num_tokens - seq.num_computed_tokens
        samples = n >= known
        drafts = list(drafts[:max(0, n - known)]) if drafts else []
        kind = "verify" if drafts else "decode" if n == 1 and known == 1 else "prefill"
        return cls(seq, n, seq.num_computed_tokens, samples, kind,
                   list(seq.forks) if samples and seq.forks else [], drafts, admitted)


@dataclass(slots=True)
class TokenDelta:
    """One token appended by postprocess."""
    seq: Sequence
    token_id: int
    index: int     # its position among the sequence's output tokens
    text: str = ""   # its text, when someone asked for text token by token (kvscope/detokenizer.py)
    logprob: dict | None = None   # {logprob, top}, when its request asked for logprobs


@dataclass
class SchedulerOutput:
    step: int
    entries: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)   # copy-on-write (src, dst)

    @property
    def num_batched_tokens(self) -> int:
        return sum(e.num_new_tokens for e in self.entries)


def check_chunking(enable_chunked_prefill: bool, max_num_batched_tokens: int, max_model_len: int) -> None:
    """Without chunked prefill a whole prompt must fit in one step's token budget."""
    if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
        raise ValueError(f"without chunked prefill, max_num_batched_tokens ({max_num_batched_tokens}) "
                         f"must be >= max_model_len ({max_model_len})")


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int,
                 eos_token_ids: set[int]):
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_steps = 0

    def admission_error(self, seq: Sequence) -> str | None:
        n = seq.num_prompt_tokens
        if n == 0:
            return "the prompt is empty"
        if n >= self.max_model_len:
            return f"prompt has {n} tokens; this engine's max_model_len is {self.max_model_len}"
        capacity = self.block_manager.capacity
        if n + 1 > capacity:
            return f"prompt has {n} tokens; the whole KV cache holds only {capacity}"
        return None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> SchedulerOutput:
        self.num_steps += 1
        out = SchedulerOutput(step=self.num_steps)
        budget = self._schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        out.block_copies = self.block_manager.take_copies()
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        queue = deque(self.running)   # admission order; the last admitted is the first preempted
        kept: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            if seq.paused or budget == 0:
                kept.append(seq)
                continue
            drafts, seq.spec_token_ids = seq.spec_token_ids, []
            n = self._chunk(seq, seq.num_tokens - seq.num_computed_tokens + len(drafts), budget)
            while not (appended := bm.try_append(seq, n)) and queue:
                self._preempt(queue.pop(), out)
            if not appended:
                self._preempt(seq, out)
                continue
            out.entries.append(ScheduledSeq.row(seq, n, drafts))
            budget -= n
            kept.append(seq)
        self.running = kept
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm, bs = self.block_manager, self.block_manager.block_size
        for seq in list(self.waiting):
            if budget == 0 or len(self.running) >= self.config.max_num_seqs:
                break
            if seq.paused:
                continue
            hits = bm.match_prefix(seq)
            remaining = seq.num_tokens - len(hits) * bs
            if remaining > budget and not self.config.enable_chunked_prefill:
                break
            n = self._chunk(seq, remaining, budget)
            if not bm.can_allocate(hits, len(hits) * bs + n):
                break
            bm.allocate(seq, hits, n)
            self.waiting.remove(seq)
            self.running.append(seq)
            out.entries.append(ScheduledSeq.row(seq, n, admitted=True))
            budget -= n

    def _chunk(self, seq: Sequence, remaining: int, budget: int) -> int:
        """What is left, within the budget and the engine's and request's prefill chunk."""
        caps = (self.config.prefill_chunk_size, seq.prefill_chunk_size)
        return min(remaining, budget, *(cap for cap in caps if cap))

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.block_manager.free(seq)
        seq.num_preemptions += 1   # (it leaves `running` with the kept list _schedule_running builds)
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def postprocess(self, out: SchedulerOutput,
                    sampled: dict[int, list[int]]) -> tuple[list[TokenDelta], list[Sequence]]:
        """Advance computed counts, append `sampled` (seq_id -> tokens drawn), finish what hit a
        stop condition; returns the tokens appended and the sequences finished."""
        appended: list[TokenDelta] = []
        finished: list[Sequence] = []
        for entry in out.entries:
            seq = entry.seq
            if seq.is_finished:      # aborted while the step ran
                continue
            # the known tokens' K/V are in; the drafts' count only once accepted (_append)
            seq.num_computed_tokens += entry.num_new_tokens - len(entry.spec_token_ids)
            self.block_manager.commit(seq)
            if not entry.samples:
                continue
            # the choices fork before the parent's token can finish it
            forked = self._fork(seq, entry.forks) if entry.forks else ()
            for s in (seq, *forked):
                self._append(s, sampled[s.seq_id], appended, finished, bool(entry.spec_token_ids))
        return appended, finished

    def _fork(self, parent: Sequence, forks: list[Sequence]) -> list[Sequence]:
        forked = [c for c in forks if not c.is_finished]
        for child in forked:
            self.block_manager.fork(parent, child)
            self.running.append(child)
        parent.forks = [c for c in parent.forks if c not in forks]
        return forked

    def _append(self, seq: Sequence, tokens: list[int], appended: list[TokenDelta],
                finished: list[Sequence], drafted: bool) -> None:
        """One by one, checking the stop rules after each (so accepted drafts never overshoot
        them); after a verify pass, rejected drafts' slots go back."""
        reason = None
        for token in tokens:
            seq.append_token(token)
            reason = self._check_stop(seq)
            appended.append(TokenDelta(seq, token, seq.num_output_tokens - 1))
            if reason:
                break
        if drafted:
            seq.num_computed_tokens = min(seq.num_computed_tokens + len(tokens) - 1, seq.num_tokens - 1)
            self.block_manager.commit(seq)
            self.block_manager.trim(seq)
        if reason:
            self.finish(seq, reason)
            finished.append(seq)

    def _check_stop(self, seq: Sequence) -> str | None:
        """A complete grammar, end tokens, lengths (stop strings: the detokenizer's pass)."""
        token, p = seq.token_ids[-1], seq.params
        if seq.grammar is not None and seq.grammar.accept(token):
            return "stop"
        if (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids:
            return "stop"
        n = len(seq.token_ids)   # the last test: the sequence filled the whole KV cache
        if n - len(seq.prompt_token_ids) >= p.max_tokens or n >= self.max_model_len or n >= self.block_manager.capacity:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.finish_reason, seq.error = reason, error

    def find(self, request_id: str) -> Sequence | None:
        # a choice still waiting for its prompt is found among its parent's
        return next((s for seq in (*self.running, *self.waiting) for s in seq.choices if s.request_id == request_id),
                    None)

