"""One script, two engines: tests/same_script.py runs unchanged on kvscope and, with only its
import line changed, on vLLM (its CPU build, in its own virtual environment). Greedy tokens
must be equal on the shipped model and on random-weight Qwen3, Qwen2 and Llama checkpoints,
and every field the script reads must have the same shape on both sides."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from hf_models import VOCAB, make_checkpoint
from vllm_env import require_vllm

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "same_script.py"
MINI = ROOT / "backend" / "kvscope" / "assets" / "kvscope-mini"
KVSCOPE_IMPORT = "from kvscope import LLM, SamplingParams"
VLLM_IMPORT = "from vllm import LLM, SamplingParams"
# vLLM's names for both; its CPU attention needs blocks of a multiple of 32
ENGINE = dict(dtype="float32", seed=0, block_size=32, max_model_len=1024, max_num_seqs=16,
              kv_cache_memory_bytes=256 << 20, enforce_eager=True)
MAX_NEW = 16
FAMILIES = ("qwen3", "qwen2", "llama")
# four vLLM starts (35-50 s each on an idle 2-core machine, minutes on a busy one) in the first test
pytestmark = pytest.mark.timeout(1800)


def mini_job() -> dict:
    greedy = {"temperature": 0.0, "max_tokens": 24}
    requests = [
        {"prompt": "Once upon a time", "params": greedy},
        {"prompt": "Tom had a red ball.", "params": {**greedy, "logprobs": 3}},
        {"prompt": {"prompt_token_ids": [414, 413, 261, 353]}, "params": {**greedy, "stop": [" the"]}},
        {"prompt": "The little cat", "params": {**greedy, "max_tokens": 40, "ignore_eos": True}},
        {"prompt": "Mia and her dog", "params": {**greedy, "stop_token_ids": [266]}},
        {"prompt": "One day,", "params": {"temperature": 0.8, "seed": 1, "n": 2, "max_tokens": 8}},
    ]
    return {"model": str(MINI), "engine": ENGINE, "requests": requests,
            "chat": [{"role": "user", "content": "Who found the key?"}]}


def random_job(directory: Path) -> dict:
    g = torch.Generator().manual_seed(11)
    lengths = (1, 19, 33, 64, 100, 250)
    prompts = [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in lengths]
    greedy = {"temperature": 0.0, "max_tokens": MAX_NEW, "ignore_eos": True}
    requests = [{"prompt": {"prompt_token_ids": p}, "params": greedy} for p in prompts]
    requests[1]["params"] = {**greedy, "logprobs": 2}
    return {"model": str(directory), "engine": {**ENGINE, "skip_tokenizer_init": True},
            "requests": requests, "chat": None}


def run_script(python: str, import_line: str, job: dict, workdir: Path, name: str) -> dict:
    script = workdir / f"{name}.py"
    source = SCRIPT.read_text()
    assert source.count(KVSCOPE_IMPORT) == 1
    script.write_text(source.replace(KVSCOPE_IMPORT, import_line))
    job_path, out_path = workdir / f"{name}.job.json", workdir / f"{name}.out.json"
    job_path.write_text(json.dumps(job))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(ROOT / "backend")}
    # a session of its own, so that a timeout also ends the engine process vLLM spawns
    proc = subprocess.Popen([python, str(script), str(job_path), str(out_path)], env=env, cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None or name.startswith("vllm"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{name} failed:\n{stderr[-4000:]}"
    return json.loads(out_path.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Each model's outputs from both engines: one process per engine and model, every
    prompt in one generate() call; two vLLM processes at a time (most of a start is spent
    waiting on one core), the kvscope runs beside them."""
    vllm_python = require_vllm()
    workdir = tmp_path_factory.mktemp("same-script")
    jobs = {"kvscope-mini": mini_job()}
    for family in FAMILIES:
        directory = make_checkpoint(family, workdir / family, hidden_size=128)   # 32-wide heads
        jobs[family] = random_job(directory)
    with ThreadPoolExecutor(2) as pool:
        theirs = {name: pool.submit(run_script, vllm_python, VLLM_IMPORT, job, workdir, f"vllm-{name}")
                  for name, job in jobs.items()}
        ours = {name: run_script(sys.executable, KVSCOPE_IMPORT, job, workdir, f"kvscope-{name}")
                for name, job in jobs.items()}
        return {name: (ours[name], theirs[name].result(), jobs[name]) for name in jobs}


