"""Pacing: the instructor's slow motion (a minimum interval between engine steps), a
learner's per-request pace (its own request steps slowly, the others at full speed) and a
held request's allowance (it draws the tokens its owner grants, then waits), against the
engine and a real server on the embedded model."""
from __future__ import annotations

import pytest

from kvscope.engine.llm_engine import LLMEngine
from kvscope.server.service.pacing import Pacing
from kvscope.sampling_params import SamplingParams
from server_harness import TOKEN, Client

LONG = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine():
    engine = LLMEngine(device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture
def pacing(engine):
    yield Pacing(engine)
    engine.reset()


def seq(engine):
    return engine.add_request([1, 2, 3], SamplingParams(**LONG))


def test_paced_request_sits_out_until_due(engine, pacing):
    a, b = seq(engine), seq(engine)
    pacing.pace(a, 0.5)
    assert pacing.gate(now=10.0) is None and not a.paused           # never stepped: due at once
    pacing.stepped([a, b], [], [], now=10.0)
    assert pacing.gate(now=10.2) == pytest.approx(10.5) and a.paused and not b.paused
    assert pacing.gate(now=10.5) is None and not a.paused
    pacing.stepped([a], [], [a], now=10.6)                            # finished: forgotten
    assert not pacing.paced


def test_a_request_paced_later_joins_the_beat_of_those_paced_before(engine, pacing):
    a, b, c = seq(engine), seq(engine), seq(engine)
    pacing.pace(a, 0.5)
    pacing.stepped([a], [], [], now=10.0)                             # a is due at 10.5
    pacing.pace(b, 0.5)
    pacing.pace(c, 0.2)                                               # another interval: its own beat
    assert pacing.gate(now=10.1) == pytest.approx(10.5) and a.paused and b.paused and not c.paused
    assert pacing.gate(now=10.5) is None and not a.paused and not b.paused


def test_a_held_request_draws_exactly_what_it_is_granted(engine, pacing):
    held, other = seq(engine), seq(engine)
    pacing.hold(held)
    for _ in range(3):                               # the other one runs; the held one waits
        deltas, finished = engine.step()
        pacing.stepped([], deltas, finished, now=0.0)
    assert held.num_output_tokens == 0 and held.num_computed_tokens == 0 and other.num_output_tokens == 3
    for granted in (1, 2, 3):                        # one `next` each: one token each, never more
        pacing.grant(held)
        while engine.has_unfinished() and not held.paused:
            deltas, finished = engine.step()
            pacing.stepped([], deltas, finished, now=0.0)
        assert held.num_output_tokens == granted and held.paused
    pacing.release(held)
    while engine.has_unfinished():
        engine.step()
    assert held.num_output_tokens == other.num_output_tokens == 8


def test_slow_motion_waits_between_steps(engine):
    pacing = Pacing(engine)
    assert pacing.wait_before_step(5.0) == 0
    pacing.set_slow_motion(0.3)
    pacing.stepped([], [], [], now=5.0)
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
