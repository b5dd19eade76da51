"""Throughput and batch-1 of two checkouts on the same machine, separate processes alternated.

    python scripts/compare_commits.py BASE_TREE NEW_TREE [--rounds 3] [--model shape:m30 ...]

Each round runs, for every model, a throughput workload (64 requests, prompts 16-256 and
outputs 16-256 tokens, EOS ignored, seeded) and a batch-1 one (a 128-token prompt, 128 tokens
out) in each tree in turn; the order flips every round, so a machine that slows down over the
run favours neither. Each figure is the process's CPU time on one thread, the decode step
compiled (the benches' default), after a warm-up generation: steadier than wall time on a
shared machine. Uses only the Python API (`LLM.generate`), which both checkouts share."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = r"""
import json, random, statistics, sys, time
import torch
torch.set_num_threads(1)
from kvscope import LLM, SamplingParams
from kvscope.config import EngineConfig
model, kind = sys.argv[1], sys.argv[2]
load_format = "auto"
if model.startswith("shape:"):
    try:
        from kvscope.bench.shapes import resolve
    except ImportError:       # before the benchmarks moved into kvscope/bench/
        from kvscope.bench_shapes import resolve
    model, load_format = resolve(model, "auto")
compiled = {"cpu_compile": True} if "cpu_compile" in EngineConfig.__dataclass_fields__ else {"enforce_eager": False}
llm = LLM(model, load_format=load_format, device="cpu", dtype="float32", **compiled)
vocab = 2000
rng = random.Random(0)
def params(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
llm.generate([[rng.randrange(vocab) for _ in range(64)]] * 4, params(16))   # warm-up
if kind == "throughput":
    lens = [(rng.randint(16, 256), rng.randint(16, 256)) for _ in range(64)]
    prompts = [[rng.randrange(vocab) for _ in range(p)] for p, _ in lens]
    start = time.process_time()
    outs = llm.generate(prompts, [params(o) for _, o in lens])
    seconds = time.process_time() - start
    print(json.dumps(sum(len(o.outputs[0].token_ids) for o in outs) / seconds))
else:
    prompt = [rng.randrange(vocab) for _ in range(128)]
    runs = []
    for _ in range(3):
        start = time.process_time()
        llm.generate([prompt], params(128))
        runs.append((time.process_time() - start) / 128 * 1000)
    print(json.dumps(statistics.median(runs)))
"""


def run(tree: str, model: str, kind: str) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.join(tree, "backend"), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE, model, kind], env=env, capture_output=True, text=True,
                         cwd=tree)
    if out.returncode:
        sys.exit(f"{kind} of {model} in {tree} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", action="append", help="default: the embedded model and shape:m30")
    ap.add_argument("--kind", action="append", choices=["throughput", "batch1"], help="default: both")
    args = ap.parse_args()
    models = args.model or ["backend/kvscope/assets/kvscope-mini", "shape:m30"]
    units = {"throughput": "tok/s of CPU time", "batch1": "ms of CPU time a token"}
    kinds = {kind: units[kind] for kind in args.kind or units}
    results: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        trees = (args.base, args.new) if r % 2 == 0 else (args.new, args.base)
        for model in models:
            for kind in kinds:
                for tree in trees:
                    value = run(tree, model, kind)
                    results.setdefault((model, kind, tree), []).append(value)
                    print(f"round {r + 1} {model} {kind} {tree}: {value:.3f}", flush=True)
    print("\nmedians (new/base: throughput higher is better, ms a token lower is better)")
    for model in models:
        for kind, unit in kinds.items():
            base = statistics.median(results[(model, kind, args.base)])
            new = statistics.median(results[(model, kind, args.new)])
            print(f"{model:38s} {kind:10s} base {base:9.3f}  new {new:9.3f} {unit}  new/base {new / base:.3f}")


if __name__ == "__main__":
    main()
