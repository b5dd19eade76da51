"""One request whose step fails ends alone with an error; the requests that shared its step
go on and produce exactly what they would have produced without it."""
from __future__ import annotations

import pytest

from kvscope.engine.llm_engine import LLMEngine
from kvscope.sampling_params import SamplingParams

PROMPTS = ["Once upon a time", "The little fox ran", "A dog and a cat"]


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(device="cpu")


def run(engine: LLMEngine, poison: int | None) -> dict[str, tuple[str, list[int]]]:
    seqs = [engine.add_request(prompt, SamplingParams(temperature=0.8, seed=10 + i, max_tokens=8, ignore_eos=True))
            for i, prompt in enumerate(PROMPTS)]
    if poison is not None:
        # A value that got past every check (the edge refuses it): the sampler cannot build it.
        seqs[poison].params.top_k = 2 ** 64
    done = {}
    while engine.has_unfinished():
        _, finished = engine.step()
        for seq in finished:
            done[seq.request_id] = (seq.finish_reason, list(seq.output_token_ids))
    return {seq.request_id: done[seq.request_id] for seq in seqs}


def test_a_failing_request_ends_alone_and_the_others_are_unchanged(engine):
    clean = list(run(engine, None).values())
    poisoned = list(run(engine, 1).values())
    assert poisoned[1][0] == "error"
    assert [poisoned[0], poisoned[2]] == [clean[0], clean[2]]
    assert all(reason == "length" for reason, _ in (clean[0], clean[2]))
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_lone_failing_request_ends_with_its_error(engine):
    seq = engine.add_request("Hello", SamplingParams(temperature=0.8, max_tokens=2))
    seq.params.top_k = 2 ** 64
    _, finished = engine.step()
    assert [(s.request_id, s.finish_reason) for s in finished] == [(seq.request_id, "error")]
    assert "Overflow" in seq.error
    assert not engine.has_unfinished()
