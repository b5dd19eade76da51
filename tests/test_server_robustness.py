"""Bad input never kills a connection or the server and always gets a clear `error`; a
stalled viewer never stalls the engine."""
from __future__ import annotations

import base64
import json
import os
import socket
import time

import pytest
from websockets.exceptions import ConnectionClosed

from server_harness import TOKEN, Client, LiveServer


def configure(config):
    config.limits.submits_per_minute = 8          # a burst of 2
    config.limits.max_active_requests = 3
    config.max_pending_events = 200


@pytest.fixture(scope="module")
def server():
    s = LiveServer(configure=configure)
    yield s
    s.stop()


def malformed_messages() -> list[tuple[str | bytes, str]]:
    """(frame, expected error code)."""
    big = "x" * 70_000
    cases = [
        ("{", "invalid_json"), ("nope", "invalid_json"), ("", "invalid_json"), ("\x00\x01", "invalid_json"),
        (b"\xff\xfe\x00", "invalid_json"), ("[1, 2]", "not_an_object"), ("42", "not_an_object"),
        ("null", "not_an_object"), ('"submit"', "not_an_object"),
        ({}, "unknown_type"), ({"type": "explode"}, "unknown_type"), ({"type": 5}, "unknown_type"),
        ({"type": "x" * 500}, "unknown_type"), ({"type": None}, "unknown_type"),
        ({"type": "ping", "surprise": 1}, "invalid_field"),
        ({"type": "submit", "prompt": 5}, "invalid_field"),
        ({"type": "submit", "prompt": ""}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": "hot"}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"max_tokens": "10"}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"temperature": -1}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"temperature": 9}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"top_p": 0}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"top_p": 1.5}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"top_k": -5}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"min_p": 2}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"max_tokens": 0}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"max_tokens": 100000}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"logprobs": 50}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"seed": -1}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"stop": ["a"] * 10}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "params": {"nucleus": 0.9}}, "invalid_field"),
        ({"type": "submit", "prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, "invalid_field"),
        ({"type": "submit", "messages": [{"role": "wizard", "content": "x"}]}, "invalid_field"),
        ({"type": "submit", "prompt_token_ids": [10 ** 9]}, "invalid_field"),
        ({"type": "submit", "prompt_token_ids": [-1]}, "invalid_field"),
        ({"type": "submit", "prompt": "y" * 9000}, "prompt_too_long"),
        ({"type": "submit", "prompt": "the cat " * 700}, "prompt_too_long"),
        ({"type": "submit", "prompt": "hi", "watch": {"layers": [1000]}}, "invalid_field"),
        ({"type": "tokenize", "text": ["a"]}, "invalid_field"),
        ({"type": "tokenize", "text": "z" * 9000}, "prompt_too_long"),
        ({"type": "subscribe", "families": "step"}, "invalid_field"),
        ({"type": "subscribe", "families": ["everything"]}, "invalid_field"),
        ({"type": "subscribe", "families": ["step"], "filters": {"layer": "one"}}, "invalid_field"),
        ({"type": "watch", "request_id": 7}, "invalid_field"),
        ({"type": "cancel"}, "invalid_field"),
        ({"type": "cancel", "request_id": "r-none"}, "unknown_request"),
        ({"type": "next", "request_id": "r-none"}, "unknown_request"),
        ({"type": "sandbox", "op": "explode"}, "invalid_field"),
        ({"type": "sandbox", "op": "allocate", "seq": "A", "tokens": -1}, "invalid_field"),
        ({"type": "sandbox", "op": "allocate", "seq": "bad name!", "tokens": 2}, "invalid_field"),
        ({"type": "sandbox", "op": "append", "seq": "ghost", "tokens": 2}, "sandbox"),
        ({"type": "sandbox", "op": "allocate", "seq": "A"}, "invalid_field"),
        ({"type": "pause"}, "forbidden"), ({"type": "reset"}, "forbidden"),
        ({"type": "replay", "action": "play"}, "replay"),
        (json.dumps({"type": "tokenize", "text": big}), "frame_too_large"),
    ]
    out = []
    for i, (case, code) in enumerate(cases):   # dict cases carry a ref, to check it comes back
        out.append((json.dumps({**case, "ref": i}) if isinstance(case, dict) else case, code,
                    i if isinstance(case, dict) else None))
    return out


def test_malformed_messages_get_errors_and_keep_the_connection(server):
    bad = Client(server.ws)
    try:
        cases = malformed_messages()
        for frame, code, ref in cases:
            bad.send(frame)
            err = bad.until(lambda e: e["type"] == "error")
            assert err["code"] == code, f"{frame[:80]!r}: {err}"
            assert err["message"] and err["ref"] == ref
        # then a flood: hundreds of messages as fast as they can go, each answered
        flood = 300
        for i in range(flood):
            bad.send(cases[i % len(cases)][0])
        errors = [bad.until(lambda e: e["type"] == "error") for _ in range(flood)]
        codes = {e["code"] for e in errors}
        assert "rate_limited" in codes
        assert any(e["code"] == "rate_limited" and "50 messages a second" in e["message"] for e in errors)
        time.sleep(1.0)
        assert bad.ok("ping")["cmd"] == "ping"      # the same connection still works
        other = Client(server.ws)
        rid = other.ok("submit", prompt="Once upon a time", params={"max_tokens": 3, "ignore_eos": True})["request_id"]
        done = other.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        assert done["num_output_tokens"] == 3
        other.close()
    finally:
        bad.close()


def test_frame_beyond_the_protocol_limit_closes_only_that_socket(server):
    huge = Client(server.ws)
    with pytest.raises(ConnectionClosed):
        huge.send("x" * (2 << 20))   # the server may close while the frame is still going out
        huge.until(lambda e: False, timeout=10)
    fine = Client(server.ws)
    assert fine.ok("ping")["cmd"] == "ping"
    fine.close()


def test_learner_limits_are_stated_in_errors(server):
    server.wait_idle()
    c = Client(server.ws)
    try:
        long = c.call("submit", prompt="the cat " * 700)
        assert long["code"] == "prompt_too_long" and "at most 512" in long["message"]
        over = c.call("submit", prompt="hi", params={"max_tokens": 1000})
        assert over["code"] == "invalid_field" and "limit of 256" in over["message"]
        held = [c.call("submit", prompt="hold me", hold=True) for _ in range(3)]
        replies = [r["type"] for r in held]
        limited = [r for r in held if r["type"] == "error"]
        assert limited and limited[0]["code"] == "rate_limited" and "8 prompts a minute" in limited[0]["message"]
        assert replies.count("ack") == 2
        for r in held:
            if r["type"] == "ack":
                c.ok("cancel", request_id=r["request_id"])
        instructor = Client(server.ws, token=TOKEN)   # no limits for the instructor
        rid = instructor.ok("submit", prompt="the cat " * 350, params={"max_tokens": 2})["request_id"]
        instructor.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        instructor.close()
    finally:
        c.close()


def stalled_viewer(port: int, families: str) -> socket.socket:
    """A WebSocket handshake, then never another read, through a tiny receive buffer."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET /ws?subscribe={families} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    assert b"101" in s.recv(12)
    return s


def test_a_stalled_viewer_never_stalls_the_engine(server):
    server.wait_idle()
    before = set(server.service.hub.viewers)
    stalled = stalled_viewer(server.port, "step,kv,request,attention,sampling,memory")
    try:
        deadline = time.monotonic() + 10
        while len(server.service.hub.viewers) == len(before):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        viewer = next(v for vid, v in server.service.hub.viewers.items() if vid not in before)
        worker = Client(server.ws, token=TOKEN)
        # fully watched requests, one after another, until the stalled viewer's socket buffers
        # (whose size the machine decides) are full and it loses display events: a prompt's
        # weights alone, 300 positions square for every layer and head, are megabytes
        for attempt in range(4):   # a fresh first word each time: no prefix-cache hits
            start = time.monotonic()
            rid = worker.ok("submit", prompt=f"Round {attempt}. " + "The little fox ran " * 60, params={"max_tokens": 80, "ignore_eos": True},
                            watch={})["request_id"]
            done = worker.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, 90, since=0)
            assert time.monotonic() - start < 90
            assert done["num_output_tokens"] == 80
            assert len(worker.events_of("request.token", rid)) == 80     # the owner lost nothing
            if viewer.dropped:
                break
        assert viewer.dropped > 0                                   # the stalled one lost display events
        assert viewer.display_count <= server.service.config.max_pending_events
        assert viewer.id in server.service.hub.viewers              # and is still connected
        worker.close()
    finally:
        stalled.close()
