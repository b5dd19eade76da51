"""What an 8-bit KV cache buys and costs, and what a grammar mask costs per token.

    python scripts/bench_kv_cache_dtype.py [--model PATH|shape:m30 ...] [--tokens 64]

For each model and kv_cache_dtype: blocks at the same KV budget, the largest and mean
logit error against the unquantized cache (greedy, step by step while both runs still
agree), greedy-token agreement over --tokens tokens, and decode throughput. Then, on the
first model, the time per token of a JSON-schema request against the same request free.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvscope import LLM, SamplingParams
from kvscope.bench.shapes import checkpoint
from kvscope.default_model import default_model_path
from kvscope.instrumentation.kv_quant_probe import compare_greedy
from kvscope.sampling_params import StructuredOutputsParams

DTYPES = ["auto", "fp8", "fp8_e5m2", "int8_per_token_head"]
BUDGET = 64 << 20


def prompts_for(llm: LLM, n: int) -> list[list[int]]:
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, min(vocab, 2000), (int(length),), generator=g).tolist()
            for length in torch.randint(24, 96, (n,), generator=g)]


def greedy_with_logits(llm: LLM, prompt: list[int], tokens: int):
    seen = []
    hook = llm.engine.model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out.float()))
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
    hook.remove()
    return out[0].outputs[0].token_ids, seen


def throughput(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts, params)   # warm up: the first run pays for allocations and thread start
    rates = []
    for _ in range(3):
        start = time.perf_counter()
        llm.generate(prompts, params)
        rates.append(len(prompts) * tokens / (time.perf_counter() - start))
    return statistics.median(rates)


def kv_rows(model: str, tokens: int) -> None:
    runs = {}
    for name in DTYPES:
        with LLM(model, kv_cache_dtype=name, kv_cache_memory_bytes=BUDGET, attention_backend="torch",
                 enforce_eager=True) as llm:
            prompts = prompts_for(llm, 16)
            per_prompt = [greedy_with_logits(llm, p, tokens) for p in prompts[:4]]
            runs[name] = (llm.engine.block_manager.num_blocks, per_prompt, throughput(llm, prompts, tokens))
    base_blocks, base_runs, base_tps = runs["auto"]
    print(f"\n{model}: {BUDGET >> 20} MiB of KV space, reference attention on every row")
    print(f"{'kv_cache_dtype':22} {'blocks':>7} {'gain':>6} {'max |dlogit|':>13} {'mean':>8} "
          f"{'greedy agree':>13} {'tok/s':>8} {'cost':>7}")
    for name, (blocks, per_prompt, tps) in runs.items():
        errors, agree, total = [], 0, 0
        for (ref_tokens, ref_logits), (got_tokens, got_logits) in zip(base_runs, per_prompt):
            cmp = compare_greedy(ref_tokens, ref_logits, got_tokens, got_logits)
            errors, agree, total = errors + cmp.step_errors, agree + cmp.agree, total + cmp.total
        print(f"{name:22} {blocks:7,} {blocks / base_blocks:5.2f}x {max(errors):13.4f} "
              f"{statistics.mean(errors):8.4f} {agree:6}/{total:<6} {tps:8.0f} {tps / base_tps - 1:+6.0%}")


def grammar_row(model: str, tokens: int) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    with LLM(model, enforce_eager=True) as llm:
        prompt = "Once upon a time"
        free = SamplingParams(temperature=1.0, seed=1, max_tokens=tokens, ignore_eos=True)
        bound = SamplingParams(temperature=1.0, seed=1, max_tokens=tokens, ignore_eos=True,
                               structured_outputs=StructuredOutputsParams(json=schema))
        llm.generate([prompt], bound)   # compile the grammar once, as a server would cache it
        per_token = {}
        for label, params in (("free", free), ("json schema", bound)):
            times = []
            for _ in range(5):
                start = time.perf_counter()
                out = llm.generate([prompt], params)[0].outputs[0]
                times.append((time.perf_counter() - start) / max(1, len(out.token_ids)))
            per_token[label] = statistics.median(times)
        print(f"\ngrammar mask, batch 1 ({model}): free {per_token['free'] * 1e3:.2f} ms/token, "
              f"json schema {per_token['json schema'] * 1e3:.2f} ms/token "
              f"(+{(per_token['json schema'] - per_token['free']) * 1e3:.2f} ms a token)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="checkpoint dir or shape:NAME (repeatable)")
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    models = [checkpoint(m) for m in (args.model or [default_model_path()])]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for model in models:
        kv_rows(model, args.tokens)
    grammar_row(models[0], args.tokens)


if __name__ == "__main__":
    main()
