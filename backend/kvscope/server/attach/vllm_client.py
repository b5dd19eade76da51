"""The HTTP calls kvscope makes to an attached vLLM server."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from kvscope.server.errors import CommandError


class VllmClient:
    def __init__(self, url: str, model: str):
        self.url, self.model = url, model
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30.0, read=None))

    async def _post(self, path: str, body: dict) -> dict:
        try:
            r = await self.http.post(path, json={"model": self.model, **body})
        except httpx.HTTPError as exc:
            raise CommandError("disconnected", f"the vLLM server at {self.url} did not answer: {type(exc).__name__}") from None
        if r.status_code != 200:
            raise CommandError("engine", f"vLLM answered {r.status_code} to {path}: {r.text[:200]}")
        return r.json()

    async def tokenize(self, text: str) -> list[int]:
        return list((await self._post("/tokenize", {"prompt": text, "add_special_tokens": False}))["tokens"])

    async def detokenize(self, token_ids: list[int]) -> str:
        return (await self._post("/detokenize", {"tokens": list(token_ids)}))["prompt"]

    async def stream(self, prompt_ids: list[int], params: dict, request_id: str,
                     headers: dict | None = None) -> AsyncIterator[dict]:
        """/v1/completions' chunks for a token-id prompt; the last carries `usage` (with cached tokens)."""
        body = {"model": self.model, "prompt": prompt_ids, "stream": True, "return_token_ids": True,
                "stream_options": {"include_usage": True}, **params}
        async with self.http.stream("POST", "/v1/completions", json=body,
                                    headers={"X-Request-Id": request_id, **(headers or {})}) as r:
            if r.status_code != 200:
                raise CommandError("engine", f"vLLM answered {r.status_code}: {(await r.aread()).decode()[:300]}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                yield json.loads(line[len("data: "):])


def completion_params(p) -> dict:
    """kvscope's SamplingParams as /v1/completions fields (vLLM's names)."""
    out = {"max_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k,
           "min_p": p.min_p, "ignore_eos": p.ignore_eos}
    if p.seed is not None:
        out["seed"] = p.seed
    if p.stop:
        out["stop"] = list(p.stop)
    if p.stop_token_ids:
        out["stop_token_ids"] = list(p.stop_token_ids)
    return out
