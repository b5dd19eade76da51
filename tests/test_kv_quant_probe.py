"""The quantized-KV probe (instrumentation/kv_quant_probe.py) and its `kv_quant` command: blocks a
budget holds per kv_cache_dtype, the logit error of a quantized cache against the
unquantized one on the embedded model, and the engine's own cache left as it was."""
from __future__ import annotations

import pytest
import torch

from kvscope import LLM, SamplingParams
from kvscope.instrumentation.kv_quant_probe import cache_fit, compare_greedy, measure_kv_cache_dtype
from kvscope.layers.attention import PagedAttention
from server_harness import Client

PROMPT = "Once upon a time, a little fox found a shiny stone by the river."


def test_cache_fit_counts_stored_bytes_and_scales():
    cfg = type("Cfg", (), {"num_layers": 4, "num_kv_heads": 2, "head_dim": 32})()
    budget = 1 << 20
    auto = cache_fit("auto", torch.float32, cfg, 16, budget)
    fp8 = cache_fit("fp8", torch.float32, cfg, 16, budget)
    int8 = cache_fit("int8_per_token_head", torch.float32, cfg, 16, budget)
    assert auto.bytes_per_token == 2 * 4 * 2 * 32 * 4                 # K and V, layers, heads, dim, fp32
    assert fp8.bytes_per_token == auto.bytes_per_token // 4
    assert int8.bytes_per_token == 2 * 4 * (2 * 32 + 2 * 4)           # one fp32 scale per token and head
    for fit in (auto, fp8, int8):
        assert fit.bytes_per_block == 16 * fit.bytes_per_token
        assert fit.num_blocks == budget // fit.bytes_per_block
    assert cache_fit("fp8", torch.bfloat16, cfg, 16, budget).num_blocks == 2 * cache_fit(
        "auto", torch.bfloat16, cfg, 16, budget).num_blocks


def test_compare_greedy_stops_at_the_first_disagreement():
    ref = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 5.0, 0.0])]
    got = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0.0, 3.5, 0.0]), torch.tensor([9.0, 9.0, 9.0])]
    cmp = compare_greedy([2, 0, 1], ref, [2, 1, 0], got)
    assert cmp.agree == 1 and cmp.total == 3
    assert cmp.step_errors == [0.0, 3.5]          # the third step saw different text: not counted
    assert cmp.max_error == 3.5 and cmp.mean_error == 1.75
    assert cmp.step_kl[0] == 0.0 and cmp.step_kl[1] > 0.5
    same = compare_greedy([2, 0, 1], ref, [2, 0, 1], ref)
    assert (same.agree, same.max_error, max(same.step_kl)) == (3, 0.0, 0.0)


@pytest.fixture(scope="module")
def llm():
    with LLM(None, enforce_eager=True, num_kv_blocks=64) as engine:
        yield engine


def measure(llm, dtype: str, tokens: int = 16):
    e = llm.engine
    ids = e.tokenizer.encode(PROMPT, add_special_tokens=False)
    return measure_kv_cache_dtype(e.model, e.model_config, e.dtype, e.device, ids, dtype, tokens,
                                  e.config.block_size, 1 << 22)


def test_the_unquantized_run_is_the_engines_own_greedy_run(llm):
    ref = measure(llm, "auto")
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0]
    assert ref.ref_token_ids == list(out.token_ids)
    assert ref.token_ids == ref.ref_token_ids and ref.max_abs_logit_error == 0.0 and ref.blocks_gained == 1.0


def test_an_8_bit_cache_errs_a_little_and_per_token_scales_err_less(llm):
    fp8, e5m2, int8 = (measure(llm, d) for d in ("fp8_e4m3", "fp8_e5m2", "int8_per_token_head"))
    for m in (fp8, e5m2, int8):
        assert 0 < m.max_abs_logit_error < 5 and m.max_kl < 1
        assert m.step_errors[0] == 0.0           # the prompt's pass reads fresh keys, not the cache
        assert m.step_errors[1] > 0              # the first decode step reads it back, rounded
        assert m.greedy_total == 16 and m.ref_token_ids == fp8.ref_token_ids
    assert fp8.blocks_gained == e5m2.blocks_gained == 4.0          # fp32 model: 4 bytes to 1
    assert 3 < int8.blocks_gained < 4                              # its scales take some room
    # 3 mantissa bits (e4m3) round less than 2 (e5m2); a scale per token and head less than either
    assert int8.max_abs_logit_error < fp8.max_abs_logit_error < e5m2.max_abs_logit_error
    assert int8.greedy_agree >= fp8.greedy_agree


