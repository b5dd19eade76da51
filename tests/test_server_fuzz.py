"""Bounded fuzzing of the live server: 10,000 generated WebSocket messages and 1,000 HTTP
requests made of edge values (huge, negative and non-finite numbers, wrong types, lone
surrogates, deep nesting, oversized bodies). Afterwards: no 5xx, no "internal" error, every
socket still answers, /healthz is ok and the engine still serves a request."""
from __future__ import annotations

import json
import random

import httpx
import pytest

from server_harness import TOKEN, Client, LiveServer

WS_MESSAGES = 10_000
HTTP_REQUESTS = 1_000
SOCKETS = 10
SEED = 11

NUMBERS = [0, -1, 1, 2, 3, 2**31, 2**63, 2**64, -(2**64), 1e308, -1e308, 1.5, 0.0001, 100, 101]
STRINGS = ["", "x", "\ud800", "a\udfffb", "é€𝄞" * 50, "the cat " * 40, "r1", "c1", "kv", "../../etc/passwd",
           "<script>", "x" * 5000]
COMMAND_TYPES = ["subscribe", "unsubscribe", "snapshot", "tokenize", "submit", "cancel", "watch", "unwatch",
                 "hold", "next", "release", "pace", "sandbox", "auth", "ping", "replay", "pause", "reset",
                 "inject", "set_knobs", "record_start", "nope", None, 5]
FIELDS = ["prompt", "messages", "prompt_token_ids", "params", "text", "chat", "families", "filters",
          "request_id", "watch", "hold", "pace_s", "interval_s", "op", "seq", "tokens", "token", "action",
          "speed", "n", "max_tokens", "layers", "heads", "ref"]
