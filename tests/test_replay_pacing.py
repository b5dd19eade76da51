"""Replay is paced by engine steps (one rule, shared with the browser's ReplaySocket): step
groups end after a `step` event and what the engine published with it, and a replay sends
BASE_STEPS_PER_S × speed groups a second whatever the recorded wall-clock gaps."""
from __future__ import annotations

from kvscope.instrumentation.recording import BASE_STEPS_PER_S, Replayer, step_group_ends


def ev(kind: str, ts: float) -> dict:
    return {"type": kind, "ts": ts}


EVENTS = [ev("hello", 0), ev("request.added", 0.1), ev("request.token", 0.2), ev("step", 0.2), ev("kv", 0.2),
          ev("memory", 0.21), ev("request.token", 30.0), ev("step", 30.0), ev("kv", 30.0),
          ev("request.finished", 30.01), ev("step", 30.02), ev("engine", 99.0)]


def test_groups_end_with_the_step_and_what_came_with_it():
    assert step_group_ends(EVENTS) == [6, 9, 11, 12]
    assert step_group_ends([]) == [0] and step_group_ends([ev("hello", 0)]) == [1]


def test_one_group_per_interval_whatever_the_recorded_gaps():
    player = Replayer(EVENTS, speed=2.0)
    interval = 1 / (BASE_STEPS_PER_S * 2.0)
    player.play(100.0)
    assert [e["type"] for e in player.due(100.0)][-3:] == ["step", "kv", "memory"]   # the first group at once
    assert player.due(100.0 + interval * 0.5) == []      # a 30 s gap in the recording is one interval here
    assert [e["type"] for e in player.due(100.0 + interval)] == ["request.token", "step", "kv"]
    player.pause()
    assert player.due(200.0) == []
    assert [e["type"] for e in player.step()] == ["request.finished", "step"]
    assert player.step() == [ev("engine", 99.0)] and player.done and player.step() == []
