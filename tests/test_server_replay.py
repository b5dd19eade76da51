"""Replaying a recording through the live protocol (`/ws/replay/<name>`): the same events
in the same order, with play, pause, step and speed."""
from __future__ import annotations


from kvscope.instrumentation.recording import AFTER_STEP, read_recording
from server_harness import Client

from test_events_schema import ROOT


def replay_url(server, name: str, query: str = "") -> str:
    return f"ws://127.0.0.1:{server.port}/ws/replay/{name}{query}"


def test_replay_plays_a_committed_recording_in_order(server):
    _, events = read_recording(ROOT / "frontend" / "recordings" / "default.jsonl")
    c = Client(replay_url(server, "default", "?speed=50"))
    try:
        got = [c.next_event(timeout=20) for _ in events]
        assert [e["type"] for e in got] == [e["type"] for e in events]
        assert got[0]["type"] == "hello"
    finally:
        c.close()


def test_replay_pause_step_and_play(server):
    _, events = read_recording(ROOT / "frontend" / "recordings" / "batching.jsonl")
    c = Client(replay_url(server, "batching", "?paused=1"))
    try:
        assert c.drain(0.3) == []                              # paused: nothing flows
        ack = c.ok("replay", action="step")
        stepped = [e for e in c.seen if e["type"] != "ack"]
        last_step = max(i for i, e in enumerate(stepped) if e["type"] == "step")   # one step group:
        assert {e["type"] for e in stepped[last_step + 1:]} <= AFTER_STEP            # the step and what came with it
        assert [e["type"] for e in stepped].count("step") == 1 and ack["position"] == len(stepped)
        assert [e["type"] for e in stepped] == [e["type"] for e in events[:len(stepped)]]
        c.ok("replay", action="play", speed=100)
        c.until(lambda e: e is not None and e.get("ts") == events[-1]["ts"] and e["type"] == events[-1]["type"], 30)
        assert c.call("submit", prompt="hi")["code"] == "replay"
        assert c.call("replay", action="rewind")["code"] == "invalid_field"
    finally:
        c.close()


def test_unknown_recording_is_an_error(server):
    c = Client(replay_url(server, "no-such-recording"))
    err = c.next_event()
    assert err["type"] == "error" and err["code"] == "replay"
    c.close()


def test_record_live_then_replay_the_same_stream(server, tmp_path):
    server.service.config.recordings_dir = tmp_path
    from server_harness import TOKEN
    live = Client(server.ws, token=TOKEN)
    try:
        live.ok("record_start", name="roundtrip")
        rid = live.ok("submit", prompt="Once upon a time", params={"max_tokens": 3, "ignore_eos": True})["request_id"]
        live.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        live.ok("record_stop")
    finally:
        live.close()
    _, recorded = read_recording(tmp_path / "roundtrip.jsonl")
    c = Client(replay_url(server, "roundtrip", "?speed=100"))
    try:
        replayed = [c.next_event(timeout=20) for _ in recorded]
        assert replayed == recorded
    finally:
        c.close()
