"""`cache_salt` through the server's entry points, against the real engine: on the OpenAI
API (where `usage.prompt_tokens_details.cached_tokens` reports the prefix-cache hit, as
vLLM's does) and on the WebSocket `submit` command (validated, then given to the engine)."""
from __future__ import annotations

import uuid

import openai
import pytest

from server_harness import Client


@pytest.fixture
def learner(server):
    c = Client(server.ws)
    yield c
    c.close()


def long_prompt(server) -> str:
    """A prompt of several full blocks, new to the cache (a fresh tag leads it)."""
    text = f"[{uuid.uuid4().hex}] " + "The little fox ran along the river to find the shiny stone. " * 6
    assert len(server.service.engine.tokenizer.encode(text)) > 3 * server.service.engine.block_manager.block_size
    return text


def cached_of(oai, model: str, prompt: str, **extra) -> int:
    out = oai.completions.create(model=model, prompt=prompt, max_tokens=1, temperature=0,
                                 extra_body={"ignore_eos": True, **extra})
    return out.usage.prompt_tokens_details.cached_tokens


def test_openai_usage_reports_cached_tokens_and_salts_isolate(server, oai):
    model = server.service.model_name
    block_size = server.service.engine.block_manager.block_size
    prompt = long_prompt(server)
    assert cached_of(oai, model, prompt, cache_salt="tenant-a") == 0          # new to the cache
    again = cached_of(oai, model, prompt, cache_salt="tenant-a")
    assert again > 0 and again % block_size == 0                               # same salt: whole blocks shared
    assert cached_of(oai, model, prompt, cache_salt="tenant-b") == 0          # another salt: nothing shared
    assert cached_of(oai, model, prompt) == 0                                  # no salt is a salt of its own
    assert cached_of(oai, model, prompt) == again                              # ... which it shares with itself

    def streamed_chat_cached() -> int:   # the streamed usage chunk reports it too
        chunks = oai.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], max_tokens=1,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True, "cache_salt": "tenant-c"})
        return [c.usage for c in chunks if c.usage][-1].prompt_tokens_details.cached_tokens
    assert streamed_chat_cached() == 0
    assert streamed_chat_cached() > 0
    with pytest.raises(openai.BadRequestError) as bad:
        cached_of(oai, model, "hi", cache_salt="")
    assert bad.value.body["param"] == "cache_salt"
    with pytest.raises(openai.BadRequestError):
        cached_of(oai, model, "hi", cache_salt="x" * 257)


def test_ws_submit_passes_cache_salt_to_the_engine(server, learner):
    ids = server.service.engine.tokenizer.encode(long_prompt(server))
    params = {"temperature": 0, "max_tokens": 1, "ignore_eos": True}

    def cached(salt: str) -> int:
        rid = learner.ok("submit", prompt_token_ids=ids, params=params, cache_salt=salt)["request_id"]
        done = learner.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid, since=0)
        return done["num_cached_tokens"]
    assert cached("a") == 0
    assert cached("b") == 0
    assert cached("a") > 0
    for bad in ("", "x" * 257, 7):
        reply = learner.call("submit", prompt_token_ids=ids, params=params, cache_salt=bad)
        assert reply["type"] == "error" and "cache_salt" in reply["message"]
