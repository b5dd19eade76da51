"""Recordings: a session's events as JSONL (a header line, then one event per line, as
sent), and a replayer that plays them back with the original gaps scaled by a speed
factor, and can pause and step to the next engine step."""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.instrumentation.encode import dumps
from kvscope.instrumentation.schema import SCHEMA_VERSION

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
        self.write_text(dumps(event))

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
    if head.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path} has schema version {head.get('schema_version')}, this is {SCHEMA_VERSION}")
    return head, [json.loads(ln) for ln in lines[1:]]


@dataclass
class Replayer:
    """Which events are due, given play/pause/step and a speed. The caller supplies time
    (seconds, monotonic) so the same logic serves asyncio, threads and tests."""
    events: list[dict]
    speed: float = 1.0
    playing: bool = True
    position: int = 0
    _media_t: float = 0.0          # recording time reached (ts of the stream)
    _wall_t: float | None = None   # wall time when _media_t was reached
    _step_budget: int = field(default=0)

    def __post_init__(self):
        self._media_t = self.events[0].get("ts", 0.0) if self.events else 0.0

    @property
    def done(self) -> bool:
        return self.position >= len(self.events)

    def play(self, now: float) -> None:
        self.playing, self._wall_t = True, now

    def pause(self) -> None:
        self.playing, self._wall_t = False, None

    def set_speed(self, speed: float, now: float) -> None:
        self._advance_clock(now)
        self.speed = speed

    def step(self) -> list[dict]:
        """Paused: everything up to and including the next `step` event."""
        out = []
        while not self.done:
            ev = self.events[self.position]
            self.position += 1
            out.append(ev)
            self._media_t = ev.get("ts", self._media_t)
            if ev.get("type") == "step":
                break
        return out

    def _advance_clock(self, now: float) -> None:
        if self.playing and self._wall_t is not None:
            self._media_t += (now - self._wall_t) * self.speed
        self._wall_t = now if self.playing else None

    def due(self, now: float) -> list[dict]:
        """Playing: the events whose time has come."""
        if not self.playing:
            return []
        if self._wall_t is None:
            self._wall_t = now
        self._advance_clock(now)
        out = []
        while not self.done and self.events[self.position].get("ts", 0.0) <= self._media_t:
            out.append(self.events[self.position])
            self.position += 1
        return out

    def wait_time(self) -> float | None:
        """Seconds of wall time until the next event is due (None: paused or done)."""
        if self.done or not self.playing:
            return None
        gap = self.events[self.position].get("ts", 0.0) - self._media_t
        return max(0.0, gap / self.speed)
