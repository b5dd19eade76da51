"""Compiled CPU decode (engine/graphs.py) against the eager engine and
transformers: the same greedy tokens, the same log-probabilities within float32 noise,
the same seeded samples; every decode step of a plain batch takes the compiled graph,
whatever the batch size or context length, and none recompiles after start-up."""
from __future__ import annotations

import json

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams
from kvscope.engine.graphs import MAX_REFERENCE_COMPILED_BATCH
from kvscope.engine.llm_engine import EngineObserver

PROMPT_LENS = [1, 5, 15, 16, 17, 33, 70, 130]   # contexts of one block up to nine
MAX_NEW = 40


class PathCounter(EngineObserver):
    """How each step's forward pass ran, by whether the step had a prompt in it: it counts
    the compiled graph's calls around each step."""

    def __init__(self, engine=None, eager=False):
        self.paths: dict[tuple[bool, str], int] = {}
        self.eager = eager
        self.calls = [0]
        if engine is not None and engine.runner.compiled is not None:
            compiled, run = engine.runner.compiled, engine.runner.compiled.run
            compiled.run = lambda inputs: self.calls.__setitem__(0, self.calls[0] + 1) or run(inputs)
        self.seen = 0

    def on_scheduled(self, scheduled) -> bool:
        return self.eager

    def on_step(self, record) -> None:
        path = "compiled" if self.calls[0] > self.seen else "eager"
        self.seen = self.calls[0]
        key = (any(e.num_new_tokens > 1 for e in record.scheduled.entries), path)
        self.paths[key] = self.paths.get(key, 0) + 1


def prompts_of(lens, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in lens]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module", params=["cpu_paged", "torch"])
def engines(checkpoint, request):
    """Compiled and eager, with the C kernel (the CPU's default) or the reference attention."""
    kw = dict(device="cpu", dtype="float32", block_size=16, max_num_seqs=24, attention_backend=request.param)
    return LLM(str(checkpoint), cpu_compile=True, **kw), LLM(str(checkpoint), **kw)


def greedy(max_new=MAX_NEW, logprobs=None):
    return SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True, logprobs=logprobs)


def test_the_runner_compiled_its_decode_step(engines):
    compiled, eager = engines
    assert compiled.engine.runner.compiled is not None
    assert compiled.engine.plan.decode.startswith("compiled")
    assert eager.engine.runner.compiled is None and eager.engine.plan.decode == "eager"


def test_batched_greedy_equals_eager_and_transformers(engines, checkpoint):
    compiled, eager = engines
    prompts = prompts_of(PROMPT_LENS)
    counter = PathCounter(compiled.engine)
    compiled.engine.add_observer(counter)
    try:
        outs = compiled.generate(prompts, greedy(logprobs=3))
    finally:
        compiled.engine.remove_observer(counter)
    assert all(o.outputs[0].finish_reason == "length" for o in outs), [o.error for o in outs]
    refs = eager.generate(prompts, greedy(logprobs=3))
    hf = hf_greedy(checkpoint, prompts[:3], MAX_NEW)
    for out, ref, p in zip((o.outputs[0] for o in outs), (o.outputs[0] for o in refs), prompts):
        assert out.token_ids == ref.token_ids, f"prompt of {len(p)} tokens diverged"
        got = torch.tensor([lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)])
        want = torch.tensor([lp[t].logprob for lp, t in zip(ref.logprobs, ref.token_ids)])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert [o.outputs[0].token_ids for o in outs[:3]] == hf
    # decode-only steps ran compiled at every batch size the run went through (8 down to 1)
    assert counter.paths.get((False, "compiled"), 0) >= MAX_NEW - 1
    assert (False, "eager") not in counter.paths
    assert (True, "compiled") not in counter.paths


def test_one_request_at_a_time_uses_the_batch_of_one_graph(engines):
    compiled, eager = engines
    for n in (1, 16, 47):          # one block, exactly one full block, three blocks
        p = prompts_of([n], seed=n)
        assert compiled.generate(p, greedy(70))[0].outputs[0].token_ids == eager.generate(p, greedy(70))[0].outputs[0].token_ids


def test_every_decode_batch_compiles_with_the_kernel_and_small_ones_with_the_reference(engines):
    compiled, eager = engines
    n = MAX_REFERENCE_COMPILED_BATCH + 4
    prompts = prompts_of([5 + 7 * i for i in range(n)], seed=5)
    params = [greedy(10 + 3 * i) for i in range(n)]     # requests end one by one
    counter = PathCounter(compiled.engine)
    compiled.engine.add_observer(counter)
    try:
        outs = compiled.generate(prompts, params)
    finally:
        compiled.engine.remove_observer(counter)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in eager.generate(prompts, params)]
    assert counter.paths.get((False, "compiled"), 0) > 0
    if compiled.engine.plan.attention_backend == "torch":   # batches above the limit pad too much
        assert counter.paths.get((False, "eager"), 0) > 0
    else:
        assert (False, "eager") not in counter.paths


def test_a_batch_of_short_contexts_runs_the_graph_without_recompiling(engines):
    """Every context within one block: the decode table is one block wide, a size dynamo
    specialises; the step pads it to two so the batch graph's guards still hold (before,
    a class of short prompts forced a recompile mid-serving and guard checks ever after)."""
    compiled, eager = engines
    prompts = prompts_of([2, 3, 4], seed=9)
    counter = PathCounter(compiled.engine)
    compiled.engine.add_observer(counter)
    try:
        with torch.compiler.set_stance("fail_on_recompile"):   # a step failing every graph's guards raises
            outs = compiled.generate(prompts, greedy(8))      # contexts of at most 12 tokens
    finally:
        compiled.engine.remove_observer(counter)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in eager.generate(prompts, greedy(8))]
    assert counter.paths.get((False, "compiled"), 0) >= 7 and (False, "eager") not in counter.paths


