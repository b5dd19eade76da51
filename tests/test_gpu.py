"""The engine on a CUDA GPU: the Triton paged-attention kernel and CUDA-graph decode against
transformers (float32, token for token) and against the eager path (bfloat16), an 8-bit KV
cache, prefix hits, chunking and preemption, n-gram speculation, and two engines created and
closed in turn. CI has no GPU: these run where one is present (`pytest -m gpu`) and skip
elsewhere."""
from __future__ import annotations

import gc

import pytest
import torch

from attention_frames import per_layer
from hf_models import VOCAB, hf_greedy, make_checkpoint
from kvscope import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPT_LENS = [1, 3, 17, 40, 64, 129, 200]
MAX_NEW = 24


def random_prompts(seed: int, lens=PROMPT_LENS) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 2, (n,), generator=g).tolist() for n in lens]


def greedy(max_new=MAX_NEW) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def family(request, tmp_path_factory):
    directory = make_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    prompts = random_prompts(3)
    return directory, prompts, hf_greedy(directory, prompts, MAX_NEW)


@pytest.mark.parametrize("backend,eager", [("triton", False), ("triton", True), ("torch", True)])
def test_greedy_matches_transformers_on_cuda(family, backend, eager):
    directory, prompts, reference = family
    with LLM(str(directory), device="cuda", dtype="float32", block_size=16,
             attention_backend=backend, enforce_eager=eager) as llm:
        plan = llm.engine.plan
        assert plan.attention_backend == backend
        assert (llm.engine.runner.graphs is None) == eager, plan
        assert eager or "fused by torch.compile" in plan.decode, plan
        assert tokens(llm.generate(prompts, greedy())) == reference


def test_graph_replay_equals_eager_in_bfloat16(family):
    """Batch sizes between the captured buckets pad to the next one: padding must not change
    a real row's tokens."""
    directory, _, _ = family
    prompts = random_prompts(5, [5, 9, 30, 31, 47, 100, 2, 64, 13, 77, 20])   # 11 rows: bucket 16
    runs = {}
    for eager in (True, False):
        with LLM(str(directory), device="cuda", dtype="bfloat16", enforce_eager=eager) as llm:
            runs[eager] = tokens(llm.generate(prompts, greedy(32)))
    assert runs[False] == runs[True]


def test_graphs_replay_every_decode_step(family):
    directory, prompts, _ = family
    with LLM(str(directory), device="cuda", dtype="float32", attention_backend="triton") as llm:
        graphs = llm.engine.runner.graphs
        replays = {b: 0 for b in graphs.graphs}
        for b, graph in graphs.graphs.items():
            graph.replay = (lambda b=b, real=graph.replay: (replays.__setitem__(b, replays[b] + 1), real())[1])
        llm.generate(prompts[:3], greedy(10))
        # three rows decode together (bucket 4, no queries kept) for nine steps; the first token is the prefill's
        assert replays[(4, False)] >= 9 and sum(replays.values()) >= 9, replays


def test_prefix_hits_chunking_and_preemption_on_cuda(tmp_path):
    directory = make_checkpoint("qwen3", tmp_path / "m")
    shared = random_prompts(11, [70])[0]
    prompts = [shared + p for p in random_prompts(12, [5, 40, 90, 3])]
    reference = hf_greedy(directory, prompts, MAX_NEW)
    # 24 blocks of 8 tokens for four requests of up to 184 tokens: the scheduler must preempt
    with LLM(str(directory), device="cuda", dtype="float32", block_size=8, num_gpu_blocks_override=24,
             enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=64) as llm:
        outs = llm.generate(prompts, greedy())
        assert tokens(outs) == reference
        assert sum(o.metrics.num_preemptions for o in outs) > 0, "24 blocks of 8 cannot hold all four"
        bm = llm.engine.block_manager
        assert bm.prefix_cache_hits > 0
        assert bm.num_free_blocks == bm.num_blocks


