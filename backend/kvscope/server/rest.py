"""REST beside the WebSocket: tokenize, generate as Server-Sent Events (the same
`request.*` events a viewer sees), health, metrics, and the list of recordings."""
from __future__ import annotations

import asyncio
import secrets

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kvscope.instrumentation.observer import RequestLabel
from kvscope.instrumentation.schema import COMMANDS, obj
from kvscope.server.hub import dumps
from kvscope.server.ratelimit import per_minute
from kvscope.server.service import EngineService
from kvscope.server.validation import CommandError, describe, sampling_params

_submit = COMMANDS["submit"]["properties"]
GENERATE = Draft202012Validator(obj({}, {k: _submit[k] for k in ("prompt", "messages", "prompt_token_ids", "params")}
                                    | {"stream": {"type": "boolean"}}))
TOKENIZE = Draft202012Validator(obj({"text": {"type": "string"}}, {"chat": {"type": "boolean"}}))
STATUS = {"rate_limited": 429, "forbidden": 403, "too_many_requests": 429, "prompt_too_long": 400,
          "unknown_request": 404, "engine": 400, "invalid_field": 400, "invalid_json": 400}


class RestGuard:
    """Per-address rate limit and learner limits for REST callers without the token."""

    def __init__(self, service: EngineService):
        self.service = service
        self.buckets: dict[str, object] = {}

    def is_instructor(self, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        token = auth.removeprefix("Bearer ").strip()
        return bool(token) and secrets.compare_digest(token.encode(), self.service.config.instructor_token.encode())

    def admit(self, request: Request) -> bool:
        """Checks the rate limit; True when the caller is an instructor (no limits)."""
        if self.is_instructor(request):
            return True
        rate = self.service.config.rest_requests_per_minute
        host = request.client.host if request.client else "?"
        bucket = self.buckets.setdefault(host, per_minute(rate))
        if rate > 0 and not bucket.take():
            raise CommandError("rate_limited", f"at most {rate:g} requests a minute from one address "
                                               f"without the instructor token; retry in {bucket.retry_after():.0f} s")
        return False

    def check_prompt(self, ids: list[int], text: str | None, instructor: bool) -> None:
        limits = self.service.config.limits
        if instructor:
            return
        if text is not None and len(text) > limits.max_prompt_chars:
            raise CommandError("prompt_too_long", f"the prompt has {len(text)} characters; the limit is "
                                                  f"{limits.max_prompt_chars} without the instructor token")
        if len(ids) > limits.max_prompt_tokens:
            raise CommandError("prompt_too_long", f"the prompt has {len(ids)} tokens; the limit is "
                                                  f"{limits.max_prompt_tokens} without the instructor token")

    def max_tokens(self, instructor: bool) -> int:
        return self.service.engine.max_model_len if instructor else self.service.config.limits.max_tokens


def error_response(exc: CommandError) -> JSONResponse:
    body = {"type": "error", "ts": 0.0, "ref": None, "code": exc.code, "message": exc.message, "cmd": None}
    return JSONResponse(body, status_code=STATUS.get(exc.code, 400))


async def json_body(request: Request, validator: Draft202012Validator) -> dict:
    try:
        body = await request.json()
    except Exception:
        raise CommandError("invalid_json", "the request body must be JSON") from None
    error = best_match(validator.iter_errors(body))
    if error is not None:
        raise CommandError("invalid_field", describe(error))
    return body


async def until_disconnect(request: Request, awaitable):
    """Await `awaitable`, but give up (cancelling it) if the client goes away."""
    task = asyncio.ensure_future(awaitable)
    while not task.done():
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if not done and await request.is_disconnected():
            task.cancel()
            return None
    return task.result()


def rest_router(service: EngineService) -> APIRouter:
    router = APIRouter()
    guard = RestGuard(service)
    hub = service.hub

    @router.post("/api/tokenize")
    async def tokenize(request: Request):
        try:
            instructor = guard.admit(request)
            body = await json_body(request, TOKENIZE)
            guard.check_prompt([], body["text"], instructor)
            return JSONResponse(service.tokenize(body["text"], body.get("chat", False)))
        except CommandError as exc:
            return error_response(exc)

    @router.post("/api/generate")
    async def generate(request: Request):
        try:
            instructor = guard.admit(request)
            body = await json_body(request, GENERATE)
            forms = [k for k in ("prompt", "messages", "prompt_token_ids") if k in body]
            if len(forms) != 1:
                raise CommandError("invalid_field", "give exactly one of prompt, messages or prompt_token_ids")
            ids, text = service.prompt_ids(body.get("prompt"), body.get("messages"), body.get("prompt_token_ids"))
            guard.check_prompt(ids, text, instructor)
            params = sampling_params(body.get("params"), guard.max_tokens(instructor))
        except CommandError as exc:
            return error_response(exc)
        rid = service.new_request_id()
        queue = hub.follow(rid)
        done = await service.submit(rid, ids, params, "generate", RequestLabel(prompt=text))
        if done.error:
            hub.unfollow(rid, queue)
            return error_response(CommandError("engine", done.error, rid))
        if body.get("stream", True):
            return StreamingResponse(sse_events(service, rid, queue), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
        final = await until_disconnect(request, last_event(service, rid, queue))
        return JSONResponse(final) if final is not None else Response(status_code=499)

    @router.get("/healthz")
    async def healthz():
        engine = service.engine
        return {"status": "ok" if service.aengine and service.aengine.error is None else "degraded",
                "model": service.model_name, "step": engine.scheduler.num_steps,
                "paused": bool(service.aengine and service.aengine.paused),
                "running": len(engine.scheduler.running), "waiting": len(engine.scheduler.waiting),
                "viewers": len(hub.viewers), "free_blocks": engine.block_manager.num_free_blocks,
                "num_blocks": engine.block_manager.num_blocks}

    @router.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @router.get("/api/recordings")
    async def recordings():
        folder = service.config.recordings_dir
        names = sorted(p.stem for p in folder.glob("*.jsonl")) if folder.is_dir() else []
        return {"recordings": names}

    return router


async def request_events(service: EngineService, rid: str, queue: asyncio.Queue):
    """A followed request's events until it finishes; if the consumer leaves first, the
    request is cancelled and its blocks freed."""
    finished = False
    try:
        while not finished:
            event = await queue.get()
            finished = event["type"] == "request.finished"
            yield event
    finally:
        service.hub.unfollow(rid, queue)
        if not finished:
            with anyio.CancelScope(shield=True):
                await service.cancel(rid)


async def sse_events(service: EngineService, rid: str, queue: asyncio.Queue):
    async for event in request_events(service, rid, queue):
        yield f"event: {event['type']}\ndata: {dumps(event)}\n\n"


async def last_event(service: EngineService, rid: str, queue: asyncio.Queue) -> dict:
    async for event in request_events(service, rid, queue):
        if event["type"] == "request.finished":
            return event
    raise RuntimeError("the request's events ended without request.finished")
