"""Structured outputs: every token drawn under the grammar's mask keeps the output in the
language, at temperature 1 across seeds, and the request ends when the grammar is done.
The model is the shipped one (its own tokenizer), so the masks are over a real vocabulary."""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from kvscope.structured_output import StructuredOutputManager, apply_masks  # noqa: E402
from kvscope.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
SEEDS = range(4)


@pytest.fixture(scope="module")
def llm():
    from kvscope import LLM
    with LLM(max_num_seqs=8) as engine:
        yield engine


def texts(llm, constraint: dict, max_tokens: int = 64) -> list[str]:
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                             structured_outputs=StructuredOutputsParams(**constraint)) for seed in SEEDS]
    outs = llm.generate(["Once upon a time"] * len(params), params)
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


def test_choice_lands_in_the_set_and_stops(llm):
    for text, reason in texts(llm, {"choice": ["yes", "no", "maybe later"]}):
        assert text in ("yes", "no", "maybe later") and reason == "stop"


def test_regex_is_matched_whole(llm):
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    for text, reason in texts(llm, {"regex": pattern}):
        assert re.fullmatch(pattern, text), text
        assert reason == "stop"


def test_json_parses_and_validates_against_its_schema(llm):
    for text, reason in texts(llm, {"json": SCHEMA}, max_tokens=200):
        assert reason == "stop", (text, reason)
        jsonschema.validate(json.loads(text), SCHEMA)
        assert list(json.loads(text)) == ["name", "age"]   # the schema's property order


CHAT = [{"role": "user", "content": "Name a colour and a count as JSON."}]
COLOUR = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 24}, "count": {"type": "integer"}},
          "required": ["colour", "count"], "additionalProperties": False}


def test_chat_json_ends_on_the_shipped_model_by_default(llm):
    """Before JSON grammars were compiled without free whitespace, the shipped model wrote
    `{\n"colour"` then newlines until max_tokens, three seeds out of three."""
    for seed in range(3):
        params = SamplingParams(seed=seed, max_tokens=64, structured_outputs=StructuredOutputsParams(json=COLOUR))
        out = llm.chat(CHAT, params)[0].outputs[0]
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), COLOUR)
        assert out.text == json.dumps(json.loads(out.text), separators=(",", ":"))   # compact, as vLLM's


def test_json_object_ends_as_a_compact_object(llm):
    for text, reason in texts(llm, {"json_object": True}, max_tokens=64):
        if reason == "stop":
            assert isinstance(json.loads(text), dict)
        assert not any(c in text for c in "\n\t"), text   # outside strings or in them: no raw control characters


@pytest.mark.parametrize("engine_wide, per_request, free", [(True, False, False), (False, False, True),
                                                            (False, True, False)])
def test_free_whitespace_is_the_engines_switch_or_the_requests(engine_wide, per_request, free):
    """vLLM's names: StructuredOutputsConfig.disable_any_whitespace (engine-wide, kvscope's
    default True) and StructuredOutputsParams.disable_any_whitespace (one request)."""
    import torch
    from transformers import AutoTokenizer
    from kvscope.config import EngineConfig
    from kvscope.default_model import default_model_path
    config = EngineConfig(structured_outputs_config={"disable_any_whitespace": engine_wide})
    assert config.structured_outputs_config.disable_any_whitespace is engine_wide
    tok = AutoTokenizer.from_pretrained(default_model_path())
    manager = StructuredOutputManager(tok, 2048, [tok.eos_token_id], engine_wide)
    matcher = manager.matcher_for(StructuredOutputsParams(json=COLOUR, disable_any_whitespace=per_request))
    matcher.accept(tok.encode("{", add_special_tokens=False)[0])
    logits = torch.zeros(1, 2048)
    apply_masks(logits, [matcher])
    newline = tok.encode("\n", add_special_tokens=False)[0]
    assert bool(torch.isfinite(logits[0, newline])) is free


def test_the_mask_really_narrows_the_choice(llm):
    """Unconstrained, the same seeds do not all give a choice from the set: the mask did the work."""
    free = llm.generate(["Once upon a time"] * len(SEEDS),
                        [SamplingParams(temperature=1.0, seed=s, max_tokens=4) for s in SEEDS])
    assert not all(o.outputs[0].text in ("yes", "no", "maybe later") for o in free)


@pytest.mark.parametrize("constraint, message", [
    ({"json": '{"type": "object", "properties": '}, "invalid json"),
    ({"regex": "([a-z"}, "invalid regex"),
    ({"grammar": "root ::= "}, "invalid grammar"),
])
def test_bad_constraints_are_a_clear_error_not_a_crashed_step(llm, constraint, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["hi"], SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(**constraint)))
    # the engine still serves the next request
    assert llm.generate(["hi"], SamplingParams(max_tokens=2, temperature=0))[0].outputs[0].token_ids


def test_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])


def test_the_mask_kept_for_the_explainer_is_the_one_applied():
    from transformers import AutoTokenizer
    from kvscope.default_model import default_model_path
    tok = AutoTokenizer.from_pretrained(default_model_path())
    manager = StructuredOutputManager(tok, 2048, [tok.eos_token_id])
    matcher = manager.matcher_for(StructuredOutputsParams(choice=["yes", "no"]))
    import torch
    logits = torch.zeros(1, 2048)
    apply_masks(logits, [matcher])
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    from kvscope.instrumentation.watch import grammar_allowed
    assert grammar_allowed(matcher, 2048).nonzero().flatten().tolist() == allowed and 2 <= len(allowed) < 50
    assert all(tok.decode([t]) and ("yes".startswith(tok.decode([t])) or "no".startswith(tok.decode([t])))
               for t in allowed)


# -- over the OpenAI API ------------------------------------------------------------------

def test_openai_response_format_json_schema_and_structured_outputs(server):
    import httpx
    from server_harness import TOKEN
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for seed in range(3):   # before JSON grammars were compact: 0 of 3 ended, newlines to max_tokens
        body = {"model": server.service.model_name, "messages": CHAT, "temperature": 1.0, "seed": seed,
                "max_tokens": 64, "structured_outputs": None,
                "response_format": {"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR}}}
        answer = httpx.post(f"{server.http}/v1/chat/completions", json=body, headers=headers, timeout=120).json()
        text = answer["choices"][0]["message"]["content"]
        assert answer["choices"][0]["finish_reason"] == "stop", text
        jsonschema.validate(json.loads(text), COLOUR)
    body = {"model": server.service.model_name, "prompt": "Once upon a time", "temperature": 1.0, "seed": 1,
            "max_tokens": 8, "structured_outputs": {"choice": ["red", "green"]}}
    answer = httpx.post(f"{server.http}/v1/completions", json=body, headers=headers, timeout=120).json()
    assert answer["choices"][0]["text"] in ("red", "green")


@pytest.mark.parametrize("field, value", [
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}),
    ("response_format", {"type": "xml"}),
    ("structured_outputs", {"regex": "([a-z"}),
    ("structured_outputs", {"regex": "a", "choice": ["a"]}),
    ("structured_outputs", {"colour": "blue"}),
])
def test_openai_bad_constraints_are_a_400(server, field, value):
    import httpx
    from server_harness import TOKEN
    body = {"model": server.service.model_name, "prompt": "hi", "max_tokens": 4, field: value}
    reply = httpx.post(f"{server.http}/v1/completions", json=body,
                       headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["message"]
    # the server still serves
    ok = httpx.post(f"{server.http}/v1/completions", json={**body, field: None},
                    headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    assert ok.status_code == 200
