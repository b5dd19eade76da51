"""Text in, text out on the embedded model: incremental detokenization, stop strings,
the chat template, and the async streaming interface."""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvscope import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM(device="cpu")


def test_stop_string_cuts_the_text_where_it_begins(llm):
    prompt = "Once upon a time"
    full = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    words = full.text.split()
    assert len(words) > 6, full.text
    stop = " " + words[4]                       # a word from the middle of the continuation
    cut = full.text.index(stop)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[:cut]
    assert out.token_ids == full.token_ids[:len(out.token_ids)]
    assert len(out.token_ids) < len(full.token_ids)


def test_streamed_deltas_add_up_to_the_text_even_with_emoji(llm):
    from kvscope.server.service.async_engine import AsyncEngine
    from kvscope.engine.llm_engine import LLMEngine
    engine = AsyncEngine(LLMEngine(device="cpu"))
    try:
        async def collect(prompt):
            pieces, final = [], None
            params = SamplingParams(temperature=0.8, seed=5, max_tokens=30, ignore_eos=True)
            async for d in engine.generate(prompt, params):
                if d.finished:
                    final = d.output.outputs[0]
                else:
                    pieces.append(d.text)
            return "".join(pieces), final

        async def both():
            return await asyncio.gather(collect("The cat 🐱 said"), collect("Tom and Mia"))

        # a thread of its own: Playwright's sync API may leave a loop running on this one
        with ThreadPoolExecutor(1) as pool:
            results = pool.submit(lambda: asyncio.run(both())).result()
        for text, final in results:
            assert final.finish_reason == "length" and len(final.token_ids) == 30
            assert text == final.text == llm.tokenizer.decode(final.token_ids, skip_special_tokens=True)
            assert "\ufffd" not in text or "\ufffd" in final.text
    finally:
        engine.shutdown()


def test_chat_uses_the_template(llm):
    messages = [{"role": "user", "content": "Who found the key?"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=20))[0]
    templated = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.prompt_token_ids == llm.tokenizer.encode(templated, add_special_tokens=False)
    assert out.outputs[0].finish_reason in ("stop", "length") and out.outputs[0].token_ids
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}])


def test_text_and_token_prompts_agree(llm):
    prompt = "Tom had a red ball."
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    a, b, c = llm.generate([prompt, ids, {"prompt_token_ids": ids}], SamplingParams(temperature=0, max_tokens=10))
    assert a.prompt == prompt and b.prompt is None and a.prompt_token_ids == b.prompt_token_ids == ids
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids
    assert a.outputs[0].text == b.outputs[0].text


def test_a_stream_with_a_stop_string_never_shows_it_and_adds_up_to_the_final_text(llm):
    from kvscope.detokenizer import output_text
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = llm.generate(["Once upon a time"], params)[0].outputs[0].text
    stop = full[len(full) // 2:len(full) // 2 + 4]   # it begins mid-token more often than not
    engine = llm.engine
    engine.detokenizer.stream = True
    try:
        seq = engine.add_request("Once upon a time", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                                    stop=[stop]))
        pieces = []
        while engine.has_unfinished():
            pieces += [d.text for d in engine.step()[0] if d.seq is seq]
    finally:
        engine.detokenizer.stream = False
    text, stopped_by = output_text(seq, llm.tokenizer)
    assert seq.finish_reason == "stop" and stopped_by == stop and stop not in "".join(pieces)
    assert "".join(pieces) == text == full[:full.index(stop)]
    assert not engine.detokenizer.live   # nothing is kept once a request ends