def test_seeded_sampling_equals_eager(engines):
    compiled, eager = engines
    params = [SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=s, max_tokens=30, ignore_eos=True)
              for s in range(4)]
    prompts = prompts_of([9, 21, 40, 3], seed=11)
    assert [o.outputs[0].token_ids for o in compiled.generate(prompts, params)] == \
        [o.outputs[0].token_ids for o in eager.generate(prompts, params)]


def test_choices_forking_from_a_one_token_prompt_equal_eager(engines):
    """A one-token prompt is a decode-shaped step whose row the forks draw from too."""
    compiled, eager = engines
    params = SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=12, ignore_eos=True)
    p = prompts_of([1], seed=8)
    got = [c.token_ids for c in compiled.generate(p, params)[0].outputs]
    assert got == [c.token_ids for c in eager.generate(p, params)[0].outputs] and len(got) == 3


def test_forward_hooks_force_the_eager_path(engines):
    """Instrumentation's hooks must see every layer, so a forced-eager step is not compiled."""
    compiled, _ = engines
    counter = PathCounter(compiled.engine, eager=True)
    compiled.engine.add_observer(counter)
    try:
        compiled.generate(prompts_of([20]), greedy(5))
    finally:
        compiled.engine.remove_observer(counter)
    assert set(counter.paths) == {(True, "eager"), (False, "eager")}


def test_engines_in_one_process_each_run_their_own_graphs(checkpoint, tmp_path):
    """Every engine compiles the same forward function; its graphs are its own
    (isolate_recompiles) and dynamo's guards on the model tell them apart. Three models
    decode one after another in one process: the first, the same weights with another
    RMSNorm epsilon and RoPE base, and a qwen2 of the same sizes (q/k/v biases, no q/k
    norms). Each must equal its own eager engine, with no recompile after start-up."""
    kw = dict(device="cpu", dtype="float32", block_size=16)
    retuned = make_checkpoint("qwen3", tmp_path / "retuned")
    config = json.loads((retuned / "config.json").read_text())
    config.update(rms_norm_eps=0.5, rope_parameters={"rope_theta": 50.0, "rope_type": "default"})
    (retuned / "config.json").write_text(json.dumps(config))
    others = [retuned, make_checkpoint("qwen2", tmp_path / "qwen2", seed=1)]
    paths = [checkpoint, *others]
    compiled = [LLM(str(p), cpu_compile=True, **kw) for p in paths]
    prompts = prompts_of([7, 19, 33], seed=13)
    with torch.compiler.set_stance("fail_on_recompile"):
        got = [[o.outputs[0].token_ids for o in llm.generate(prompts, greedy(12))] for llm in compiled]
    want = [[o.outputs[0].token_ids for o in LLM(str(p), **kw).generate(prompts, greedy(12))] for p in paths]
    assert got == want
    assert got[0] != got[1], "the two qwen3 checkpoints should not agree token for token"


def test_a_failed_compile_leaves_a_working_eager_engine(checkpoint, monkeypatch):
    from kvscope.engine import graphs

    def no_compiler(runner, route):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(graphs, "CompiledDecode", no_compiler)
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", cpu_compile=True)
    assert llm.engine.runner.compiled is None
    assert llm.engine.plan.decode == "eager: torch.compile failed (RuntimeError: no C++ compiler found)"
    assert llm.generate(prompts_of([8]), greedy(4))[0].outputs[0].finish_reason == "length"


def test_a_context_shorter_than_the_warm_up_blocks_still_compiles(checkpoint):
    kw = dict(device="cpu", dtype="float32", block_size=16, max_model_len=24)
    llm = LLM(str(checkpoint), cpu_compile=True, **kw)
    assert llm.engine.plan.decode.startswith("compiled"), llm.engine.plan.decode
    p = prompts_of([6])
    out = llm.generate(p, greedy(18))[0]
    assert out.outputs[0].token_ids == LLM(str(checkpoint), **kw).generate(p, greedy(18))[0].outputs[0].token_ids, out.error


def test_backends_that_cannot_compile_say_why(checkpoint, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")     # triton's interpreter runs on a CPU, eagerly
    llm = LLM(str(checkpoint), device="cpu", dtype="float32", cpu_compile=True, attention_backend="triton")
    assert llm.engine.plan.decode == "eager: the triton attention backend runs eagerly"


def test_fused_elementwise_steps_keep_the_tokens(checkpoint):
    """The GPU path compiles every layer's norms, rotary embedding and activation before it
    captures its graphs (CausalLM.fuse_elementwise); the same compiled functions, run on this
    CPU inside an eager engine, give the unfused engine's tokens and log-probabilities."""
    prompts = prompts_of([3, 17, 40])
    kw = dict(device="cpu", dtype="float32", block_size=16)
    with LLM(str(checkpoint), **kw) as plain, LLM(str(checkpoint), **kw) as fused:
        fused.engine.runner.model.fuse_elementwise()
        norm = fused.engine.runner.model.model.norm
        assert norm.ops is not plain.engine.runner.model.model.norm.ops
        runs = [llm.generate(prompts, greedy(12, logprobs=0)) for llm in (plain, fused)]
    for a, b in zip(*runs):
        x, y = a.outputs[0], b.outputs[0]
        assert x.token_ids == y.token_ids
        got = torch.tensor([lp[t].logprob for lp, t in zip(y.logprobs, y.token_ids)])
        want = torch.tensor([lp[t].logprob for lp, t in zip(x.logprobs, x.token_ids)])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
