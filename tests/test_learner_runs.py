"""What a learner's page can ask the server for, against a real server and the embedded model:
a throughput sweep that the server drives (one submit's allowance, one request in flight), a prompt cut into chunks for that request alone, held requests released together,
and slow motion that survives pause and resume."""
from __future__ import annotations

from server_harness import TOKEN, Client

LONG = " ".join(["The little fox ran along the river to find the shiny stone."] * 12)


def finished(client: Client, n: int, timeout: float = 60) -> list[dict]:
    client.until(lambda e: len(client.events_of("request.finished")) >= n, timeout=timeout, since=0)
    client.drain(0.3)   # a request's last `step` event comes just after its `request.finished`
    return client.events_of("request.finished")


def in_flight_at_most(spans: list[tuple[float, float]]) -> int:
    return max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)


def test_a_sweep_runs_its_levels_in_turn_and_counts_once(server):
    learner = Client(server.ws)
    try:
        ack = learner.ok("sweep", levels=[1, 3], max_tokens=6)
        assert (ack["levels"], ack["requests"]) == ([1, 3], [4, 6])
        # while it runs, the sweep is one of the learner's 4 in flight and one submit: three more may go
        extra = [learner.ok("submit", prompt="Tom looked out", params={"max_tokens": 1})["request_id"]
                 for _ in range(3)]
        assert learner.call("sweep", levels=[1], max_tokens=4)["code"] == "too_many_requests"   # one at a time
        done = [e for e in finished(learner, 13) if e["request_id"] not in extra]
        assert len(done) == 10 and all(e["num_output_tokens"] == 6 for e in done)
        added = {e["request_id"]: e["ts"] for e in learner.events_of("request.added")}
        spans = sorted((added[e["request_id"]], e["ts"]) for e in done)
        first, second = spans[:4], spans[4:]
        assert in_flight_at_most(first) == 1 and in_flight_at_most(second) == 3
        assert min(a for a, _ in second) >= max(b for _, b in first) + 0.4   # the pause between levels
        # 10 sweep requests and 3 submits, yet the per-minute allowance (burst 5) is not spent
        learner.ok("submit", prompt="Tom looked out", params={"max_tokens": 1})
    finally:
        learner.close()


def test_a_sweep_keeps_the_learner_limits(server):
    learner, other = Client(server.ws), Client(server.ws)
    try:
        cap = learner.until(lambda e: e["type"] == "session", since=0)["limits"]["max_sweep_in_flight"]
        assert cap == min(32, server.service.learner_share)
        refused = learner.call("sweep", levels=[1, cap + 1], max_tokens=4)
        assert refused["code"] == "too_many_requests" and "--learner-max-sweep-in-flight" in refused["message"]
        assert learner.call("sweep", levels=[2, 2], max_tokens=4)["code"] == "invalid_field"
        assert learner.call("sweep", levels=[1], max_tokens=10_000)["code"] == "invalid_field"
        # a sweep holds its top level in the learners' share, and only one learner sweeps at a time
        learner.ok("sweep", levels=[1, 2], max_tokens=24)
        assert other.call("sweep", levels=[1], max_tokens=4)["code"] == "too_many_requests"
        assert server.service.learner_requests() == 2   # the top level, reserved from the start
        finished(learner, 8)
    finally:
        learner.close()
        other.close()


def test_a_requests_own_chunk_cap_cuts_only_its_prompt(server):
    learner = Client(server.ws, subscribe="step")
    try:
        # (different first words: neither may find the other's blocks in the prefix cache)
        other = learner.ok("submit", prompt="Theirs. " + LONG, params={"max_tokens": 1})["request_id"]
        mine = learner.ok("submit", prompt="Mine. " + LONG, params={"max_tokens": 1}, prefill_chunk_tokens=32)
        finished(learner, 2)
        rows = [(s["request_id"], s["num_tokens"]) for e in learner.events_of("step") for s in e["seqs"]
                if s["kind"] == "prefill"]
        mine_rows = [n for rid, n in rows if rid == mine["request_id"]]
        assert max(mine_rows) == 32 and sum(mine_rows) == mine["num_prompt_tokens"]
        assert len(mine_rows) == -(-mine["num_prompt_tokens"] // 32)
        other_rows = [n for rid, n in rows if rid == other]
        assert max(other_rows) > 32   # the other request is not cut
    finally:
        learner.close()


def test_held_requests_paced_in_one_command_start_in_the_same_step(server):
    learner = Client(server.ws, subscribe="step")
    try:
        rids = [learner.ok("submit", prompt=p, hold=True, params={"max_tokens": n, "ignore_eos": True})["request_id"]
                for p, n in (("Once upon a time", 3), ("Mia wanted to bake", 6), ("Tom looked out", 4))]
        ack = learner.ok("pace", request_ids=rids, interval_s=0.1)
        assert ack["request_ids"] == rids
        finished(learner, 3)
        first = {}
        for e in learner.events_of("step"):
            for s in e["seqs"]:
                first.setdefault(s["request_id"], e["step"])
        assert len({first[r] for r in rids}) == 1
        assert learner.call("pace", interval_s=0.1)["code"] == "invalid_field"
    finally:
        learner.close()


def test_slow_motion_survives_pause_and_resume(server):
    teacher, learner = Client(server.ws, token=TOKEN), Client(server.ws)
    try:
        teacher.ok("slow_motion", interval_s=0.2)
        teacher.ok("pause")
        teacher.ok("resume")
        state = learner.until(lambda e: e["type"] == "engine" and e["reason"] == "resume")
        assert state["slow_motion_s"] == 0.2 and not state["paused"]
        rid = learner.ok("submit", prompt="The old lighthouse keeper", params={"max_tokens": 5, "ignore_eos": True})["request_id"]
        learner.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0, timeout=30)
        times = [e["ts"] for e in learner.events_of("request.token", rid)]
        assert min(b - a for a, b in zip(times, times[1:])) >= 0.18
    finally:
        teacher.ok("slow_motion", interval_s=0)
        teacher.close()
        learner.close()
