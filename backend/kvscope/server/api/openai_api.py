"""The OpenAI-compatible /v1 routes, streaming or not, with OpenAI's usage and error shapes."""
from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kvscope.server.service.async_engine import StreamDelta
from kvscope.instrumentation.schema import CACHE_SALT
from kvscope.instrumentation.observer import RequestLabel
from kvscope.llm import CompletionOutput, RequestOutput
from kvscope.sampling_params import SamplingParams, StructuredOutputsParams
from kvscope.server.classroom.policy import MAX_N, check_sampling_numbers, message_texts
from kvscope.server.api.rest import STATUS, admitted_call, until_disconnect
from kvscope.server.service.engine_service import EngineService
from kvscope.server.api.validation import printable
from kvscope.server.errors import CommandError

NUM = {"type": ["number", "null"]}
STOP = {"oneOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {"type": "string"}, "maxItems": 4}]}
COMMON = {
    "model": {"type": "string"}, "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "n": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_N}, "stream": {"type": ["boolean", "null"]},
    "stop": STOP, "seed": {"type": ["integer", "null"]}, "user": {"type": "string"},
    "presence_penalty": NUM, "frequency_penalty": NUM, "logit_bias": {"type": ["object", "null"]},
    "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}}},
    "top_k": {"type": "integer", "minimum": -1}, "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "ignore_eos": {"type": "boolean"}, "cache_salt": CACHE_SALT,
    "response_format": {"type": ["object", "null"]}, "structured_outputs": {"type": ["object", "null"]},
}
TOKENS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
COMPLETION = Draft202012Validator({"type": "object", "required": ["prompt"], "additionalProperties": False,
    "properties": {**COMMON, "prompt": {"oneOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 16},
        TOKENS, {"type": "array", "items": TOKENS, "minItems": 1, "maxItems": 16}]},
        "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20}, "echo": {"type": "boolean"},
        "best_of": {"type": ["integer", "null"]}, "suffix": {"type": ["string", "null"]}}})
