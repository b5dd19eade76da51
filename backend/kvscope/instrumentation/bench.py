"""Instrumentation modes for `kvscope bench throughput --instrument MODE`, to measure what
listening costs the engine: `off` (no observer), `listen` (every event built and
serialised as the server sends it, nothing watched) and `watch` (as listen, and the first
N requests are watched, each by a viewer of its own: attention for every layer and head,
and its sampling). The sink serialises on the engine thread, so the figures include it."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kvscope.instrumentation.encode import frame
from kvscope.instrumentation.observer import Instrumentation

MODES = ("off", "listen", "watch")


@dataclass
class CountingSink:
    """Serialises each event as the server would, and counts events and bytes."""
    events: int = 0
    bytes: int = 0
    by_type: Counter = field(default_factory=Counter)

    def __call__(self, batch: list[dict]) -> None:
        for event in batch:
            self.events += 1
            self.by_type[event["type"]] += 1
            self.bytes += len(frame(event))


def attach_for_bench(engine, mode: str, watchers: int = 1) -> Instrumentation | None:
    """Attach before adding the benchmark's requests (`watchers`: how many of them are
    watched in mode `watch`). Returns the observer (its `sink` has the counts) or None for `off`."""
    if mode not in MODES:
        raise ValueError(f"instrument mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return None
    instr = Instrumentation(engine, CountingSink())
    instr.watch_next = watchers if mode == "watch" else 0
    return instr
