"""Every client message is checked before anything acts on it; a failure is a CommandError reply."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kvscope.instrumentation.schema import COMMANDS
from kvscope.sampling_params import SamplingParams
from kvscope.server.classroom.policy import check_sampling_numbers
from kvscope.server.errors import CommandError

VALIDATORS = {name: Draft202012Validator(schema) for name, schema in COMMANDS.items()}
DEFAULT_MAX_TOKENS = 64


def no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def strict_json(text: str | bytes):
    """JSON as the standard defines it: NaN and Infinity (which Python would take) are refused."""
    return json.loads(text, parse_constant=no_constant)


def parse_frame(text: str | bytes, max_bytes: int) -> dict:
    size = len(text.encode("utf-8")) if isinstance(text, str) else len(text)
    if size > max_bytes:
        raise CommandError("frame_too_large", f"a message may be at most {max_bytes} bytes; this one is {size}")
    try:
        msg = strict_json(text)
    except (ValueError, RecursionError) as exc:   # ValueError covers bad JSON and bad UTF-8
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise CommandError("invalid_json", f"not valid JSON: {detail}") from None
    if not isinstance(msg, dict):
        raise CommandError("not_an_object", f"a message must be a JSON object, got {type(msg).__name__}")
    return msg


def printable(text: str) -> str:
    """Text safe to encode as UTF-8: a client's lone surrogate, echoed back, must not fail the reply."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def message_ref(msg: dict):
    ref = msg.get("ref")
    if isinstance(ref, str):
        return printable(ref) if len(ref) <= 128 else None
    return ref if isinstance(ref, int) and not isinstance(ref, bool) and abs(ref) < 2**53 else None   # JSON-safe


def error_event(code: str, message: str, msg: dict | None = None, request_id: str | None = None) -> dict:
    """The `error` reply (WebSocket, replay socket, REST body), echoing the message's ref and type."""
    kind = (msg or {}).get("type")
    event = {"type": "error", "ts": 0.0, "ref": message_ref(msg or {}), "code": code, "message": printable(message),
             "cmd": printable(kind) if isinstance(kind, str) and len(kind) <= 40 else None}
    return event if request_id is None else {**event, "request_id": request_id}


def validate_command(msg: dict) -> str:
    """The command's type, once its fields are known good."""
    kind = msg.get("type")
    if not isinstance(kind, str) or kind not in VALIDATORS:
        known = ", ".join(sorted(VALIDATORS))
        raise CommandError("unknown_type", f"unknown message type {str(kind)[:40]!r}; known types: {known}")
    check_schema(VALIDATORS[kind], msg)
    return kind


def check_schema(validator: Draft202012Validator, value) -> None:
    try:
        error = best_match(validator.iter_errors(value))
    except RecursionError:
        raise CommandError("invalid_json", "the message is nested too deeply") from None
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path)
        message = error.message if len(error.message) <= 200 else error.message[:200] + "…"
        raise CommandError("invalid_field", f"{path}: {message}" if path else message)


def sampling_params(raw: dict | None, max_tokens_limit: int | None) -> SamplingParams:
    """Client sampling params (already schema-checked) to SamplingParams, within limits."""
    raw = dict(raw or {})
    check_sampling_numbers(raw, "params.")
    max_tokens = raw.pop("max_tokens", min(DEFAULT_MAX_TOKENS, max_tokens_limit or DEFAULT_MAX_TOKENS))
    if max_tokens_limit is not None and max_tokens > max_tokens_limit:
        raise CommandError("invalid_field", f"params.max_tokens: {max_tokens} is over the limit of {max_tokens_limit}")
    if raw.get("seed", 0) is None:
        raw.pop("seed")
    try:
        return SamplingParams(max_tokens=max_tokens, **raw)
    except (TypeError, ValueError) as exc:
        raise CommandError("invalid_field", f"params: {exc}") from None


async def incoming_frames(ws) -> AsyncIterator[str | bytes]:
    """The payload of each frame a client sends, until it goes away."""
    from starlette.websockets import WebSocketDisconnect
    while True:
        try:
            message = await ws.receive()
        except (WebSocketDisconnect, RuntimeError):
            return
        if message["type"] == "websocket.disconnect":
            return
        text = message.get("text")
        yield text if text is not None else (message.get("bytes") or b"")