def test_the_engines_cache_is_left_as_it_was(llm):
    llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))
    layers = [m for m in llm.engine.model.modules() if isinstance(m, PagedAttention)]
    before = [(m.k_cache, m.v_cache, m.kv_format, m.k_cache.clone()) for m in layers]
    measure(llm, "int8_per_token_head")
    for m, (k, v, fmt, k_copy) in zip(layers, before):
        assert m.k_cache is k and m.v_cache is v and m.kv_format is fmt and m.k_scales is None
        assert torch.equal(m.k_cache, k_copy)


def test_the_probe_runs_its_own_modules_beside_a_compiled_engine():
    """A compiled decode reads the engine's attention modules without guards on them, so the
    probe must never rebind them: it runs modules of its own (sharing only the weights), and
    the engine's tokens after a probe equal those of a fresh run."""
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    with LLM(None, cpu_compile=True, num_kv_blocks=64, enable_prefix_caching=False) as llm:
        assert llm.engine.plan.decode.startswith("compiled")
        fresh = llm.generate([PROMPT], greedy)[0].outputs[0].token_ids
        layers = [m for m in llm.engine.model.modules() if isinstance(m, PagedAttention)]
        bound = [(m.k_cache, m.v_cache, m.kv_format) for m in layers]
        ran = []   # the attention modules that ran while the probe measured
        hooks = [m.register_forward_pre_hook(lambda module, _: ran.append(module)) for m in layers]
        try:
            result = measure(llm, "int8_per_token_head")
        finally:
            for h in hooks:
                h.remove()
        assert result.greedy_total == 16 and result.max_abs_logit_error > 0
        assert ran and not any(m in layers for m in ran), "the probe ran the engine's own attention modules"
        assert all(m.k_cache is k and m.v_cache is v and m.kv_format is f for m, (k, v, f) in zip(layers, bound))
        assert llm.generate([PROMPT], greedy)[0].outputs[0].token_ids == fresh


def test_kv_quant_command_on_the_live_server(server):
    learner = Client(server.ws)
    try:
        hello = learner.until(lambda e: e["type"] == "hello")
        reply = learner.ok("kv_quant", prompt=PROMPT, kv_cache_dtype="fp8", max_tokens=8)
        assert reply["type"] == "kv_quant" and reply["prompt"] == PROMPT   # and schema-checked by the client
        model, engine = hello["model"], hello["engine"]
        budget = engine["num_blocks"] * engine["block_size"] * model["kv_bytes_per_token"]
        per_token_8bit = 2 * model["num_layers"] * model["num_kv_heads"] * model["head_dim"]
        assert reply["budget_bytes"] == budget and reply["auto"]["num_blocks"] == engine["num_blocks"]
        assert reply["quantized"]["num_blocks"] == budget // (per_token_8bit * engine["block_size"])
        assert reply["blocks_gained"] == pytest.approx(model["dtype_bytes"])
        assert reply["greedy_total"] == 8 and reply["max_abs_logit_error"] > 0
        assert server.engine.block_manager.num_free_blocks == server.num_blocks   # no request, no block
        refused = learner.call("kv_quant", prompt="word " * 400, kv_cache_dtype="fp8")
        assert refused["type"] == "error" and refused["code"] == "prompt_too_long"
        both = learner.call("kv_quant", prompt="a", prompt_token_ids=[1], kv_cache_dtype="fp8")
        assert both["type"] == "error" and "exactly one" in both["message"]
        auto = learner.call("kv_quant", prompt="a", kv_cache_dtype="auto")
        assert auto["type"] == "error" and auto["code"] == "invalid_field"
    finally:
        learner.close()
