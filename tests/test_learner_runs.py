"""What a learner's page can ask the server for, against a real server and the embedded model:
a measured throughput run that the server drives (one submit's allowance, never the submit
limit), a prompt cut into chunks for that request alone, held requests released together,
and slow motion that survives pause and resume."""
from __future__ import annotations

from server_harness import TOKEN, Client

LONG = " ".join(["The little fox ran along the river to find the shiny stone."] * 12)


def finished(client: Client, n: int, timeout: float = 60) -> list[dict]:
    client.until(lambda e: len(client.events_of("request.finished")) >= n, timeout=timeout, since=0)
    client.drain(0.3)   # a request's last `step` event comes just after its `request.finished`
    return client.events_of("request.finished")


def test_a_measured_run_keeps_its_requests_in_flight_and_costs_one_submit(server):
    learner = Client(server.ws)
    try:
        ack = learner.ok("measure", concurrency=3, total=9, max_tokens=6)
        assert (ack["concurrency"], ack["total"]) == (3, 9)
        done = finished(learner, 9)
        assert all(e["num_output_tokens"] == 6 for e in done)
        added = {e["request_id"]: e["ts"] for e in learner.events_of("request.added")}
        assert len(added) == 9
        # at most 3 in flight at once, and 3 at once at some time
        spans = [(added[e["request_id"]], e["ts"]) for e in done]
        in_flight = [sum(1 for a, b in spans if a <= t < b) for t, _ in spans]
        assert max(in_flight) == 3
        # nine requests, yet the learner's per-minute submit allowance (burst 5) is nearly whole
        for _ in range(4):
            learner.ok("submit", prompt="Tom looked out", params={"max_tokens": 1})
    finally:
        learner.close()


def test_a_measured_run_keeps_the_learner_limits(server):
    learner = Client(server.ws)
    try:
        assert learner.call("measure", concurrency=5, total=5, max_tokens=4)["code"] == "too_many_requests"
        assert learner.call("measure", concurrency=2, total=40, max_tokens=4)["code"] == "invalid_field"
        assert learner.call("measure", concurrency=3, total=2, max_tokens=4)["code"] == "invalid_field"
    finally:
        learner.close()


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
