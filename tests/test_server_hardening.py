"""One regression test per defect of issue 11 (a hostile probe of the live server); each of
these failed on the code before the server policy module."""
from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from server_harness import TOKEN, Client, LiveServer

JSON = {"Content-Type": "application/json"}


def configure(config):
    config.limit_loopback = True            # the tests call from loopback, as a classroom's NAT would look
    config.rest_requests_per_minute = 600   # a burst of 150: room for every test but the rate-limit one


@pytest.fixture(scope="module")
def server():
    s = LiveServer(configure=configure)
    yield s
    s.stop()


def post(server, path: str, body, token: str | None = None, **kw) -> httpx.Response:
    headers = {**JSON, **({"Authorization": f"Bearer {token}"} if token else {}), **kw.pop("headers", {})}
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.http}{path}", content=content, headers=headers, timeout=60, **kw)


def assert_openai_400(response: httpx.Response, mentions: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert mentions in error["message"], error


def assert_healthy(server) -> None:
    health = httpx.get(f"{server.http}/healthz", timeout=10).json()
    assert health["status"] == "ok", health


# -- defect 1: an unbounded top_k crashed every running request --------------------------
def test_huge_top_k_is_refused_at_the_edge_and_others_keep_running(server):
    server.wait_idle()
    c = Client(server.ws, token=TOKEN)
    try:
        rid = c.ok("submit", prompt="The fox", params={"max_tokens": 40, "ignore_eos": True})["request_id"]
        for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 2, "top_k": 2**64}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_k": 2**40})):
            assert_openai_400(post(server, path, body), "top_k")
        done = c.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        assert done["reason"] == "length" and done["num_output_tokens"] == 40
    finally:
        c.close()
    assert_healthy(server)


# -- defect 5: a huge seed gave a plain-text 500, or a stream that never ended -----------
@pytest.mark.parametrize("stream", [False, True])
def test_huge_seed_is_a_400_streaming_or_not(server, stream):
    response = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 2, "seed": 2**64, "stream": stream})
    assert_openai_400(response, "seed")
    assert_healthy(server)


# -- defect 6: a lone surrogate in a prompt was a bare 500 / an "internal" error ---------
SURROGATE_BODIES = [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}'),
    ("/api/tokenize", '{"text": "\\ud800"}'),
    ("/api/generate", '{"prompt": "\\udfff", "params": {"max_tokens": 2}, "stream": false}'),
]


@pytest.mark.parametrize("path,body", SURROGATE_BODIES)
def test_a_lone_surrogate_is_a_clear_400(server, path, body):
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"] if path.startswith("/v1") else response.json()["message"]
    assert "surrogate" in message


def test_a_lone_surrogate_on_the_websocket_is_a_clear_error(server):
    c = Client(server.ws)
    try:
        for kind, field in (("tokenize", "text"), ("submit", "prompt")):
            c.send('{"type": "%s", "ref": "s", "%s": "\\ud800"}' % (kind, field))
            reply = c.until(lambda e: e.get("ref") == "s")
            assert reply["type"] == "error" and reply["code"] == "invalid_field" and "surrogate" in reply["message"]
    finally:
        c.close()


# -- defect 3: a 10 MB prompt was tokenized on the event loop before any length check -----
def test_a_huge_body_is_refused_unread_and_prompts_are_tokenized_off_the_loop(server):
    big = {"prompt": "ab " * 3_500_000, "max_tokens": 1}      # ~10 MB
    for path in ("/v1/completions", "/api/generate"):
        response = post(server, path, big, token=TOKEN)
        assert response.status_code == 413 and "--max-body-bytes" in response.text
    threads = []
    service = server.service
    original = service.prompt_ids

    def recording(*args):
        threads.append(threading.current_thread().name)
        return original(*args)
    service.prompt_ids = recording
    try:
        response = post(server, "/v1/completions", {"prompt": "the cat " * 9000, "max_tokens": 1})
        assert_openai_400(response, "characters")
        assert threads == []                                   # refused on characters: never tokenized
        response = post(server, "/v1/completions", {"prompt": "the cat", "max_tokens": 1})
        assert response.status_code == 200
    finally:
        del service.prompt_ids
    assert threads and all(name.startswith("kvscope-worker") for name in threads)


# -- /v1 took a JSON body sent as text/plain (a cross-site form can send that) ------------
def test_json_as_text_plain_is_refused(server):
    for path in ("/v1/completions", "/api/generate", "/api/tokenize"):
        response = post(server, path, {"prompt": "x", "text": "x"}, headers={"Content-Type": "text/plain"})
        assert response.status_code == 415, (path, response.text)


