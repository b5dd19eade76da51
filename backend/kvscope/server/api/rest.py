"""REST beside the WebSocket: tokenize, generate as SSE (a viewer's `request.*` events), recordings."""
from __future__ import annotations

import asyncio

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from jsonschema import Draft202012Validator

from kvscope.instrumentation.observer import RequestLabel
from kvscope.instrumentation.schema import COMMANDS, obj
from kvscope.server.classroom.hub import dumps
from kvscope.server.classroom.policy import one_prompt_form
from kvscope.server.service.engine_service import EngineService
from kvscope.server.api.validation import check_schema, error_event, sampling_params, strict_json
from kvscope.server.errors import CommandError

_submit = COMMANDS["submit"]["properties"]
GENERATE = Draft202012Validator(obj({}, {k: _submit[k] for k in ("prompt", "messages", "prompt_token_ids", "params")}
                                    | {"stream": {"type": "boolean"}}))
TOKENIZE = Draft202012Validator(obj({"text": {"type": "string"}}, {"chat": {"type": "boolean"}}))
STATUS = {"rate_limited": 429, "forbidden": 403, "too_many_requests": 429, "prompt_too_long": 400,
          "unknown_request": 404, "engine": 400, "invalid_field": 400, "invalid_json": 400,
          "unsupported_media_type": 415, "body_too_large": 413}


async def error_response(_request, exc: CommandError) -> JSONResponse:
    return JSONResponse(error_event(exc.code, exc.message), status_code=STATUS.get(exc.code, 400),
                        headers=getattr(exc, "headers", dict)())


async def admitted_call(service: EngineService, request: Request,
                        validator: Draft202012Validator | None = None) -> tuple[bool, str | None, dict]:
    """(instructor?, rate key, body) of a caller within its rate; the body declared JSON (no cross-site text/plain)."""
    learner = request.query_params.get("learner") or request.headers.get("x-kvscope-learner")
    host = request.client.host if request.client else None
    instructor, caller = service.policy.rest_caller(request.headers, host, learner)
    service.policy.admit_rest(caller)
    max_bytes = service.config.max_body_bytes
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise CommandError("unsupported_media_type",
                           f"send the body as Content-Type: application/json, not {ctype[:60] or 'no type'}")
    declared = request.headers.get("content-length", "")
    too_large = CommandError("body_too_large", f"a request body may be at most {max_bytes} bytes "
                                               f"(kvscope serve --max-body-bytes)")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise too_large
    try:
        body = strict_json(raw)
    except (ValueError, RecursionError):
        raise CommandError("invalid_json", "the request body must be JSON (UTF-8, not nested too deeply)") from None
    if validator is not None:
        check_schema(validator, body)
    return instructor, caller, body


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
    hub, policy = service.hub, service.policy

    # A CommandError raised here is answered by error_response (app.py registers it).
    @router.post("/api/tokenize")
    async def tokenize(request: Request):
        instructor, _, body = await admitted_call(service, request, TOKENIZE)
        policy.check_prompt_text(body["text"], instructor, "text")
        return JSONResponse(await service.off_loop(service.tokenize, body["text"], body.get("chat", False)))

    @router.post("/api/generate")
    async def generate(request: Request):
        instructor, _, body = await admitted_call(service, request, GENERATE)
        one_prompt_form(body)
        ids, text = await service.checked_prompt(body, instructor)
        params = sampling_params(body.get("params"), policy.max_tokens(instructor, service.engine.max_model_len))
        rid = service.new_request_id()
        queue = hub.follow(rid)
        done = await service.submit(rid, ids, params, "generate", RequestLabel(prompt=text))
        if done.error:
            hub.unfollow(rid, queue)
            raise CommandError("engine", done.error, rid)
        if body.get("stream", True):
            return StreamingResponse(sse_events(service, rid, queue), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": rid})
        final = await until_disconnect(request, last_event(service, rid, queue))
        return JSONResponse(final) if final is not None else Response(status_code=499)

    @router.get("/api/recordings")
    async def recordings():
        return {"recordings": sorted(p.stem for p in service.config.recordings_dir.glob("*.jsonl"))}

    return router


async def request_events(service: EngineService, rid: str, queue: asyncio.Queue):
    """A followed request's events until it finishes; a consumer that leaves first cancels it."""
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
        pass
    return event   # request_events ends with request.finished
