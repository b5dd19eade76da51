"""Pacing: the instructor's slow motion (a minimum interval between engine steps) and a
learner's per-request pace (its own request steps slowly, the others at full speed),
against a real server and the embedded model."""
from __future__ import annotations

import pytest

from kvscope.server.service.pacing import Pacing
from kvscope.engine.sequence import Sequence
from kvscope.sampling_params import SamplingParams
from server_harness import TOKEN, Client

LONG = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


def seq() -> Sequence:
    return Sequence([1, 2, 3], SamplingParams())


def test_paced_request_sits_out_until_due():
    pacing, a, b = Pacing(), seq(), seq()
    pacing.pace(a, 0.5)
    assert pacing.gate([a, b], now=10.0) is None and not a.held      # never stepped: due at once
    pacing.stepped([a, b], [], now=10.0)
    assert pacing.gate([a, b], now=10.2) == pytest.approx(10.5) and a.held and not b.held
    assert pacing.gate([a, b], now=10.5) is None and not a.held
    pacing.stepped([a], [a], now=10.6)                                # finished: forgotten
    assert not pacing.paced


def test_a_request_paced_later_joins_the_beat_of_those_paced_before():
    pacing, a, b, c = Pacing(), seq(), seq(), seq()
    pacing.pace(a, 0.5)
    pacing.stepped([a], [], now=10.0)                                 # a is due at 10.5
    pacing.pace(b, 0.5)
    pacing.pace(c, 0.2)                                               # another interval: its own beat
    assert pacing.gate([a, b, c], now=10.1) == pytest.approx(10.5) and a.held and b.held and not c.held
    assert pacing.gate([a, b, c], now=10.5) is None and not a.held and not b.held


def test_slow_motion_waits_between_steps():
    pacing = Pacing()
    assert pacing.wait_before_step(5.0) == 0
    pacing.set_slow_motion(0.3)
    pacing.stepped([], [], now=5.0)
    assert pacing.wait_before_step(5.1) == pytest.approx(0.2)
    assert pacing.wait_before_step(5.4) == 0
    with pytest.raises(ValueError):
        pacing.set_slow_motion(11)


def step_times(client: Client, rid: str) -> list[float]:
    return [e["ts"] for e in client.events_of("request.token", rid)]


def test_slow_motion_spaces_every_step(server):
    teacher, learner = Client(server.ws, token=TOKEN), Client(server.ws, subscribe="step")
    try:
        assert learner.call("slow_motion", interval_s=0.2)["code"] == "forbidden"
        teacher.ok("slow_motion", interval_s=0.15)
        state = learner.until(lambda e: e["type"] == "engine" and e["reason"] == "slow_motion")
        assert state["slow_motion_s"] == 0.15
        rid = learner.ok("submit", prompt="The old lighthouse keeper", params=LONG)["request_id"]
        learner.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        times = step_times(learner, rid)
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert len(gaps) == 7 and min(gaps) >= 0.14
    finally:
        teacher.ok("slow_motion", interval_s=0)
        teacher.close()
        learner.close()


def test_a_paced_request_does_not_slow_the_others(server):
    learner = Client(server.ws)
    try:
        slow = learner.ok("submit", prompt="Once upon a time", params=LONG, pace_s=0.2)["request_id"]
        fast = learner.ok("submit", prompt="Mia wanted to bake", params=LONG)["request_id"]
        done = learner.until(lambda e: e["type"] == "request.finished" and e["request_id"] == fast, since=0)
        assert len(step_times(learner, slow)) < 8 and done["num_output_tokens"] == 8
        learner.until(lambda e: e["type"] == "request.finished" and e["request_id"] == slow, since=0)
        gaps = [b - a for a, b in zip(step_times(learner, slow), step_times(learner, slow)[1:])]
        assert min(gaps) >= 0.19
        rid = learner.ok("submit", prompt="Tom looked out", params={**LONG, "max_tokens": 40})["request_id"]
        learner.ok("pace", request_id=rid, interval_s=0.5)     # paced once it runs
        learner.drain(0.05)
        before = len(step_times(learner, rid))
        learner.drain(0.6)
        assert len(step_times(learner, rid)) - before <= 2
        learner.ok("pace", request_id=rid, interval_s=0)       # full speed again
        assert learner.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid,
                             since=0)["num_output_tokens"] == 40
    finally:
        learner.close()