CONTENT = {"oneOf": [{"type": "string"}, {"type": "array", "items": {
    "type": "object", "required": ["type", "text"], "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]}
CHAT = Draft202012Validator({"type": "object", "required": ["messages"], "additionalProperties": False,
    "properties": {**COMMON, "messages": {"type": "array", "minItems": 1, "maxItems": 64, "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"enum": ["system", "developer", "user", "assistant"]}, "content": CONTENT,
                       "name": {"type": "string"}}}},
        "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
        "logprobs": {"type": ["boolean", "null"]}, "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20}}})
FINISH = {"stop": "stop", "length": "length", "abort": "stop"}


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": printable(self.message), "type": self.kind,
                                       "param": self.param and printable(self.param), "code": self.code}},
                            status_code=self.status, headers=self.headers)


def from_command_error(exc: CommandError, param: str | None = None) -> OpenAIError:
    status = STATUS.get(exc.code, 400)
    status = 400 if status == 404 else status
    kind = "rate_limit_error" if status == 429 else "invalid_request_error"
    code = "context_length_exceeded" if exc.code == "prompt_too_long" else exc.code
    return OpenAIError(status, exc.message, param, code, kind, getattr(exc, "headers", dict)())


class Completion:
    """One OpenAI call: its prompts (token ids), params, and how it reports."""

    def __init__(self, service: EngineService, body: dict, chat: bool, prompts: list[tuple[list[int], str | None]]):
        self.service, self.body, self.chat, self.prompts = service, body, chat, prompts
        self.id = ("chatcmpl-" if chat else "cmpl-") + service.new_request_id()
        self.created = int(time.time())
        self.model = service.model_name
        self.object = "chat.completion" if chat else "text_completion"
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0

    def chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        body = {"id": self.id, "object": self.object + (".chunk" if self.chat else ""), "created": self.created,
                "model": self.model, "choices": choices, **({"usage": usage} if usage is not None else {})}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def choice_delta(self, index: int, text: str, finish: str | None, logprobs=None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def count(self, index: int, n: int, out: RequestOutput) -> None:
        """Add a finished choice to the usage; a prompt counts once, however many choices it has."""
        if index % n == 0:
            self.prompt_tokens += len(out.prompt_token_ids)
            self.cached_tokens += out.num_cached_tokens
        self.completion_tokens += len(out.outputs[0].token_ids)

    def usage(self) -> dict:
        """As vLLM's with --enable-prompt-tokens-details: the prompt tokens the prefix cache served."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def check_model(service: EngineService, body: dict) -> None:
    model = body.get("model")
    if model not in (None, service.model_name, "kvscope", "default"):
        raise OpenAIError(404, f"The model {model[:100]!r} does not exist; this server runs '{service.model_name}'",
                          "model", "model_not_found")


def check_unsupported(body: dict) -> None:
    for key, ok in (("best_of", lambda v: v in (None, 1)),
                    ("echo", lambda v: not v), ("suffix", lambda v: v is None), ("logit_bias", lambda v: not v),
                    ("presence_penalty", lambda v: not v), ("frequency_penalty", lambda v: not v)):
        if key in body and not ok(body[key]):
            raise OpenAIError(400, f"'{key}' = {body[key]!r} is not supported by kvscope", key, "unsupported_parameter")


def sampling_for(body: dict, chat: bool, max_cap: int) -> SamplingParams:
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or (min(256, max_cap) if chat else 16)
    if max_tokens > max_cap:
        raise OpenAIError(400, f"max_tokens is {max_tokens}; the limit is {max_cap}", "max_tokens")
    logprobs = (body.get("top_logprobs") or 0) if chat and body.get("logprobs") else (None if chat else body.get("logprobs"))
    temperature = body.get("temperature")
    try:
        return SamplingParams(temperature=1.0 if temperature is None else temperature,
                              top_p=body.get("top_p") or 1.0, top_k=body.get("top_k", 0), min_p=body.get("min_p", 0.0),
                              seed=body.get("seed"), max_tokens=max_tokens, stop=body.get("stop") or [],
                              ignore_eos=body.get("ignore_eos", False), logprobs=logprobs, n=body.get("n") or 1,
                              structured_outputs=structured_for(body))
    except (ValueError, TypeError) as exc:
        raise OpenAIError(400, str(exc)) from None


def structured_for(body: dict) -> StructuredOutputsParams | None:
    """vLLM's `structured_outputs`, or OpenAI's `response_format` (json_object, json_schema; text: none)."""
    fields, fmt = body.get("structured_outputs"), body.get("response_format")
    if fields and fmt and fmt.get("type") != "text":
        raise OpenAIError(400, "give either response_format or structured_outputs, not both", "response_format")
    if fields:
        return StructuredOutputsParams(**fields)
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return StructuredOutputsParams(json_object=True)
    schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
    if not isinstance(schema, dict):
        raise OpenAIError(400, "response_format must be {'type': 'text' | 'json_object'} or "
                          "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}", "response_format")
    return StructuredOutputsParams(json=schema)


def logprobs_for(service: EngineService, chat: bool, token_id: int, lp: dict | None, offset: int):
    if lp is None:
        return None
    tok = service.engine.tokenizer

    def text(i):
        return tok.decode([i]) if tok is not None else str(i)
    if chat:
        return {"content": [{"token": text(token_id), "logprob": lp["logprob"], "bytes": list(text(token_id).encode()),
                             "top_logprobs": [{"token": text(i), "logprob": v, "bytes": list(text(i).encode())}
                                              for i, v in lp["top"]]}]}
    return {"tokens": [text(token_id)], "token_logprobs": [lp["logprob"]],
            "top_logprobs": [{text(i): v for i, v in lp["top"]}], "text_offset": [offset]}


def openai_router(service: EngineService) -> APIRouter:
    router = APIRouter()
    policy = service.policy

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_name, "object": "model",
                                            "created": int(service.started_at), "owned_by": "kvscope",
                                            "max_model_len": service.engine.max_model_len}]}

    async def checked_call(request: Request, chat: bool):
        """(body, params, prompts), or an OpenAIError or CommandError: every check before the engine."""
        instructor, caller, body = await admitted_call(service, request)
        error = best_match((CHAT if chat else COMPLETION).iter_errors(body))
        if error is not None:
            param = ".".join(str(p) for p in error.absolute_path) or None
            raise OpenAIError(400, f"{param + ': ' if param else ''}{error.message[:300]}", param)
        check_model(service, body)
        check_unsupported(body)
        try:
            check_sampling_numbers(body)
        except CommandError as exc:
            raise from_command_error(exc, exc.message.split(":", 1)[0]) from None
        params = sampling_for(body, chat, policy.max_tokens(instructor, service.engine.max_model_len))
        if params.structured_outputs is not None:   # a bad schema or regex is the caller's 400, not a failed step
            try:
                await service.compile_grammar(params.structured_outputs)
            except ValueError as exc:
                raise OpenAIError(400, str(exc), "response_format" if body.get("response_format") else
                                  "structured_outputs") from None
        prompts = await prompt_list(service, body, chat, instructor)
        if len(prompts) > 1:   # a list of prompts costs one allowance per prompt
            policy.admit_rest(caller, cost=len(prompts) - 1)
        return body, params, prompts

    async def handle(request: Request, chat: bool):
        try:   # an OpenAIError raised here is answered by its response() (app.py registers it)
            body, params, prompts = await checked_call(request, chat)
        except CommandError as exc:
            raise from_command_error(exc) from None
        call = Completion(service, body, chat, prompts)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(stream_chunks(call, params, include_usage), media_type="text/event-stream")
        result = await until_disconnect(request, complete(call, params))
        return JSONResponse(result) if result is not None else JSONResponse({}, status_code=499)

    @router.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, chat=False)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, chat=True)

    return router


async def prompt_list(service: EngineService, body: dict, chat: bool,
                      instructor: bool) -> list[tuple[list[int], str | None]]:
    """Each prompt's (token ids, text), checked by the policy and tokenized off the event loop."""
    try:
        if chat:
            messages = [{"role": "system" if m["role"] == "developer" else m["role"],
                         "content": "".join(message_texts([m]))} for m in body["messages"]]
            return [await service.checked_prompt({"messages": messages}, instructor)]
        p = body["prompt"]
        if isinstance(p, str) or all(isinstance(x, int) for x in p):
            p = [p]
        return [await service.checked_prompt({"prompt": x} if isinstance(x, str) else {"prompt_token_ids": x},
                                             instructor) for x in p]
    except CommandError as exc:
        raise from_command_error(exc, "messages" if chat else "prompt") from None


async def run_one(call: Completion, index: int, ids: list[int], text: str | None, params: SamplingParams, sink):
    """Stream one prompt's n choices to sink as (choice index, delta); their outputs, in choice order."""
    rid = call.service.new_request_id()
    source_label = RequestLabel(prompt=text)
    outputs = [None] * params.n
    try:
        async for delta in call.service.stream(rid, ids, params, "openai", source_label,
                                               cache_salt=call.body.get("cache_salt")):
            await sink(index * params.n + delta.index, delta)
            if delta.finished:
                outputs[delta.index] = delta.output
    except Exception as exc:   # the request failed before or while running: its choices end in an error
        for k in (k for k, out in enumerate(outputs) if out is None):
            outputs[k] = RequestOutput(rid, text, list(ids), [CompletionOutput(k, "", [], None, None, "error")],
                                       finished=True, error=f"the request failed: {exc}")
            await sink(index * params.n + k, StreamDelta(rid, None, "", finished=True, output=outputs[k], index=k))
    return outputs


async def complete(call: Completion, params: SamplingParams):
    texts: dict[int, list] = {}

    async def keep(index, delta):
        if delta.logprob is not None:
            texts.setdefault(index, []).append((delta.token_id, delta.logprob))
    per_prompt = await asyncio.gather(*(run_one(call, i, ids, text, params, keep)
                                        for i, (ids, text) in enumerate(call.prompts)))
    outputs = [out for outs in per_prompt for out in outs]
    choices = []
    for i, out in enumerate(outputs):
        choice = out.outputs[0]   # a stream's final output holds its one choice
        if choice.finish_reason == "error":
            if "prompt" in (out.error or ""):
                raise OpenAIError(400, out.error, code="context_length_exceeded")
            raise OpenAIError(500, out.error or "the engine failed", code="engine_error", kind="server_error")
        call.count(i, params.n, out)
        parts = [logprobs_for(call.service, call.chat, t, lp, 0) for t, lp in texts.get(i, [])]
        logprobs = {k: [x for p in parts for x in p[k]] for k in parts[0]} if parts else None
        content = {"message": {"role": "assistant", "content": choice.text}} if call.chat else {"text": choice.text}
        choices.append({"index": i, **content, "logprobs": logprobs,
                        "finish_reason": FINISH.get(choice.finish_reason, "stop")})
    return {"id": call.id, "object": call.object, "created": call.created, "model": call.model,
            "choices": choices, "usage": call.usage()}


async def stream_chunks(call: Completion, params: SamplingParams, include_usage: bool):
    queue: asyncio.Queue = asyncio.Queue()

    async def push(index, delta):
        await queue.put((index, delta))
    tasks = [asyncio.ensure_future(run_one(call, i, ids, text, params, push))
             for i, (ids, text) in enumerate(call.prompts)]
    open_choices = len(tasks) * params.n
    started, offsets = set(), {}
    try:
        while open_choices:
            index, delta = await queue.get()
            if delta.finished:
                open_choices -= 1
                out = delta.output
                choice = out.outputs[0]
                if choice.finish_reason == "error":
                    err = {"message": out.error or "the engine failed", "type": "invalid_request_error",
                           "param": None, "code": "engine_error"}
                    yield f"data: {json.dumps({'error': err})}\n\n"
                    continue
                call.count(index, params.n, out)
                yield call.chunk([call.choice_delta(index, "", FINISH.get(choice.finish_reason, "stop"),
                                                    first=index not in started)])
                continue
            if not delta.text and delta.logprob is None and index in started:
                continue
            lp = logprobs_for(call.service, call.chat, delta.token_id, delta.logprob, offsets.get(index, 0))
            offsets[index] = offsets.get(index, 0) + len(delta.text)
            yield call.chunk([call.choice_delta(index, delta.text, None, lp, first=index not in started)])
            started.add(index)
        if include_usage:
            yield call.chunk([], call.usage())
        yield "data: [DONE]\n\n"
    finally:
        for t in tasks:   # the client left: cancelling the streams aborts their requests
            t.cancel()