# -- defect 9: two buckets, a list of prompts counted once, no Retry-After ----------------
def test_one_rest_bucket_counts_every_prompt_and_says_when_to_retry(server):
    server.service.config.rest_requests_per_minute = 16        # a burst of 4
    server.service.policy.rest_buckets.clear()
    try:
        learner = {"X-Kvscope-Learner": "defect-9"}
        assert post(server, "/api/tokenize", {"text": "a"}, headers=learner).status_code == 200
        listed = post(server, "/v1/completions", {"prompt": ["a", "b", "c"], "max_tokens": 1}, headers=learner)
        assert listed.status_code == 200                       # 1 + 3 = the whole burst of 4
        refused = post(server, "/v1/completions", {"prompt": "a", "max_tokens": 1}, headers=learner)
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        message = refused.json()["error"]["message"]
        assert "--rest-requests-per-minute" in message and "retry in 0 s" not in message
        other = post(server, "/api/tokenize", {"text": "a"}, headers={"X-Kvscope-Learner": "someone-else"})
        assert other.status_code == 200                        # per learner, not per address
        assert post(server, "/api/tokenize", {"text": "a"}, token=TOKEN, headers=learner).status_code == 200
    finally:
        server.service.config.rest_requests_per_minute = 600
        server.service.policy.rest_buckets.clear()


# -- defect 7: frames that failed to parse skipped the rate limit; deep nesting was "internal"
def test_unparsable_frames_count_against_the_rate_limit_and_deep_nesting_is_refused(server):
    c = Client(server.ws)
    try:
        deep = '{"type": "ping", "x": ' + "[" * 30_000 + "]" * 30_000 + "}"
        c.send(deep)
        reply = c.until(lambda e: e["type"] == "error")
        assert reply["code"] == "invalid_json" and "nested too deeply" in reply["message"]
        for _ in range(400):
            c.send("{not json")
        errors = [e for e in c.drain(2.0) if e["type"] == "error"]
        codes = [e["code"] for e in errors]
        assert "internal" not in codes
        assert codes.count("invalid_json") <= 100 + 50 * 3      # the burst, and 50 a second after it
        assert codes.count("rate_limited") >= 400 - codes.count("invalid_json") - 5
        assert c.call("ping", timeout=10)["type"] in ("ack", "error")   # the socket still answers
    finally:
        c.close()


# -- defect 2: a viewer that never reads grew server memory without limit ------------------
def test_a_viewer_that_never_reads_is_closed_when_its_backlog_outgrows_its_bytes(server):
    from test_server_robustness import stalled_viewer
    config = server.service.config
    saved = config.max_pending_bytes
    config.max_pending_bytes = 256 * 1024
    before = set(server.service.hub.viewers)
    sock = stalled_viewer(server.port, "kv")
    try:
        text = json.dumps({"type": "tokenize", "text": "é€𝄞" * 2500}).encode()
        frame = b"\x81\xfe" + len(text).to_bytes(2, "big") if len(text) < 65536 else None
        mask = b"\x00\x00\x00\x00"
        masked = bytes([frame[0], frame[1] | 0x80]) + frame[2:] + mask + text   # client frames are masked
        for _ in range(60):
            sock.sendall(masked)
        deadline = time.monotonic() + 20
        new = lambda: set(server.service.hub.viewers) - before   # noqa: E731
        while time.monotonic() < deadline and not new():
            time.sleep(0.05)
        while time.monotonic() < deadline and new():
            time.sleep(0.1)
        assert not new(), "the non-reading viewer was never closed"
        assert max((v.pending_bytes for v in server.service.hub.viewers.values()), default=0) <= config.max_pending_bytes
        assert connection_ends(sock, within_s=20), "the server forgot the viewer but left its socket open"
    finally:
        config.max_pending_bytes = saved
        sock.close()
    assert_healthy(server)