PARAM_KEYS = ["temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "stop", "ignore_eos", "n", "logprobs"]


def edge_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(NUMBERS)
    if roll < 0.6:
        return rng.choice(STRINGS)
    if roll < 0.7:
        return rng.choice([None, True, False])
    if roll < 0.8 and depth < 3:
        return [edge_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if roll < 0.9 and depth < 3:
        return {k: edge_value(rng, depth + 1) for k in rng.sample(PARAM_KEYS, rng.randint(0, 4))}
    return rng.choice([["kv", "request"], ["step"], [{"role": "user", "content": rng.choice(STRINGS)}], [1, 2, 3]])


def plausible_params(rng: random.Random) -> dict:
    params = {k: edge_value(rng) for k in rng.sample(PARAM_KEYS, rng.randint(0, 3))}
    params["max_tokens"] = rng.choice([1, 2, 0, -1, 2**64])   # kept small: valid requests stay quick
    return params


def ws_frame(rng: random.Random) -> str | bytes:
    roll = rng.random()
    if roll < 0.06:
        return rng.choice(["{", "nope", "", "[1,2]", "null", '{"type": "ping", "x": NaN}', '{"type": Infinity}'])
    if roll < 0.08:
        depth = rng.choice([100, 1000, 20_000])
        return '{"type": "ping", "x": ' + "[" * depth + "]" * depth + "}"
    if roll < 0.09:
        return rng.choice([b"\xff\xfe", b'{"type": "ping"}', "x" * 70_000])
    msg = {"type": rng.choice(COMMAND_TYPES)}
    for key in rng.sample(FIELDS, rng.randint(0, 4)):
        msg[key] = edge_value(rng)
    if msg["type"] == "submit" and rng.random() < 0.5:
        msg["prompt"], msg["params"] = rng.choice(["Hi", "\ud800", "the cat " * 300]), plausible_params(rng)
        msg.pop("messages", None), msg.pop("prompt_token_ids", None)
    return json.dumps(msg)


def http_request(rng: random.Random) -> tuple[str, bytes, dict]:
    path = rng.choice(["/v1/completions", "/v1/chat/completions", "/api/generate", "/api/tokenize"])
    headers = {"Content-Type": rng.choice(["application/json"] * 8 + ["text/plain", "application/x-www-form-urlencoded"])}
    roll = rng.random()
    if roll < 0.05:
        return path, b"{" * rng.choice([10, 5000]), headers
    if roll < 0.08:
        return path, b'{"prompt": "' + b"a" * 300_000 + b'"}', headers
    if roll < 0.1:
        return path, b"\xff\xfe\x00garbage", headers
    if rng.random() < 0.4:   # a valid request for the route, perhaps with one edge value in it
        body = {"/v1/completions": {"prompt": rng.choice(["Hi", ["a", "b"], [1, 2]]), "max_tokens": 2},
                "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                "/api/generate": {"prompt": "Hi", "params": {"max_tokens": 2}, "stream": False},
                "/api/tokenize": {"text": "Hi"}}[path]
        if rng.random() < 0.5:
            body[rng.choice(["n", "seed", "top_k", "temperature", "stop", "logprobs", "model", "chat"])] = edge_value(rng)
    else:
        keys = ["prompt", "messages", "text", "model", "n", "seed", "top_k", "temperature", "stream", "stop",
                "logprobs", "params", "prompt_token_ids", "chat", "top_p", "user"]
        body = {k: edge_value(rng) for k in rng.sample(keys, rng.randint(0, 5))}
    text = json.dumps(body)
    if rng.random() < 0.1:
        text = text.replace("1.5", "NaN", 1).replace("0.0001", "Infinity", 1)
    return path, text.encode("utf-8", "surrogatepass"), headers


def configure(config):
    config.limits.messages_per_second = 100_000   # every generated frame is handled, not just rate-limited


@pytest.fixture(scope="module")
def server():
    s = LiveServer(configure=configure)
    yield s
    s.stop()


def test_fuzzed_websocket_messages_get_clear_answers(server):
    rng = random.Random(SEED)
    clients = [Client(server.ws, subscribe="request" if i % 2 else None) for i in range(SOCKETS)]
    codes: dict[str, int] = {}
    try:
        for batch in range(WS_MESSAGES // (SOCKETS * 50)):
            for i, c in enumerate(clients):
                for _ in range(50):
                    c.send(ws_frame(rng))
                c.send({"type": "ping", "ref": f"end-{batch}-{i}"})
            for i, c in enumerate(clients):   # every socket answers its ping after its 50 frames
                start = len(c.seen)
                c.until(lambda e, r=f"end-{batch}-{i}": e.get("ref") == r, timeout=60)
                for e in c.seen[start:]:
                    if e["type"] == "error":
                        codes[e["code"]] = codes.get(e["code"], 0) + 1
                del c.seen[:]
    finally:
        for c in clients:
            c.close()
    assert "internal" not in codes, codes
    assert codes.get("invalid_field", 0) > 1000 and codes.get("invalid_json", 0) > 100, codes
    assert httpx.get(f"{server.http}/healthz", timeout=10).json()["status"] == "ok"


def test_fuzzed_http_requests_never_get_a_5xx(server):
    rng = random.Random(SEED + 1)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=server.http, timeout=60) as http:
        for _ in range(HTTP_REQUESTS):
            path, body, headers = http_request(rng)
            response = http.post(path, content=body, headers=headers)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, (path, body[:200], response.text[:300])
            assert "internal" not in response.text.lower()
    assert statuses.get(200, 0) > 20 and statuses.get(400, 0) > 300 and 415 in statuses and 413 in statuses, statuses
    health = httpx.get(f"{server.http}/healthz", timeout=10).json()
    assert health["status"] == "ok"
    server.wait_idle()
    c = Client(server.ws, token=TOKEN)   # and the engine still serves
    try:
        rid = c.ok("submit", prompt="After the storm", params={"max_tokens": 3})["request_id"]
        done = c.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        assert done["reason"] == "length"
    finally:
        c.close()
