"""How fast the engine may go, so a person can watch: slow motion (between any two steps), a
request's pace (between two of its own steps) and a hold (only the tokens its owner grants).
A waiting request is paused in the engine (`LLMEngine.pause`); the rules are kept here."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.engine import LLMEngine, TokenDelta
from kvscope.engine.sequence import Sequence

MAX_INTERVAL_S = 10.0


def check_interval(seconds: float) -> float:
    if not 0 <= seconds <= MAX_INTERVAL_S:
        raise ValueError(f"a step interval must be between 0 and {MAX_INTERVAL_S:g} s; got {seconds:g}")
    return float(seconds)


@dataclass
class RequestPace:
    interval_s: float
    due: float = 0.0          # the earliest time this request may take its next step


@dataclass
class Pacing:
    engine: LLMEngine
    min_step_interval_s: float = 0.0               # slow motion: engine-wide
    paced: dict[int, RequestPace] = field(default_factory=dict)   # seq_id -> its pace
    allowance: dict[int, int] = field(default_factory=dict)       # seq_id -> tokens a held request may still draw
    last_step_at: float | None = None

    def set_slow_motion(self, seconds: float) -> float:
        self.min_step_interval_s = check_interval(seconds)
        return self.min_step_interval_s

    def pace(self, seq: Sequence, seconds: float) -> None:
        """Step `seq` at most once per `seconds` (0: full speed), on the beat of others at that interval."""
        check_interval(seconds)
        if seconds == 0:
            self.release(seq)
            return
        self.allowance.pop(seq.seq_id, None)   # a paced request is stepped by time, not by `next`
        self.engine.resume(seq.request_id)     # until gate() finds it not due
        beat = next((p.due for sid, p in self.paced.items() if p.interval_s == seconds and sid != seq.seq_id), 0.0)
        self.paced[seq.seq_id] = RequestPace(seconds, beat)

    def hold(self, seq: Sequence) -> None:
        """Its owner steps it now, a token at a time (grant), not its pace."""
        self.paced.pop(seq.seq_id, None)
        self.allowance[seq.seq_id] = 0
        self.engine.pause(seq.request_id)

    def grant(self, seq: Sequence, tokens: int = 1) -> None:
        """A held request may draw `tokens` more, then waits again."""
        self.allowance[seq.seq_id] = tokens
        self.engine.resume(seq.request_id)

    def release(self, seq: Sequence) -> None:
        """Neither held nor paced: it runs at full speed."""
        self.forget(seq)
        self.engine.resume(seq.request_id)

    def wait_before_step(self, now: float) -> float:
        """Seconds the next engine step must still wait under slow motion (0: go)."""
        if not self.min_step_interval_s or self.last_step_at is None:
            return 0.0
        return max(0.0, self.last_step_at + self.min_step_interval_s - now)

    def gate(self, now: float) -> float | None:
        """Pause the paced requests not due yet, resume the due ones; the earliest due time, or None."""
        if not self.paced:
            return None
        waiting = []
        for seq in self.engine.live_sequences():
            pace = self.paced.get(seq.seq_id)
            if pace is not None and now < pace.due:
                self.engine.pause(seq.request_id)
                waiting.append(pace.due)
            elif pace is not None:
                self.engine.resume(seq.request_id)
        return min(waiting, default=None)

    def stepped(self, advanced: list[Sequence], deltas: list[TokenDelta], finished: list[Sequence],
                now: float) -> None:
        """After a step: paced requests that ran wait an interval; held ones out of allowance wait for a grant."""
        self.last_step_at = now
        for seq in advanced:
            pace = self.paced.get(seq.seq_id)
            if pace is not None:
                pace.due = now + pace.interval_s
        for d in deltas:
            left = self.allowance.get(d.seq.seq_id)
            if left is not None:
                self.allowance[d.seq.seq_id] = max(0, left - 1)
                if left <= 1:
                    self.engine.pause(d.seq.request_id)
        for seq in finished:
            self.forget(seq)

    def forget(self, seq: Sequence) -> None:
        self.paced.pop(seq.seq_id, None)
        self.allowance.pop(seq.seq_id, None)
