"""OpenAI `n` through the official client: completions and chat, whole and streamed; the
choices are separate samples, each equal to the single request seeded seed + index, the
prompt counted once in usage, and leaving a stream of n choices frees every block."""
from __future__ import annotations

from server_harness import TOKEN


ARGS = dict(prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=11, extra_body={"ignore_eos": True})


def test_completions_n_choices_equal_single_requests_seeded_seed_plus_index(server, oai):
    model = server.service.model_name
    out = oai.completions.create(model=model, n=3, **ARGS)
    assert [c.index for c in out.choices] == [0, 1, 2]
    single = [oai.completions.create(model=model, **{**ARGS, "seed": 11 + i}) for i in range(3)]
    assert [c.text for c in out.choices] == [s.choices[0].text for s in single]
    assert len({c.text for c in out.choices}) > 1
    assert out.usage.prompt_tokens == single[0].usage.prompt_tokens        # the prompt counts once
    assert out.usage.completion_tokens == 3 * 8


def test_streamed_chat_n_gives_each_choice_its_own_deltas(server, oai):
    model = server.service.model_name
    messages = [{"role": "user", "content": "A story?"}]
    whole = oai.chat.completions.create(model=model, messages=messages, n=2, max_tokens=6, seed=3,
                                        extra_body={"ignore_eos": True})
    chunks = list(oai.chat.completions.create(model=model, messages=messages, n=2, max_tokens=6, seed=3,
                                              stream=True, extra_body={"ignore_eos": True}))
    texts = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {0: "length", 1: "length"}


def test_leaving_an_n_stream_frees_every_block(server):
    from test_server_http import assert_disconnect_frees_blocks
    body = {"model": server.service.model_name, "prompt": "Mia wanted to bake " * 10, "max_tokens": 300,
            "stream": True, "n": 4, "ignore_eos": True}
    assert_disconnect_frees_blocks(server, "/v1/completions", body, "data: ",
                                   headers={"Authorization": f"Bearer {TOKEN}"})
