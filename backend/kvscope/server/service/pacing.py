"""How fast the engine may go, so a person can watch it.

Two rules, both applied by the loop that drives the engine, between steps:
- slow motion: a minimum interval between any two engine steps (the instructor's, for the room);
- a per-request pace: a minimum interval between two steps *of one request* (a learner's demo
  request), so a page can slow its own request down without slowing anyone else's. A paced
  request sits out (its allowance is 0) until its interval has passed; the others keep running.

Pacing only ever sets `Sequence.allowance` on requests it paces, so the scheduler needs no
knowledge of it."""
from __future__ import annotations

from dataclasses import dataclass, field

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
    min_step_interval_s: float = 0.0               # slow motion: engine-wide
    paced: dict[int, RequestPace] = field(default_factory=dict)   # seq_id -> its pace
    last_step_at: float | None = None

    def set_slow_motion(self, seconds: float) -> None:
        self.min_step_interval_s = check_interval(seconds)

    def pace(self, seq: Sequence, seconds: float) -> None:
        """Step `seq` at most once per `seconds` (0: at full speed again). It joins the beat
        of the requests already paced at that interval, so a page's paced requests step
        together (one batch a beat) instead of taking turns."""
        check_interval(seconds)
        if seconds == 0:
            self.unpace(seq)
            return
        seq.allowance = None   # a paced request is stepped by time, not by `next`
        beat = next((p.due for sid, p in self.paced.items() if p.interval_s == seconds and sid != seq.seq_id), 0.0)
        self.paced[seq.seq_id] = RequestPace(seconds, beat)

    def unpace(self, seq: Sequence) -> None:
        if self.paced.pop(seq.seq_id, None) is not None:
            seq.allowance = None

    def wait_before_step(self, now: float) -> float:
        """Seconds the next engine step must still wait under slow motion (0: go)."""
        if not self.min_step_interval_s or self.last_step_at is None:
            return 0.0
        return max(0.0, self.last_step_at + self.min_step_interval_s - now)

    def gate(self, seqs: list[Sequence], now: float) -> float | None:
        """Hold each paced request that is not due yet, release the due ones. Returns the
        earliest time a held one becomes due (None if none waits)."""
        earliest = None
        for seq in seqs:
            pace = self.paced.get(seq.seq_id)
            if pace is None:
                continue
            seq.allowance = 0 if now < pace.due else None
            if seq.held:
                earliest = pace.due if earliest is None else min(earliest, pace.due)
        return earliest

    def stepped(self, scheduled: list[Sequence], finished: list[Sequence], now: float) -> None:
        """After a step: paced requests that ran wait a full interval from now."""
        self.last_step_at = now
        for seq in scheduled:
            pace = self.paced.get(seq.seq_id)
            if pace is not None:
                pace.due = now + pace.interval_s
        for seq in finished:
            self.paced.pop(seq.seq_id, None)

    def forget(self, seq: Sequence) -> None:
        self.paced.pop(seq.seq_id, None)
