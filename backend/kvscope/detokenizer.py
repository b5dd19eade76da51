"""Text out: a sequence's text token by token, and the stop-string rule, which needs that text.

vLLM does both in its output processor, beside the engine core; here `LLMEngine.step` runs
them after the scheduler appended the step's tokens and before observers hear the step, so a
stop string ends its sequence before the next schedule. Text deltas are held back while they
end inside a multi-byte character (byte-level BPE splits UTF-8 across tokens). With stop strings,
the last characters that could still begin one are held back too (as vLLM does), so a stop
string split over several tokens never reaches a stream before it is recognised. A finished
sequence's text is derived from its tokens (`output_text`), so no text is kept once it ends."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # annotations only: the engine imports this module
    from kvscope.engine.scheduler import TokenDelta
    from kvscope.engine.sequence import Sequence


class IncrementalDetokenizer:
    """One sequence's text so far, and how much of it was handed out."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, stop
        self.text = ""
        self.prefix_offset = 0   # output tokens before this are settled text
        self.read_offset = 0     # output tokens before this were decoded already
        self.sent = 0            # characters of self.text handed out as deltas

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def step(self, ids: list[int], final: bool) -> tuple[str, bool]:
        """`ids`: the output tokens up to the newest. Returns the text now safe to hand out and
        whether a stop string ended the sequence (the text is then cut where it begins).
        `final`: the sequence ends here anyway, so text held back is flushed."""
        delta = self._delta(ids)
        if final and not delta:
            full = self._decode(ids)
            delta = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += delta
        cut = find_stop(self.text, len(delta), self.stop)
        if stopped := (cut is not None):
            self.text = self.text[:cut]
        hold = 0 if final or stopped or not self.stop else max(map(len, self.stop)) - 1
        end = max(self.sent, len(self.text) - hold)
        out, self.sent = self.text[self.sent:end], end
        return out, stopped

    def _delta(self, ids: list[int]) -> str:
        settled = self._decode(ids[self.prefix_offset:self.read_offset])
        current = self._decode(ids[self.prefix_offset:])
        if current.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return current[len(settled):]


class Detokenizer:
    """The incremental detokenizers of the live sequences that need text token by token: all of
    them when a stream asked for it (`stream`), else those with stop strings."""

    def __init__(self):
        self.stream = False
        self.live: dict[int, IncrementalDetokenizer] = {}   # seq_id -> its detokenizer

    def add(self, seq: Sequence, tokenizer) -> None:
        if tokenizer is not None and (self.stream or seq.params.stop):
            self.live[seq.seq_id] = IncrementalDetokenizer(tokenizer, seq.params.stop)

    def drop(self, seq: Sequence) -> None:
        self.live.pop(seq.seq_id, None)

    def process(self, deltas: list[TokenDelta]) -> tuple[list[TokenDelta], dict[Sequence, int]]:
        """Give each delta its text. A stop string ends its sequence at the token that completed
        it: returns the deltas kept (none past a stop) and, for each sequence a stop string
        ended, how many output tokens it keeps."""
        kept: list[TokenDelta] = []
        stopped: dict[Sequence, int] = {}
        last = {d.seq.seq_id: d.index for d in deltas}   # each sequence's newest token this step
        for d in deltas:
            seq, detok = d.seq, self.live.get(d.seq.seq_id)
            if seq in stopped:
                continue
            if detok is not None:
                start = seq.num_prompt_tokens
                final = seq.is_finished and d.index == last[seq.seq_id]
                d.text, hit = detok.step(seq.token_ids[start:start + d.index + 1], final)
                if hit:
                    stopped[seq] = d.index + 1
            kept.append(d)
        return kept, stopped


def find_stop(text: str, delta_len: int, stops: list[str]) -> int | None:
    """Earliest index in `text` where a stop string begins, looking only where the last
    delta could have completed one."""
    found = (text.find(stop, max(0, len(text) - delta_len - len(stop) + 1)) for stop in stops)
    return min((i for i in found if i != -1), default=None)


def output_text(seq: Sequence, tokenizer) -> tuple[str, str | None]:
    """A sequence's text from its tokens, and the stop string that ended it (None if none did):
    a stop string's text is cut where it begins (the first one to appear ended the sequence)."""
    if tokenizer is None or not seq.output_token_ids:
        return "", None
    text = tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
    if seq.finish_reason != "stop" or not seq.params.stop:
        return text, None
    cut = find_stop(text, len(text), seq.params.stop)
    if cut is None:
        return text, None
    return text[:cut], next(s for s in seq.params.stop if text.startswith(s, cut))
