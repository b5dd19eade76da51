"""Incremental detokenization: text deltas as tokens arrive, holding back a delta while
it ends inside a multi-byte character (byte-level BPE splits UTF-8 across tokens), and the
stop-string rule, which needs that text: the first stop string to appear ends the sequence
and cuts its text where the stop string begins. With stop strings, the last characters
that could still begin one are held back from the deltas (as vLLM does), so a stop string
split over several tokens never reaches a stream before it is recognised."""
from __future__ import annotations

from kvscope.engine.sequence import Sequence


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
        stops, stopped = seq.params.stop, False
        if stops:
            cut = find_stop(seq.text, len(delta), stops)
            if cut is not None:
                seq.text, stopped = seq.text[:cut], True
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
    best = None
    for stop in stops:
        start = max(0, len(text) - delta_len - len(stop) + 1)
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best):
            best = i
    return best