def greedy_pairs(ours: dict, theirs: dict, job: dict):
    for out, ref, request in zip(ours["generate"], theirs["generate"], job["requests"]):
        if request["params"]["temperature"] == 0.0:
            yield out, ref


@pytest.mark.parametrize("model", ["kvscope-mini", *FAMILIES])
def test_greedy_tokens_equal_vllms(results, model):
    ours, theirs, job = results[model]
    pairs = list(greedy_pairs(ours, theirs, job))
    equal = sum(a["outputs"][0]["token_ids"] == b["outputs"][0]["token_ids"] for a, b in pairs)
    print(f"{model}: {equal}/{len(pairs)} greedy outputs equal to vLLM's")
    for a, b in pairs:
        assert a["prompt_token_ids"] == b["prompt_token_ids"]
        assert a["outputs"][0]["token_ids"] == b["outputs"][0]["token_ids"], a["prompt_token_ids"][:8]
        assert a["outputs"][0]["finish_reason"] == b["outputs"][0]["finish_reason"]
        assert a["outputs"][0]["stop_reason"] == b["outputs"][0]["stop_reason"]
        assert a["outputs"][0]["text"] == b["outputs"][0]["text"]
    assert equal == len(pairs) > 0


@pytest.mark.parametrize("model", ["kvscope-mini", *FAMILIES])
def test_every_field_has_vllms_shape(results, model):
    ours, theirs, job = results[model]
    for section in ("generate", "chat"):
        assert len(ours.get(section) or []) == len(theirs.get(section) or [])
        for a, b in zip(ours.get(section) or [], theirs.get(section) or []):
            assert a["kinds"] == b["kinds"]
            assert a["has_metrics"] and b["has_metrics"]
            assert (a["prompt"], a["finished"]) == (b["prompt"], b["finished"])
            assert [c["index"] for c in a["outputs"]] == [c["index"] for c in b["outputs"]]
            for x, y in zip(a["outputs"], b["outputs"]):
                assert x["kinds"] == y["kinds"], (x["kinds"], y["kinds"])
                assert x["finished"] == y["finished"]


@pytest.mark.parametrize("model", ["kvscope-mini", *FAMILIES])
def test_logprobs_equal_vllms(results, model):
    """Top-n logprobs with their ranks and tokens: the same ids in the same order, values
    within float32 noise, the cumulative logprob their sum."""
    ours, theirs, job = results[model]
    asked = [i for i, r in enumerate(job["requests"]) if r["params"].get("logprobs")]
    assert asked
    for i in asked:
        a, b = ours["generate"][i]["outputs"][0], theirs["generate"][i]["outputs"][0]
        assert len(a["logprobs"]) == len(b["logprobs"]) == len(a["token_ids"])
        for x, y in zip(a["logprobs"], b["logprobs"]):
            assert list(x) == list(y)
            for token in x:
                (lp, rank, text), (lp2, rank2, text2) = x[token], y[token]
                assert abs(lp - lp2) < 1e-3 and rank == rank2 and text == text2
        assert a["cumulative_logprob"] == pytest.approx(b["cumulative_logprob"], abs=1e-2)


def test_chat_formats_the_prompt_as_vllm_does(results):
    ours, theirs, _ = results["kvscope-mini"]
    a, b = ours["chat"][0], theirs["chat"][0]
    assert a["prompt_token_ids"] == b["prompt_token_ids"]
    assert a["outputs"][0]["token_ids"] == b["outputs"][0]["token_ids"]
    assert a["outputs"][0]["stop_reason"] == b["outputs"][0]["stop_reason"]
