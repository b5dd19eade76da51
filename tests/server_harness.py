"""A real kvscope server on loopback for the server tests: uvicorn in a thread of the test
process, the embedded model, a free port from the OS. Plus a small synchronous WebSocket
client that validates every event it receives against the JSON Schema."""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable

from jsonschema import Draft202012Validator

from kvscope.instrumentation.encode import decode
from kvscope.instrumentation.schema import EVENTS, event_schema_key, full_schema

TOKEN = "test-instructor-token"


def model_path() -> str:
    """The model every server test runs (switch here, in one place)."""
    from kvscope.default_model import default_model_path
    return default_model_path()


# -- schema -------------------------------------------------------------------------------
_SCHEMA = full_schema()
_VALIDATORS = {key: Draft202012Validator({"$defs": _SCHEMA["$defs"], "$ref": f"#/$defs/event.{key}"})
               for key in EVENTS}


def check_event(event: dict) -> dict:
    key = event_schema_key(event)
    assert key in _VALIDATORS, f"event type {event.get('type')!r} is not in the schema"
    errors = sorted(_VALIDATORS[key].iter_errors(event), key=lambda e: list(e.absolute_path))
    assert not errors, f"{event.get('type')} breaks the schema: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in errors[:3])
    return event


def frame_events(frame: str | bytes) -> list[dict]:
    """The events of one frame, checked against the schema. A binary frame (an event with
    arrays) is checked as sent (its header) and as decoded (its arrays as lists)."""
    if isinstance(frame, bytes):
        n = struct.unpack_from("<I", frame)[0]
        check_event(json.loads(frame[4:4 + n]))
        event = decode(frame)
        return [check_event({k: v.tolist() if hasattr(v, "tolist") else v for k, v in event.items()})]
    parsed = json.loads(frame)
    return [check_event(e) for e in (parsed if isinstance(parsed, list) else [parsed])]


# -- the server ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, *extra_args: str, configure: Callable | None = None):
        import argparse

        import uvicorn

        from kvscope.server.cli_args import add_serve_arguments
        from kvscope.server.app import WS_MAX_FRAME
        from kvscope.server.main import build_app
        parser = argparse.ArgumentParser()
        add_serve_arguments(parser)
        self.port = free_port()
        args = parser.parse_args(["--model", model_path(), "--port", str(self.port), "--threads", "1",
                                  "--instructor-token", TOKEN, "--num-kv-blocks", "256",
                                  "--max-num-batched-tokens", "256", "--no-cpu-compile", *extra_args])
        self.app, self.service = build_app(args)
        if configure is not None:
            configure(self.service.config)
        self.server = uvicorn.Server(uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", ws_max_size=WS_MAX_FRAME,
            ws_per_message_deflate=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.05)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def engine(self):
        return self.service.engine

    @property
    def num_blocks(self) -> int:
        return self.engine.block_manager.num_blocks

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until no request is in flight and every block is free again."""
        deadline = time.monotonic() + timeout
        bm = lambda: self.engine.block_manager   # noqa: E731 (reset swaps the block manager)
        while self.engine.has_unfinished() or bm().num_free_blocks != bm().num_blocks:
            assert time.monotonic() < deadline, (f"engine still busy: {len(self.engine.scheduler.running)} running, "
                                                 f"{bm().num_free_blocks}/{bm().num_blocks} blocks free")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


# -- a WebSocket client -------------------------------------------------------------------
class Client:
    def __init__(self, url: str, token: str | None = None, subscribe: str | None = None,
                 origin: str | None = None):
        from websockets.sync.client import connect
        query = "&".join(f"{k}={v}" for k, v in (("token", token), ("subscribe", subscribe)) if v)
        # no client keepalive: on a loaded test machine a late pong must not drop the connection
        self.ws = connect(url + (f"?{query}" if query else ""), max_size=None, compression=None,
                          origin=origin, open_timeout=10, ping_interval=None).__enter__()
        self.seen: list[dict] = []
        self._backlog: list[dict] = []
        self._ref = 0

    def send(self, message: dict | str | bytes) -> None:
        self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    def next_event(self, timeout: float = 10.0) -> dict:
        while not self._backlog:
            frame = self.ws.recv(timeout=timeout)
            self._backlog.extend(frame_events(frame))
        event = self._backlog.pop(0)
        self.seen.append(event)
        return event

    def until(self, predicate: Callable[[dict], bool], timeout: float = 30.0, since: int | None = None) -> dict:
        """The next event matching; with `since`, also one already seen from that index."""
        if since is not None:
            for event in self.seen[since:]:
                if predicate(event):
                    return event
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; last events: {[e['type'] for e in self.seen[-8:]]}"
            event = self.next_event(timeout=left)
            if predicate(event):
                return event

    def drain(self, seconds: float) -> list[dict]:
        """Everything that arrives within `seconds`."""
        out, deadline = [], time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            try:
                out.append(self.next_event(timeout=left))
            except TimeoutError:
                return out

    def call(self, kind: str, timeout: float = 30.0, **fields) -> dict:
        """Send a command; its reply (ack, tokens, sandbox, viewers …, or error)."""
        self._ref += 1
        ref = f"t{self._ref}"
        self.send({"type": kind, "ref": ref, **fields})
        return self.until(lambda e: e.get("ref") == ref, timeout)

    def ok(self, kind: str, **fields) -> dict:
        reply = self.call(kind, **fields)
        assert reply["type"] != "error", f"{kind} failed: {reply}"
        return reply

    def events_of(self, kind: str, request_id: str | None = None) -> list[dict]:
        return [e for e in self.seen if e["type"] == kind and (request_id is None or e.get("request_id") == request_id)]

    def close(self) -> None:
        self.ws.close()