def test_ngram_speculation_on_cuda_equals_plain_greedy(tmp_path):
    directory = make_checkpoint("qwen3", tmp_path / "m")
    prompts = [list(range(5, 25)) * 4, [9, 8, 7, 6] * 10]
    with LLM(str(directory), device="cuda", dtype="float32") as llm:
        plain = tokens(llm.generate(prompts, greedy(40)))
    with LLM(str(directory), device="cuda", dtype="float32",
             speculative_config={"method": "ngram", "num_speculative_tokens": 3}) as llm:
        assert tokens(llm.generate(prompts, greedy(40))) == plain
        assert llm.engine.speculator.total.accepted > 0


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "int8_per_token_head"])
def test_quantized_kv_cache_on_cuda(kv_cache_dtype):
    """The default model, bfloat16: the 8-bit cache holds as many more blocks as its bytes
    per token allow in the same budget. The per-token-head int8 cache keeps the greedy tokens
    of the unquantized cache (as on a CPU, docs/benchmarks.md); fp8 with vLLM's per-tensor
    scale of 1.0 may flip near-ties, so only its start must agree."""
    from kvscope.layers.attention import kv_cache_format
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8] * 6, list(range(100, 160))]
    budget = 64 * 2**20
    with LLM(device="cuda", dtype="bfloat16", kv_cache_memory_bytes=budget) as llm:
        blocks = llm.engine.block_manager.num_blocks
        cfg = llm.engine.model_config
        plain = tokens(llm.generate(prompts, greedy(64)))
    with LLM(device="cuda", dtype="bfloat16", kv_cache_memory_bytes=budget,
             kv_cache_dtype=kv_cache_dtype) as llm:
        assert llm.engine.plan.attention_backend == "torch"    # the reference dequantizes on read
        per_token = [kv_cache_format(name, torch.bfloat16).bytes_per_token(cfg.num_layers, cfg.num_kv_heads,
                                                                          cfg.head_dim)
                     for name in ("auto", kv_cache_dtype)]
        assert llm.engine.block_manager.num_blocks == pytest.approx(blocks * per_token[0] / per_token[1], rel=0.01)
        quantized = tokens(llm.generate(prompts, greedy(64)))
    agreed = [next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), len(p)) for p, q in zip(plain, quantized)]
    assert all(len(q) == 64 for q in quantized)
    needed = 0.8 * 64 if kv_cache_dtype == "int8_per_token_head" else 2
    assert min(agreed) >= needed, agreed


def test_two_engines_in_turn_give_their_memory_back():
    with LLM(device="cuda", gpu_memory_utilization=0.3) as llm:
        first = tokens(llm.generate([[1, 2, 3]], greedy(8)))
    gc.collect()
    torch.cuda.empty_cache()
    after_first = torch.cuda.memory_allocated()
    with LLM(device="cuda", gpu_memory_utilization=0.3) as llm:
        assert tokens(llm.generate([[1, 2, 3]], greedy(8))) == first
    gc.collect()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() <= after_first + 2**20


def test_watched_attention_from_the_cuda_graphs_equals_transformers(tmp_path):
    """A watched request's decode steps replay the graphs that keep the queries; the weights
    computed from those queries and the paged keys equal transformers' eager attention."""
    from transformers import AutoModelForCausalLM

    from kvscope.instrumentation import Instrumentation, WatchSpec
    from kvscope.instrumentation.encode import binary_frame, decode
    directory = make_checkpoint("qwen3", tmp_path / "m")
    with LLM(str(directory), device="cuda", dtype="float32", attention_backend="triton") as llm:
        engine = llm.engine
        replays = {key: 0 for key in engine.runner.graphs.graphs}
        for key, graph in engine.runner.graphs.graphs.items():
            graph.replay = (lambda key=key, real=graph.replay: (replays.__setitem__(key, replays[key] + 1), real())[1])
        events = []
        instr = Instrumentation(engine, events.extend)
        seqs = [engine.add_request(p, greedy(8)) for p in random_prompts(13, [30, 7, 50])]
        for seq in (seqs[0], seqs[2]):
            instr.watch(seq.request_id, "test", WatchSpec(), seq)
        while engine.has_unfinished():
            engine.step()
        instr.detach()
        assert sum(n for (_, keep), n in replays.items() if keep) >= 7, replays
        hf = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager", dtype=torch.float32).eval()
        frames = [decode(binary_frame(e)) for e in events if e["type"] == "attention"]
        att = per_layer(frames)
        for seq in (seqs[0], seqs[2]):
            with torch.no_grad():
                ref = hf(torch.tensor([seq.token_ids[:-1]]), output_attentions=True).attentions
            assert len([a for a in frames if a["request_id"] == seq.request_id]) == 8   # the prompt and 7 decodes
            mine = [a for a in att if a["request_id"] == seq.request_id]
            assert len(mine) == 8 * len(ref)   # every layer in each
            for a in mine:
                want = ref[a["layer"]][0][:, a["query_positions"], :a["context_len"]]
                assert torch.allclose(torch.from_numpy(a["weights"]), want, atol=1e-3), (a["layer"], a["step"])


def test_a_decode_step_waits_for_the_gpu_once(tmp_path):
    """Inputs go to the GPU through pinned memory without waiting; the one wait a plain decode
    step makes is for its sampled ids (torch's sync debug mode warns at every synchronising call)."""
    import warnings
    directory = make_checkpoint("qwen3", tmp_path / "m")
    with LLM(str(directory), device="cuda", dtype="bfloat16") as llm:
        engine = llm.engine
        for prompt in random_prompts(7, [20, 33, 9]):
            engine.add_request(prompt, greedy(40))
        for _ in range(3):    # the prompts, then plain decode steps
            engine.step()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(10):
                    engine.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        assert len(syncs) <= 10, [str(w.message) for w in syncs[:5]]
