"""REST, Server-Sent Events and the OpenAI-compatible API (through the official `openai`
client), against a real server and the embedded model; every entry point feeds the same
engine."""
from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from server_harness import TOKEN, Client, check_event


@pytest.fixture(scope="module")
def model(server):
    return server.service.model_name


def sse_events(response) -> list[dict]:
    events, kind = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            event = check_event(json.loads(line[6:]))
            assert event["type"] == kind
            events.append(event)
    return events


def test_tokenize_and_health(server):
    reply = httpx.post(f"{server.http}/api/tokenize", json={"text": "Hello there"}).json()
    check_event(reply)
    assert reply["ids"] and reply["tokens"][-1]["end"] == len("Hello there")
    bad = httpx.post(f"{server.http}/api/tokenize", json={"txt": "x"})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_field"
    health = httpx.get(f"{server.http}/healthz").json()
    assert health["status"] == "ok" and health["num_blocks"] == server.num_blocks


def test_generate_streams_server_sent_events(server):
    body = {"prompt": "Once upon a time", "params": {"temperature": 0, "max_tokens": 5, "ignore_eos": True}}
    with httpx.stream("POST", f"{server.http}/api/generate", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    kinds = [e["type"] for e in events]
    assert kinds == ["request.added"] + ["request.token"] * 5 + ["request.finished"]
    assert events[-1]["text"] == "".join(e["text"] for e in events[1:-1])
    assert events[0]["source"] == "generate"
    whole = httpx.post(f"{server.http}/api/generate", json={**body, "stream": False}, timeout=60).json()
    assert whole["type"] == "request.finished" and whole["text"] == events[-1]["text"]   # greedy: same text
    bad = httpx.post(f"{server.http}/api/generate", json={"prompt": "x", "params": {"top_p": 7}})
    assert bad.status_code == 400 and "top_p" in bad.json()["message"]


def assert_disconnect_frees_blocks(server, path: str, body: dict, first_line: str, headers=None) -> None:
    """Leave a stream after its first token: every block the request held comes back."""
    server.wait_idle()
    start = server.engine.block_manager.num_free_blocks
    with httpx.stream("POST", f"{server.http}{path}", json=body, timeout=60, headers=headers) as r:
        for line in r.iter_lines():
            if line.startswith(first_line):
                break
        assert server.engine.block_manager.num_free_blocks < start
    server.wait_idle(10)
    assert server.engine.block_manager.num_free_blocks == start


def test_generate_client_disconnect_frees_blocks(server):
    body = {"prompt": "The robot " * 20, "params": {"max_tokens": 250, "ignore_eos": True}}
    assert_disconnect_frees_blocks(server, "/api/generate", body, "event: request.token")


def test_openai_models_and_completions(oai, model):
    assert [m.id for m in oai.models.list().data] == [model]
    out = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0,
                                 extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 6 and out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 6
    chunks = list(oai.completions.create(model=model, prompt="Once upon a time", max_tokens=6, temperature=0,
                                         stream=True, stream_options={"include_usage": True},
                                         extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == out.choices[0].text                       # greedy: stream and whole agree
    assert chunks[-1].usage.completion_tokens == 6 and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    lp = oai.completions.create(model=model, prompt="Hi", max_tokens=2, logprobs=3, temperature=0)
    assert len(lp.choices[0].logprobs.token_logprobs) == 2 and len(lp.choices[0].logprobs.top_logprobs[0]) == 3


def test_openai_chat_completions(oai, model):
    messages = [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A story?"}]
    out = oai.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.usage.completion_tokens == 5
    stream = oai.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0, stream=True,
                                         stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == out.choices[0].message.content
    assert chunks[-1].usage.total_tokens == out.usage.total_tokens
    seeded = [oai.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1.0, seed=7)
              .choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]                            # same seed, same text
    lp = oai.chat.completions.create(model=model, messages=messages, max_tokens=2, logprobs=True, top_logprobs=2)
    assert len(lp.choices[0].logprobs.content) == 2 and len(lp.choices[0].logprobs.content[0].top_logprobs) == 2


def test_openai_errors_have_openai_shape(server, oai, model):
    with pytest.raises(openai.NotFoundError) as nf:
        oai.completions.create(model="gpt-17", prompt="hi", max_tokens=1)
    assert nf.value.code == "model_not_found" and nf.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], temperature=5)
    assert bad.value.body["type"] == "invalid_request_error" and "temperature" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as unsupported:
        oai.completions.create(model=model, prompt="hi", n=17)
    assert unsupported.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as too_long:
        oai.completions.create(model=model, prompt="the cat " * 600, max_tokens=1)
    assert "max_model_len" in too_long.value.body["message"]
    learner = openai.OpenAI(base_url=f"{server.http}/v1", api_key="not-the-token", max_retries=0)
    with pytest.raises(openai.BadRequestError) as limit:
        learner.completions.create(model=model, prompt="hi", max_tokens=5000)
    assert "limit of 256" in limit.value.body["message"] or "limit is 256" in limit.value.body["message"]
    raw = httpx.post(f"{server.http}/v1/completions", content=b"{not json",
                     headers={"Content-Type": "application/json"})
    assert raw.status_code == 400 and set(raw.json()["error"]) == {"message", "type", "param", "code"}


def test_openai_stream_disconnect_frees_blocks(server, model):
    body = {"model": model, "prompt": "Mia wanted to bake " * 10, "max_tokens": 300, "stream": True,
            "ignore_eos": True}
    assert_disconnect_frees_blocks(server, "/v1/completions", body, "data: ",
                                   headers={"Authorization": f"Bearer {TOKEN}"})


def test_every_entry_point_shares_one_batch(server, oai, model):
    """A page, curl-style SSE and an OpenAI client land in the same engine step."""
    server.wait_idle()
    instructor = Client(server.ws, token=TOKEN, subscribe="step,request")
    try:
        instructor.ok("pause")
        ws_rid = instructor.ok("submit", prompt="From the page", params={"max_tokens": 2, "ignore_eos": True})["request_id"]
        results = {}
        threads = [
            threading.Thread(target=lambda: results.setdefault("sse", httpx.post(
                f"{server.http}/api/generate", json={"prompt": "From curl", "stream": False,
                                                     "params": {"max_tokens": 2, "ignore_eos": True}}, timeout=60).json())),
            threading.Thread(target=lambda: results.setdefault("openai", oai.completions.create(
                model=model, prompt="From openai", max_tokens=2, extra_body={"ignore_eos": True}))),
        ]
        for t in threads:
            t.start()
        sources = lambda: {r["source"] for r in server.service.hub.requests.values()}   # noqa: E731
        deadline = time.monotonic() + 20
        while not {"ws", "generate", "openai"} <= sources():
            assert time.monotonic() < deadline, sources()
            time.sleep(0.05)
        mark = len(instructor.seen)
        instructor.ok("step")
        step = instructor.until(lambda e: e["type"] == "step", since=mark)
        assert len(step["seqs"]) == 3 and ws_rid in {s["request_id"] for s in step["seqs"]}
        instructor.ok("resume")
        for t in threads:
            t.join(60)
        assert results["sse"]["num_output_tokens"] == 2 and results["openai"].usage.completion_tokens == 2
    finally:
        instructor.ok("resume")
        instructor.close()


def test_metrics_report_requests_latency_kv_and_queues(server):
    text = httpx.get(f"{server.http}/metrics").text
    for name in ("kvscope_requests_total", "kvscope_time_to_first_token_seconds_count",
                 "kvscope_inter_token_latency_seconds_bucket", "kvscope_kv_blocks_used", "kvscope_kv_blocks_total",
                 "kvscope_kv_cache_usage_ratio", "kvscope_requests_waiting", "kvscope_requests_running",
                 "kvscope_generation_tokens_total", "kvscope_viewers", "kvscope_dropped_display_events_total"):
        assert name in text, name
    count = float(next(line.split()[-1] for line in text.splitlines()
                       if line.startswith("kvscope_time_to_first_token_seconds_count")))
    assert count >= 5
    assert f"kvscope_kv_blocks_total {float(server.num_blocks)}" in text


def test_a_stop_string_is_left_out_streamed_or_not(oai, model):
    """vLLM's default (include_stop_str_in_output=False): the stop string ends the text,
    and is not in it, whether the text comes whole or in deltas."""
    free = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True}).choices[0].text
    stop = free.strip().split()[3]                             # a word the greedy text reaches
    assert stop in free
    whole = oai.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0,
                                   stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    chunks = list(oai.completions.create(model=model, prompt="Once upon a time", max_tokens=24, temperature=0,
                                         stop=[stop], stream=True, extra_body={"ignore_eos": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert whole.finish_reason == "stop" and whole.text == free[:free.index(stop)]
    assert streamed == whole.text, (streamed, whole.text)
    messages = [{"role": "user", "content": "Tell me a story."}]
    free = oai.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0,
                                       extra_body={"ignore_eos": True}).choices[0].message.content
    stop = free.strip().split()[3]
    whole = oai.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stop=[stop], stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    assert whole == free[:free.index(stop)] and streamed == whole, (streamed, whole)
