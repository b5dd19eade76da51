"""An engine's life: shut down twice without harm, the process's state given back, a second
engine (tensor-parallel or not) working after the first closed in the same process, and an
async front end whose shutdown ends every open stream instead of leaving it waiting."""
from __future__ import annotations

import asyncio
import gc
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from hf_models import VOCAB, make_checkpoint
from kvscope import LLM, SamplingParams
from kvscope.server.service.async_engine import AsyncEngine
from kvscope.engine.llm_engine import LLMEngine

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def run_to_end(engine: LLMEngine, prompt: list[int]) -> list[int]:
    seq = engine.add_request(prompt, GREEDY)
    while engine.has_unfinished():
        engine.step()
    return seq.output_token_ids


def test_shutdown_is_idempotent_and_gives_back_the_process_state(monkeypatch):
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    threads = torch.get_num_threads()
    engine = LLMEngine(device="cpu", num_threads=1)   # the embedded model ships a tokenizer
    assert torch.get_num_threads() == 1 and os.environ.get("TOKENIZERS_PARALLELISM") == "false"
    waiting = engine.add_request([1, 2, 3], GREEDY)
    engine.shutdown()
    engine.shutdown()
    assert torch.get_num_threads() == threads
    assert "TOKENIZERS_PARALLELISM" not in os.environ
    assert waiting.finish_reason == "abort"
    assert engine.runner.kv_cache_bytes == 0, "the KV cache is given back"
    assert all(p.device.type == "meta" for p in engine.model.parameters()), "and the weights"
    late = engine.add_request([1, 2, 3], GREEDY)
    assert late.finish_reason == "error" and "shut down" in late.error


def test_an_engine_that_fails_to_start_gives_back_the_threads(tmp_path):
    threads = torch.get_num_threads()
    with pytest.raises(Exception):
        LLMEngine(model=str(tmp_path / "no-such-checkpoint"), device="cpu", num_threads=threads + 1)
    assert torch.get_num_threads() == threads


def test_a_second_engine_after_the_first_closed_gives_the_same_tokens():
    first = LLMEngine(device="cpu")
    tokens = run_to_end(first, [5, 6, 7, 8])
    first.shutdown()
    second = LLMEngine(device="cpu")
    assert run_to_end(second, [5, 6, 7, 8]) == tokens
    second.shutdown()


def test_two_tensor_parallel_engines_one_after_another(tmp_path):
    directory = make_checkpoint("qwen3", tmp_path / "qwen3")
    kw = dict(model=str(directory), device="cpu", dtype="float32", tensor_parallel_size=2, num_threads=1)
    prompt = torch.randint(0, VOCAB - 2, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    first = LLMEngine(**kw)
    tokens = run_to_end(first, prompt)
    first.shutdown()
    first.shutdown()
    assert not torch.distributed.is_initialized()
    assert all(not p.is_alive() for p in first.workers.processes)
    second = LLMEngine(**kw)   # before: "trying to initialize the default process group twice!"
    try:
        assert run_to_end(second, prompt) == tokens
    finally:
        second.shutdown()
    assert not torch.distributed.is_initialized()


def test_dropping_the_last_reference_releases_a_tensor_parallel_engine(tmp_path):
    """`del llm` (as vLLM's examples end) releases the engine as close() does: the ranks stop
    and the process group goes, so a second tensor-parallel engine starts in the same process."""
    directory = make_checkpoint("qwen3", tmp_path / "qwen3")
    kw = dict(device="cpu", dtype="float32", tensor_parallel_size=2, num_threads=1)
    prompt = torch.randint(0, VOCAB - 2, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    llm = LLM(str(directory), **kw)
    tokens = llm.generate([prompt], GREEDY)[0].outputs[0].token_ids
    workers = llm.engine.workers.processes
    del llm
    gc.collect()
    assert not torch.distributed.is_initialized()
    assert all(not p.is_alive() for p in workers)
    second = LLM(str(directory), **kw)   # before: "trying to initialize the default process group twice!"
    try:
        assert second.generate([prompt], GREEDY)[0].outputs[0].token_ids == tokens
    finally:
        second.close()
    assert not torch.distributed.is_initialized()


def test_an_engine_leaves_no_cycle_holding_it():
    """Nothing the engine builds points back at it, so dropping it frees it at once."""
    threads = torch.get_num_threads()
    engine = LLMEngine(device="cpu", num_threads=threads + 1)
    run_to_end(engine, [5, 6, 7])
    gc.disable()
    try:
        ref = weakref.ref(engine)
        del engine
        assert ref() is None
    finally:
        gc.enable()
    assert torch.get_num_threads() == threads, "and gives back what it set for the process"


def test_async_shutdown_ends_open_streams_with_a_final_delta():
    aengine = AsyncEngine(LLMEngine(device="cpu"))
    aengine.pause()   # nothing runs: the stream would wait forever without a final delta
    started = threading.Event()

    async def consume():
        deltas = []
        async for delta in aengine.generate([1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True),
                                            on_added=lambda seq: started.set()):
            deltas.append(delta)
        return deltas

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: asyncio.run(asyncio.wait_for(consume(), timeout=30)))
        assert started.wait(timeout=30)
        aengine.shutdown()
        deltas = future.result(timeout=30)
    assert deltas and deltas[-1].finished
    assert deltas[-1].output.outputs[0].finish_reason == "abort"
    assert aengine.engine.closed
    aengine.shutdown()   # a second call does nothing


@pytest.mark.parametrize("budget", [None, 3 << 20])
def test_the_cpu_kv_budget_comes_from_free_memory_or_kv_cache_memory_bytes(budget):
    engine = LLMEngine(device="cpu", kv_cache_memory_bytes=budget)
    try:
        per_block = engine.runner.kv_cache_bytes // (engine.block_manager.num_blocks + 1)
        if budget is None:
            assert "available" in engine.plan.kv_cache_sizing
        else:
            assert engine.block_manager.num_blocks == budget // per_block
            assert "kv_cache_memory_bytes" in engine.plan.kv_cache_sizing
    finally:
        engine.shutdown()
