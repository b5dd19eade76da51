"""Recordings: a session's events as JSONL (a header line, then one event per line, as
sent), and a replayer that plays them back at a steady rate of engine steps (scaled by a
speed factor), and can pause and step to the next engine step."""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.instrumentation.encode import json_text
from kvscope.instrumentation.schema import READABLE_VERSIONS, SCHEMA_VERSION

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def header(name: str, model: str, description: str = "") -> dict:
    return {"type": "recording", "format": "kvscope-recording", "schema_version": SCHEMA_VERSION,
            "name": name, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "description": description, "model": model}


class Recorder:
    """Appends already-serialised events to a JSONL file. Thread-safe."""

    def __init__(self, path: Path, name: str, model: str, description: str = ""):
        if not NAME.match(name):
            raise ValueError("a recording name is 1-64 letters, digits, '_' or '-'")
        self.path, self.name = Path(path), name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self.events = 0
        self.write_text(json.dumps(header(name, model, description)), count=False)

    def write_text(self, line: str, count: bool = True) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self.events += count

    def write(self, event: dict) -> None:
        self.write_text(json_text(event))

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_recording(path: Path) -> tuple[dict, list[dict]]:
    """(header, events). Raises ValueError on a file that is not a kvscope recording."""
    lines = [ln for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    head = json.loads(lines[0])
    if head.get("format") != "kvscope-recording":
        raise ValueError(f"{path} is not a kvscope recording (no header line)")
    if head.get("schema_version") not in READABLE_VERSIONS:
        raise ValueError(f"{path} has schema version {head.get('schema_version')}; this reads "
                         f"{', '.join(map(str, READABLE_VERSIONS))} "
                         "(scripts/upgrade_recordings.py converts older ones)")
    return head, [json.loads(ln) for ln in lines[1:]]


# Replay is paced by engine steps, not by the wall-clock gaps of the recorded run (a CPU run's
# steps take milliseconds, its idle stretches seconds): a recording is cut into step groups,
# and a replay plays `BASE_STEPS_PER_S × speed` groups a second. frontend/js/lib/replay-socket.js
# applies the same rule in the browser.
BASE_STEPS_PER_S = 4.0
# What the engine publishes with a step, after the `step` event itself (docs/events.md).
AFTER_STEP = frozenset({"kv", "attention", "sampling", "memory", "spec"})


def step_group_ends(events: list[dict]) -> list[int]:
    """The index after the last event of each step group: everything up to a `step` event,
    that event, and what the engine published with it. The events after the last step are a
    group of their own."""
    ends, i, n = [], 0, len(events)
    while i < n:
        if events[i].get("type") == "step":
            i += 1
            while i < n and events[i].get("type") in AFTER_STEP:
                i += 1
            ends.append(i)
        else:
            i += 1
    if not ends or ends[-1] < n:
        ends.append(n)
    return ends


@dataclass
class Replayer:
    """Which events are due, given play/pause/step and a speed. The caller supplies time
    (seconds, monotonic) so the same logic serves asyncio, threads and tests. One step group
    is due every 1 / (BASE_STEPS_PER_S × speed) seconds while playing."""
    events: list[dict]
    speed: float = 1.0
    playing: bool = True
    position: int = 0              # index of the next event to send
    _next_due: float | None = None # wall time the next group is due (None: at once)
    _ends: list[int] = field(default_factory=list)

    def __post_init__(self):
        self._ends = step_group_ends(self.events)

    @property
    def done(self) -> bool:
        return self.position >= len(self.events)

    @property
    def interval(self) -> float:
        return 1.0 / (BASE_STEPS_PER_S * self.speed)

    def play(self, now: float) -> None:
        self.playing, self._next_due = True, now

    def pause(self) -> None:
        self.playing, self._next_due = False, None

    def set_speed(self, speed: float, now: float) -> None:
        self.speed = speed
        if self.playing and self._next_due is not None:
            self._next_due = min(self._next_due, now + self.interval)

    def _group(self) -> list[dict]:
        end = next(e for e in self._ends if e > self.position)
        out = self.events[self.position:end]
        self.position = end
        return out

    def step(self) -> list[dict]:
        """Paused: the next step group (up to its `step` event and what came with it)."""
        return [] if self.done else self._group()

    def due(self, now: float) -> list[dict]:
        """Playing: the step groups whose turn has come."""
        if not self.playing:
            return []
        if self._next_due is None:
            self._next_due = now
        out = []
        while not self.done and self._next_due <= now:
            out += self._group()
            self._next_due += self.interval
        return out

    def wait_time(self) -> float | None:
        """Seconds of wall time until the next group is due (None: paused or done)."""
        if self.done or not self.playing:
            return None
        return 0.0 if self._next_due is None else max(0.0, self._next_due - time.monotonic())
