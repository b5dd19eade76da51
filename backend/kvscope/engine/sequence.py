"""One request as the engine sees it: its tokens, how many have been computed, its blocks."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from kvscope.sampling_params import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False, slots=True)   # its fields are read several times per row and step
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_ids))
    source: str = "api"
    status: SequenceStatus = SequenceStatus.WAITING
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0      # tokens whose K/V are in the cache
    num_cached_tokens: int = 0        # of those, how many came from prefix-cache hits
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hash of each full block
    cache_salt: str | None = None     # vLLM's per-request salt: only equal salts share cached blocks
    grammar: object | None = None     # its structured-output matcher (engine/sampler.py)
    last_block_recomputed: bool = False   # its whole last block was cached, yet computed again (vLLM's rule)
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    num_preemptions: int = 0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    text: str = ""                    # detokenized output so far (when streamed or stopped on strings)
    detokenizer: object | None = None  # its IncrementalDetokenizer, when its text is needed token by token
    allowance: int | None = None      # tokens it may still draw before it waits (None: no limit)
    prefill_chunk_size: int | None = None   # its own cap on prompt tokens per step, under the engine's
    forks: list["Sequence"] = field(default_factory=list)  # choices 1..n-1, forked when the prompt is done
    spec_token_ids: list[int] = field(default_factory=list)   # drafts awaiting verification

    def __post_init__(self):
        self.request_id = self.request_id or f"req-{self.seq_id}"
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def held(self) -> bool:
        """Out of allowance: not scheduled until its owner (or its pace) grants more."""
        return self.allowance == 0

    @property
    def choices(self) -> list["Sequence"]:
        """This sequence and the choices still waiting to fork from it (a request's n > 1
        choices before its prompt is computed): what ends when its prompt ends."""
        return [self, *self.forks]

    def append_token(self, token_id: int) -> None:
        now = time.perf_counter()
        if self.first_token_time is None:
            self.first_token_time = now
        self.token_times.append(now)
        self.token_ids.append(token_id)

    def finish(self, reason: str, error: str | None = None) -> None:
        self.status, self.finish_reason, self.error = SequenceStatus.FINISHED, reason, error

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


# -- its text, token by token -----------------------------------------------------------
# Incremental detokenization: text deltas as tokens arrive, a delta held back while it ends inside a
# multi-byte character (byte-level BPE splits UTF-8 across tokens); and the stop-string rule, which needs
# that text: the first stop string to appear ends the sequence and cuts its text where it begins. With
# stop strings, the last characters that could still begin one are held back from the deltas (as vLLM
# does), so a stop string split over several tokens never reaches a stream before it is recognised.


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.prefix_offset = 0   # output tokens before this are settled text
        self.read_offset = 0     # output tokens before this were decoded already
        self.sent = 0            # characters of seq.text handed out as deltas

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def step(self, seq: Sequence, final: bool) -> tuple[str, bool]:
        """Append the newest token's text to seq.text; return the text now safe to hand
        out and whether a stop string ended the sequence (the text is then cut where it
        begins). `final`: the sequence ends here anyway, so text held back is flushed."""
        delta = self._delta(seq)
        if final and not delta:
            delta = self._flush(seq)
        seq.text += delta
        stops = seq.params.stop
        cut = find_stop(seq.text, len(delta), stops)
        if stopped := (cut is not None):
            seq.text = seq.text[:cut]
        hold = 0 if final or stopped or not stops else max(map(len, stops)) - 1
        return self._hand_out(seq, len(seq.text) - hold), stopped

    def release(self, seq: Sequence) -> str:
        """What is still held back, when the sequence ends for another reason."""
        return self._hand_out(seq, len(seq.text))

    def _hand_out(self, seq: Sequence, end: int) -> str:
        end = max(self.sent, end)
        text, self.sent = seq.text[self.sent:end], end
        return text

    def _delta(self, seq: Sequence) -> str:
        ids = seq.output_token_ids
        settled = self._decode(ids[self.prefix_offset:self.read_offset])
        current = self._decode(ids[self.prefix_offset:])
        if current.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return current[len(settled):]

    def _flush(self, seq: Sequence) -> str:
        full = self._decode(seq.output_token_ids)
        return full[len(seq.text):] if full.startswith(seq.text) else ""


def find_stop(text: str, delta_len: int, stops: list[str]) -> int | None:
    """Earliest index in `text` where a stop string begins, looking only where the last
    delta could have completed one."""
    found = (text.find(stop, max(0, len(text) - delta_len - len(stop) + 1)) for stop in stops)
    return min((i for i in found if i != -1), default=None)
