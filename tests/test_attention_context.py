"""Attention metadata belongs to each model (layers/attention.py, AttentionContext): two
engines with different models, stepping at the same time from two threads, each read only
their own step's metadata, and each gives transformers' greedy tokens."""
from __future__ import annotations

import threading

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams
from kvscope.layers.attention import AttentionContext, step_metadata

MAX_NEW = 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("two")
    # other families and shapes: a step read with the other model's metadata fails or drifts
    return (make_checkpoint("qwen3", root / "a", seed=1),
            make_checkpoint("llama", root / "b", seed=2, num_attention_heads=8, num_key_value_heads=4,
                            num_hidden_layers=3))


def prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (3, 17, 40, 9, 26, 5)]


@pytest.mark.parametrize("attention_backend", ["cpu_paged", "torch"])
def test_two_engines_stepping_from_two_threads_each_match_transformers(checkpoints, attention_backend):
    work = [(ck, prompts(i)) for i, ck in enumerate(checkpoints)]
    expected = [hf_greedy(ck, ps, MAX_NEW) for ck, ps in work]
    engines = [LLM(str(ck), device="cpu", dtype="float32", block_size=4, max_num_seqs=3, enforce_eager=True,
                   attention_backend=attention_backend) for ck, _ in work]
    got, errors = [None, None], []
    start = threading.Barrier(2)

    def run(i: int) -> None:
        try:
            start.wait()
            params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
            # several rounds, three sequences at a time: many steps, prefills and decodes mixed
            got[i] = [o.outputs[0].token_ids for o in engines[i].generate(work[i][1], params, use_tqdm=False)]
        except Exception as exc:   # reported below, with the thread it came from
            errors.append((i, exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for llm in engines:
        llm.close()
    assert not errors, errors
    assert got == expected


def test_each_model_has_one_context_that_all_its_layers_read(checkpoints):
    with LLM(str(checkpoints[0]), device="cpu", dtype="float32", enforce_eager=True) as a, \
            LLM(str(checkpoints[1]), device="cpu", dtype="float32", enforce_eager=True) as b:
        ctx_a, ctx_b = a.engine.model.attention_context, b.engine.model.attention_context
        assert isinstance(ctx_a, AttentionContext) and ctx_a is not ctx_b
        assert {id(layer.attention_context) for layer in a.engine.runner.attn_layers} == {id(ctx_a)}
        marker = object()
        with step_metadata(a.engine.model, marker):
            assert ctx_a.metadata is marker and ctx_b.metadata is None
        assert ctx_a.metadata is None
