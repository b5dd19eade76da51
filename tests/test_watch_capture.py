"""A watched request's attention read from the step's own queries (instrumentation/capture.py)
against transformers' eager attention on the same random weights: grouped-query attention
(4 query heads on 2 KV heads), prompts split into chunks over several steps, the decode rows
of ten watched sequences and every layer in one product per group of similar context length,
with the compiled decode graph and eagerly (its decode kernel writing the watched rows'
weights as it reads their keys) and on the gathered path. No side pass runs for rows the
step computed, decode steps keep the compiled graph, and nothing is kept once nobody watches."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attention_frames import per_layer
from hf_models import VOCAB, make_checkpoint
from kvscope.engine.llm_engine import LLMEngine
from kvscope.instrumentation import Instrumentation, WatchSpec, capture
from kvscope.instrumentation.encode import binary_frame, decode, json_text
from kvscope.sampling_params import SamplingParams
from server_harness import check_event

F16_ATOL = 1e-3
PROMPT_LENS = [37, 5, 22, 9, 3, 12, 8, 15, 6, 11]   # the first is computed in three chunks of at most 16 tokens
# ten watched decode rows a step: two groups of similar context length
SPECS = [WatchSpec(), WatchSpec(layers=frozenset({0, 2}), heads=frozenset({1, 3})), WatchSpec(), None,
         *[WatchSpec()] * 6]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3"), num_hidden_layers=3)


@pytest.fixture(scope="module")
def reference(checkpoint):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager", dtype=torch.float32).eval()

    def attentions(ids: list[int]):
        with torch.no_grad():
            return hf(torch.tensor([ids]), output_attentions=True).attentions
    return attentions


@pytest.mark.parametrize("compiled, gathered", [(True, False), (False, False), (False, True)])
def test_weights_from_the_steps_queries_equal_eager_attention(checkpoint, reference, compiled, gathered, monkeypatch):
    """gathered: the PyTorch path (GPUs, quantized caches) instead of the C kernel."""
    engine = LLMEngine(model=str(checkpoint), device="cpu", dtype="float32", block_size=4, num_kv_blocks=128,
                       max_num_batched_tokens=16, max_num_seqs=16, num_threads=1, cpu_compile=compiled)
    assert (engine.runner.compiled is not None) == compiled
    side_passes, compiled_runs = [], []
    real_side_pass = capture.side_pass
    monkeypatch.setattr(capture, "side_pass", lambda *a: side_passes.append(a) or real_side_pass(*a))
    in_place_calls = []
    real_weights = capture.cpu_weights
    monkeypatch.setattr(capture, "cpu_weights", lambda *a: in_place_calls.append(1) or real_weights(*a))
    if gathered:
        monkeypatch.setattr(capture, "in_place", lambda layer: False)
    if compiled:
        run = engine.runner.compiled.run
        # the kept queries reach the graph as the type it was warmed up with: a subclass would
        # fail dynamo's type guard and recompile the graph at the first watched step
        engine.runner.compiled.run = lambda inputs: compiled_runs.append(type(inputs.metadata.queries)) or run(inputs)
    g = torch.Generator().manual_seed(7)
    events = []
    instr = Instrumentation(engine, events.extend)
    seqs = []
    for n, spec in zip(PROMPT_LENS, SPECS):
        prompt = torch.randint(0, VOCAB - 2, (n,), generator=g).tolist()
        seqs.append(engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
        if spec is not None:
            instr.watch(seqs[-1].request_id, "test", spec, seqs[-1])
    while engine.has_unfinished():
        engine.step()
    instr.detach()
    assert engine.runner.keep_queries is None and side_passes == []
    assert bool(in_place_calls) != gathered

    steps = [e for e in events if e["type"] == "step"]
    decode_steps = [s for s in steps if all(r["kind"] == "decode" for r in s["seqs"])]
    if compiled:   # every decode step ran the compiled graph, watched or not
        assert len(compiled_runs) == len(decode_steps) > 0
        # every decode step here has a watched row, and the graph's decode kernel writes its
        # weights itself: no queries are kept (on the gathered path they would be)
        assert set(compiled_runs) == {type(None)}
    att = per_layer([decode(binary_frame(e)) for e in events if e["type"] == "attention"])
    for e in (e for e in events if e["type"] == "attention"):
        check_event(json.loads(json_text(e)))
    assert any(a["query_positions"][0] > 0 and len(a["query_positions"]) > 1 for a in att)   # a later chunk
    for seq, spec in zip(seqs, SPECS):
        if spec is None:
            assert not [a for a in att if a["request_id"] == seq.request_id]
            continue
        ref = reference(seq.token_ids[:-1])
        heads = sorted(spec.heads) if spec.heads is not None else list(range(4))
        layers = sorted(spec.layers) if spec.layers is not None else [0, 1, 2]
        mine = [a for a in att if a["request_id"] == seq.request_id]
        assert sorted({a["layer"] for a in mine}) == layers
        for layer in layers:
            rows = sorted(p for a in mine if a["layer"] == layer for p in a["query_positions"])
            assert rows == list(range(len(seq.token_ids) - 1))   # every row once: chunks, then decode rows
        for a in mine:
            assert a["heads"] == heads and a["kv_heads"] == [h // 2 for h in heads] and not a["recomputed"]
            want = ref[a["layer"]][0][:, a["query_positions"], :a["context_len"]]
            assert torch.allclose(torch.from_numpy(a["weights"]), want[heads], atol=F16_ATOL), (a["layer"], a["step"])
            assert torch.allclose(torch.from_numpy(a["mean"]), want.mean(0), atol=F16_ATOL)


def test_host_views_index_one_after_the_other_as_numpy_does():
    """A GPU's batched copy is cut per request lazily (HostView): layers by a list, one
    sequence, heads by a list, then the context, applied in turn as numpy applies them."""
    t = torch.arange(4 * 3 * 8 * 10, dtype=torch.float16).view(4, 3, 8, 10)
    want = t.numpy()[[0, 2], 1][:, [1, 5]][:, :, None, :7]
    got = np.asarray(capture.HostCopy(t)[[0, 2], 1][:, [1, 5]][:, :, None, :7])
    assert got.shape == (2, 2, 1, 7) and (got == want).all()
