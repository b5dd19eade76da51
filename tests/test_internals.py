"""The internals of a watched request, caught by forward hooks, against transformers on the
same weights (random-weight Qwen3, Qwen2 and Llama checkpoints, and the embedded model), float32
on CPU: layer inputs/outputs equal `output_hidden_states`, the MLP's gate/up equal hooks on
the HF model's projections, the logit lens equals the HF LM head on each hidden state, and
its last layer equals the engine's own next-token distribution. Tolerance: 1e-4 absolute
(5e-4 on hidden states, whose entries reach ~10)."""
from __future__ import annotations

import pytest
import torch

from hf_models import make_checkpoint
from kvscope.engine.llm_engine import LLMEngine
from kvscope.instrumentation import Instrumentation, WatchSpec
from kvscope.instrumentation.internals import EmbeddingFacts
from kvscope.sampling_params import SamplingParams
from server_harness import check_event, model_path


class KeepingInstrumentation(Instrumentation):
    """Keeps each capture's tensors, to compare them whole (the events carry summaries)."""
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.kept = []

    def _internals_events(self, capture, step, ts):
        self.kept.append(capture)
        return super()._internals_events(capture, step, ts)


def run_watched(path, prompt, prefix_first: bool = False):
    engine = LLMEngine(model=str(path), device="cpu", dtype="float32", block_size=4, num_kv_blocks=64,
                       max_num_batched_tokens=64, num_threads=1)
    if prefix_first:   # the watched request then finds its prefix in the cache
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=1))
        while engine.has_unfinished():
            engine.step()
    events = []
    instr = KeepingInstrumentation(engine, events.extend)
    seq = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    instr.watch(seq.request_id, "test", WatchSpec(layers=frozenset(), internals=True), seq)
    while engine.has_unfinished():
        engine.step()
    instr.detach()
    return engine, seq, events, instr.kept


def hf_reference(path, ids):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gate_up = {}
    hooks = [layer.mlp.gate_proj.register_forward_hook(lambda m, a, o, i=i: gate_up.__setitem__((i, "gate"), o[0]))
             for i, layer in enumerate(hf.model.layers)]
    hooks += [layer.mlp.up_proj.register_forward_hook(lambda m, a, o, i=i: gate_up.__setitem__((i, "up"), o[0]))
              for i, layer in enumerate(hf.model.layers)]
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
        lens = [hf.lm_head(hf.model.norm(h[0])) for h in out.hidden_states[1:-1]] + [hf.lm_head(out.hidden_states[-1][0])]
    for hook in hooks:
        hook.remove()
    return hf, out.hidden_states, gate_up, lens


@pytest.fixture(scope="module", params=["qwen3", "qwen2", "llama", "embedded"])
def checkpoint(request, tmp_path_factory):
    if request.param == "embedded":
        return model_path()
    return make_checkpoint(request.param, tmp_path_factory.mktemp(request.param), seed=1)


@pytest.mark.parametrize("prefix_first", [False, True], ids=["uncached", "prefix-cached"])
def test_internals_equal_transformers(checkpoint, prefix_first):
    prompt = [5, 17, 300, 42, 9, 250, 77, 3, 120, 64, 11]
    engine, seq, events, kept = run_watched(checkpoint, prompt, prefix_first)
    ids = seq.token_ids[:-1]           # every position the model has seen
    _, hidden, gate_up, lens = hf_reference(checkpoint, ids)
    num_layers = engine.model_config.num_layers
    covered = set()
    for capture in kept:
        (r,) = capture.watched
        pos = r.positions
        covered |= set(pos)
        sid = r.seq.seq_id
        for i in range(num_layers):
            t = {w: capture.tensors[(sid, i, w)] for w in ("input", "output", "gate", "up")}
            assert torch.allclose(t["input"], hidden[i][0, pos], atol=5e-4), (i, pos)
            if i < num_layers - 1:     # HF's last hidden state has the final norm applied
                assert torch.allclose(t["output"], hidden[i + 1][0, pos], atol=5e-4), (i, pos)
            assert torch.allclose(t["gate"], gate_up[(i, "gate")][pos], atol=1e-4)
            assert torch.allclose(t["up"], gate_up[(i, "up")][pos], atol=1e-4)
    assert covered == set(range(len(ids)))
    if prefix_first:
        assert seq.num_cached_tokens > 0

    for e in events:
        if e["type"].startswith("internals."):
            check_event(e)
    lens_events = [e for e in events if e["type"] == "internals.logit_lens"]
    for e in lens_events:
        for layer in e["layers"]:
            want = lens[layer["layer"]][e["positions"]].softmax(-1)
            for row, pos_want in zip(layer["top"], want):
                top = pos_want.topk(5)
                assert [c["id"] for c in row] == top.indices.tolist()
                assert [c["prob"] for c in row] == pytest.approx(top.values.tolist(), abs=5e-4)   # rows are rounded to 4 decimals
    # the lens's last layer is the engine's own next-token distribution
    samples = [e for e in events if e["type"] == "sampling"]
    last_rows = {e["positions"][-1]: e["layers"][-1]["top"][-1] for e in lens_events}
    for s in samples:
        pos = len(seq.prompt_token_ids) - 1 + s["index"]
        raw = dict(zip(s["candidates"]["ids"], s["stages"][0]["probs"]))
        for c in last_rows[pos]:
            assert c["prob"] == pytest.approx(raw[c["id"]], abs=1e-5)
        assert last_rows[pos][0]["id"] == s["chosen"]["id"]         # greedy


def test_embedding_neighbours_and_projection_use_the_real_matrix():
    engine, seq, events, _ = run_watched(model_path(), "The little cat sat on the mat")
    emb = [e for e in events if e["type"] == "internals.embeddings"]
    first = emb[0]
    weight = engine.model.model.embed_tokens.weight.detach()
    rows = torch.tensor(first["rows"])
    assert torch.allclose(rows, weight[first["token_ids"]], atol=1e-4)
    weight = weight[:len(engine.tokenizer)]       # rows no token reaches are left out
    cos = torch.nn.functional.normalize(rows, dim=1) @ torch.nn.functional.normalize(weight, dim=1).T
    for near, c in zip(first["neighbours"], cos):
        assert near[0]["id"] == int(c.argmax())           # a token's nearest row is its own
        assert [n["cosine"] for n in near] == pytest.approx(c.topk(len(near)).values.tolist(), abs=5e-4)   # rows are rounded to 4 decimals
    unit = torch.nn.functional.normalize(weight, dim=1)    # a PCA of the rows' directions
    centred = unit - unit.mean(0)
    _, s, v = torch.linalg.svd(centred, full_matrices=False)
    pca = torch.tensor(first["pca"])
    ref = (torch.nn.functional.normalize(rows, dim=1) - unit.mean(0)) @ v[:2].T
    assert torch.allclose(pca.abs(), ref.abs(), atol=2e-3)     # principal axes are defined up to sign
    assert first["vocab"]["explained"] == pytest.approx((s[:2] ** 2 / (s ** 2).sum()).tolist(), abs=1e-3)
    rope = next(e for e in events if e["type"] == "internals.rope")
    cfg = engine.model_config
    assert len(rope["inv_freq"]) == cfg.head_dim // 2 and rope["rope_theta"] == cfg.rope_theta
    assert rope["inv_freq"][1] == pytest.approx(cfg.rope_theta ** (-2 / cfg.head_dim), rel=1e-5)
    facts = EmbeddingFacts.of(weight)
    assert len(facts.vocab_points) == weight.shape[0] == len(engine.tokenizer)
