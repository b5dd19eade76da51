"""Tensor parallelism with two gloo processes on CPU: greedy output token for token equal to
one process and to transformers (Qwen3 with GQA, Llama); each rank holds half of every
split matrix and half of the KV heads; a worker that dies fails the requests with a reason
and nothing hangs; bad sizes are refused before any process starts."""
from __future__ import annotations

import pytest
import torch

from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams

MAX_NEW = 12


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in (1, 19, 70)]


def greedy(llm: LLM, ps, max_new=MAX_NEW):
    return [o.outputs[0].token_ids for o in llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=max_new,
                                                                 ignore_eos=True))]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_two_ranks_match_one_rank_and_transformers(family, tmp_path):
    directory = make_checkpoint(family, tmp_path / family)
    ps = prompts()
    reference = hf_greedy(directory, ps, MAX_NEW)
    one = greedy(LLM(str(directory), device="cpu", dtype="float32", block_size=8), ps)
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=8, tensor_parallel_size=2, num_threads=1)
    try:
        model = llm.engine.model
        attn = model.model.layers[0].self_attn
        assert (attn.attn.num_heads, attn.attn.num_kv_heads) == (2, 1)      # 4 query heads, 2 KV heads, split in two
        assert model.model.layers[0].mlp.down_proj.weight.shape == (64, 64)   # 128 inputs, half here
        assert llm.engine.runner.kv_caches[0].shape[2] == 1         # this rank's cache holds its KV head
        assert greedy(llm, ps) == one == reference
        bm = llm.engine.block_manager
        assert bm.num_free_blocks == bm.num_blocks
    finally:
        llm.engine.shutdown()


def test_a_dead_worker_fails_the_requests_and_nothing_hangs(tmp_path):
    directory = make_checkpoint("qwen3", tmp_path / "qwen3")
    llm = LLM(str(directory), device="cpu", dtype="float32", tensor_parallel_size=2, num_threads=1)
    engine = llm.engine
    seqs = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=50)) for p in prompts()]
    engine.step()
    worker = engine.workers.processes[0]
    worker.kill()
    worker.join(timeout=10)
    _, finished = engine.step()
    assert set(finished) == set(seqs)
    assert all(s.finish_reason == "error" and "worker" in s.error for s in seqs)
    assert not engine.has_unfinished()
    late = engine.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    assert late.finish_reason == "error"
    engine.shutdown()


def test_sizes_that_do_not_split_are_refused(tmp_path):
    directory = make_checkpoint("qwen3", tmp_path / "qwen3")
    with pytest.raises(ValueError, match="not divisible by tensor_parallel_size 3"):
        LLM(str(directory), device="cpu", dtype="float32", tensor_parallel_size=3)


def test_the_same_script_runs_under_torchrun(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    directory = make_checkpoint("qwen3", tmp_path / "qwen3")
    ps = prompts()[:2]
    script = tmp_path / "run.py"
    script.write_text(
        "from kvscope import LLM, SamplingParams\n"
        f"llm = LLM({str(directory)!r}, device='cpu', dtype='float32', tensor_parallel_size=2, num_threads=1)\n"
        f"outs = llm.generate({ps!r}, SamplingParams(temperature=0.0, max_tokens={MAX_NEW}, ignore_eos=True))\n"
        "print('TOKENS', [o.outputs[0].token_ids for o in outs])\n"
        "llm.engine.shutdown()\n")
    backend = str(Path(__file__).resolve().parents[1] / "backend")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [backend, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("TOKENS")]
    assert lines == [f"TOKENS {hf_greedy(directory, ps, MAX_NEW)}"]   # printed by rank 0 only


def test_each_step_record_carries_its_engines_bytes_between_ranks(tmp_path):
    """The bytes rank 0 sends are counted by the engine's own group and published in the step
    record: a decode step of b sequences all-reduces the embeddings and two [b, hidden]
    partial sums a layer, and gathers b rows of the other rank's half of the logits."""
    from kvscope.engine import EngineObserver
    from kvscope.layers.parallel import TPGroup

    class Bytes(EngineObserver):
        def __init__(self):
            self.steps = []

        def on_step(self, record):
            self.steps.append((record.scheduled, record.comm_bytes))

    directory = make_checkpoint("qwen3", tmp_path / "qwen3")
    llm = LLM(str(directory), device="cpu", dtype="float32", block_size=8, tensor_parallel_size=2, num_threads=1)
    try:
        heard = Bytes()
        llm.engine.add_observer(heard)
        greedy(llm, prompts(), max_new=4)
        cfg = llm.engine.model_config
        decodes = [(out, n) for out, n in heard.steps if all(e.kind == "decode" for e in out.entries)]
        assert decodes and all(n > 0 for _, n in heard.steps)
        for out, n in decodes:
            b = len(out.entries)
            assert n == 4 * b * (cfg.hidden_size * (2 * cfg.num_layers + 1) + cfg.vocab_size // 2)
        assert llm.engine.workers.group.comm is not TPGroup(0, 2).comm   # per engine, not per process
        assert llm.engine.workers.group.comm.nbytes == 0                 # taken by the last step
    finally:
        llm.close()