def connection_ends(sock, within_s: float) -> bool:
    """Reads what the server had sent until the connection ends (EOF or reset)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(1 << 16):
            continue
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


# -- defect 10: DNS rebinding passed the Origin check; /ws/replay checked no Origin --------
def test_a_foreign_host_is_refused_over_http_and_websocket(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect
    evil = f"rebind.example:{server.port}"
    response = httpx.get(f"{server.http}/healthz", headers={"Host": evil})
    assert response.status_code == 421 and "--allow-host" in response.text
    with pytest.raises(InvalidStatus):
        connect(server.ws, additional_headers={"Host": evil}, origin=f"http://{evil}", open_timeout=10)
    assert httpx.get(f"{server.http}/healthz", headers={"Host": f"localhost:{server.port}"}).status_code == 200


def test_allowed_hosts_are_loopback_ip_literals_host_and_allow_host():
    from kvscope.server.security import allowed_hosts, host_allowed
    allowed = allowed_hosts("0.0.0.0", ("class.example.org",))
    for ok in ("localhost:8000", "127.0.0.1", "[::1]:8000", "192.168.1.20:8000", "CLASS.example.org:80"):
        assert host_allowed(ok, allowed), ok
    for bad in ("rebind.example:8000", "localhost.rebind.example", "", "[::1"):
        assert not host_allowed(bad, allowed), bad
    assert host_allowed("kvscope.lan:8000", allowed_hosts("kvscope.lan"))


def test_replay_socket_checks_origin_and_speed(server):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect
    with pytest.raises(InvalidStatus):   # refused at the handshake
        connect(f"ws://127.0.0.1:{server.port}/ws/replay/default", origin="http://evil.example", open_timeout=10)
    for speed in ("abc", "nan", "inf"):   # defect 12: crashed the handler, no close code
        with connect(f"ws://127.0.0.1:{server.port}/ws/replay/default?speed={speed}", open_timeout=10) as ws:
            reply = json.loads(ws.recv(timeout=10))
            assert reply["type"] == "error" and "speed" in reply["message"]
            with pytest.raises(Exception):
                ws.recv(timeout=10)
            assert ws.close_code == 1008


# -- defect 11: the instructor token was written to the access log ------------------------
def test_the_instructor_token_never_reaches_the_access_log(server):
    import logging
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep()
    loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
        lg.addHandler(handler)
    try:
        httpx.get(f"{server.http}/console?token={TOKEN}&x=1")
        Client(server.ws, token=TOKEN).close()
        time.sleep(0.3)
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)
    logged = "\n".join(records)
    assert "/console?token=[hidden]" in logged and "token=[hidden]" in logged.split("/console")[0] + logged
    assert TOKEN not in logged


# -- no CSP, no nosniff, no framing rule --------------------------------------------------
def test_pages_send_security_headers(server):
    for path in ("/", "/healthz", "/static/js/client.js"):
        headers = httpx.get(f"{server.http}{path}").headers
        csp = headers["content-security-policy"]
        assert "unsafe-eval" not in csp and "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert headers["x-content-type-options"] == "nosniff"


# -- defect 4: held requests filled the engine forever ------------------------------------
def test_learners_get_a_share_below_capacity_and_held_requests_time_out(server):
    server.wait_idle()
    limits = server.service.config.limits
    saved = (limits.max_learner_requests, limits.hold_timeout_s)
    limits.max_learner_requests, limits.hold_timeout_s = 2, 0.5
    learners = [Client(server.ws) for _ in range(3)]
    instructor = Client(server.ws, token=TOKEN)
    try:
        held = [c.ok("submit", prompt="Hold me", hold=True, params={"max_tokens": 8})["request_id"]
                for c in learners[:2]]
        refused = learners[2].call("submit", prompt="Me too", params={"max_tokens": 2})
        assert refused["code"] == "too_many_requests" and "--max-learner-requests" in refused["message"]
        rid = instructor.ok("submit", prompt="The instructor", params={"max_tokens": 4})["request_id"]
        instructor.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        for c, hid in zip(learners, held):   # nobody steps them: cancelled after the timeout
            done = c.until(lambda e: e["type"] == "request.finished" and e["request_id"] == hid, 15, since=0)
            assert done["reason"] == "abort"
        assert learners[2].call("submit", prompt="Now me", params={"max_tokens": 2})["type"] == "ack"
    finally:
        limits.max_learner_requests, limits.hold_timeout_s = saved
        for c in (*learners, instructor):
            c.close()


# -- defect 8: learners watched other learners' requests, of any size ----------------------
def test_learners_watch_only_their_own_short_requests(server):
    server.wait_idle()
    a, b = Client(server.ws), Client(server.ws)
    try:
        rid = a.ok("submit", prompt="A fox", hold=True, params={"max_tokens": 4})["request_id"]
        other = b.call("watch", request_id=rid)
        assert other["type"] == "error" and other["code"] == "forbidden"
        long = b.call("submit", prompt="the cat " * 200, watch={}, params={"max_tokens": 2})
        assert long["type"] == "error" and "--max-watched-prompt-tokens" in long["message"]
        assert a.call("watch", request_id=rid)["type"] == "ack"
        a.ok("cancel", request_id=rid)
    finally:
        a.close()
        b.close()


# -- defect 4 (the spin): an engine whose slots are all held stepped ~1 M times for nothing ----
def test_an_engine_with_nothing_admissible_sleeps():
    s = LiveServer("--max-num-seqs", "2")
    try:
        c = Client(s.ws, token=TOKEN)
        rids = [c.ok("submit", prompt=f"Story {i}", params={"max_tokens": 200, "ignore_eos": True})["request_id"]
                for i in range(2)]
        for rid in rids:   # both slots held: the next request waits with nothing to run
            c.ok("hold", request_id=rid)
        c.ok("submit", prompt="Waiting", params={"max_tokens": 2})
        time.sleep(0.5)
        scheduler = s.engine.scheduler
        assert len(scheduler.running) == 2 and len(scheduler.waiting) == 1 and s.engine.has_unfinished()
        before = scheduler.num_steps
        time.sleep(1.0)
        assert scheduler.num_steps - before < 100, f"{scheduler.num_steps - before} empty steps in 1 s"
        c.close()
    finally:
        s.stop()


# -- a classroom behind one address: the limits follow the learner, not the address --------
def test_a_learners_tabs_share_one_submit_allowance_and_others_have_their_own(server):
    server.wait_idle()
    limits = server.service.config.limits
    saved = limits.submits_per_minute
    limits.submits_per_minute = 8   # a burst of 2
    server.service.policy.submit_buckets.clear()
    tabs = [Client(server.ws + "?learner=tabs-of-one") for _ in range(2)]
    other = Client(server.ws + "?learner=someone-else")
    try:
        for tab in tabs:
            rid = tab.ok("submit", prompt="Hi", params={"max_tokens": 1})["request_id"]
            tab.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        refused = tabs[0].call("submit", prompt="Hi", params={"max_tokens": 1})
        assert refused["code"] == "rate_limited" and "--learner-submits-per-minute" in refused["message"]
        assert other.call("submit", prompt="Hi", params={"max_tokens": 1})["type"] == "ack"
    finally:
        limits.submits_per_minute = saved
        for c in (*tabs, other):
            c.close()


# -- defect 8 (the stall): a watch's attention JSON was built on the event loop. Since schema
# version 2 it is a binary frame (float16 arrays after a small header), encoded off the engine
# thread: the engine only starts the copy of the weights to the host --------------------------
def test_attention_frames_are_binary_and_encoded_off_the_engine_thread(server, monkeypatch):
    import kvscope.server.classroom.hub as hub_module
    threads: set[str] = set()
    real = hub_module.frame

    def recording(event):
        encoded = real(event)
        if event.get("type") == "attention":
            assert isinstance(encoded, bytes)
            threads.add(threading.current_thread().name)
        return encoded
    monkeypatch.setattr(hub_module, "frame", recording)
    server.wait_idle()
    c = Client(server.ws, token=TOKEN)
    try:
        rid = c.ok("submit", prompt="The little fox ran " * 20, watch={}, params={"max_tokens": 4})["request_id"]
        c.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        assert c.events_of("attention", rid)
    finally:
        c.close()
    assert threads and "kvscope-engine" not in threads, threads


def test_a_class_wide_rest_cap_holds_whatever_learner_ids_are_sent(server):
    config, policy = server.service.config, server.service.policy
    saved = config.rest_class_requests_per_minute
    config.rest_class_requests_per_minute, policy.class_bucket = 16, None   # a burst of 4
    try:
        codes = [post(server, "/api/tokenize", {"text": "a"}, headers={"X-Kvscope-Learner": f"id-{i}"}).status_code
                 for i in range(5)]
        assert codes == [200, 200, 200, 200, 429], codes
        refused = post(server, "/api/tokenize", {"text": "a"}, headers={"X-Kvscope-Learner": "fresh"})
        assert "--rest-class-requests-per-minute" in refused.json()["message"] and refused.headers["Retry-After"]
        assert post(server, "/api/tokenize", {"text": "a"}, token=TOKEN).status_code == 200   # not the instructor
    finally:
        config.rest_class_requests_per_minute, policy.class_bucket = saved, None
