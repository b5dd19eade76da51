"""Throughput and batch-1 of two checkouts, separate processes alternated, on the same machine.

    python scripts/compare_commits.py BASE_TREE NEW_TREE [--rounds 3] [--model shape:m30 ...]

Each round runs `kvscope bench throughput` and `kvscope bench latency` for every model in each
tree in turn (the order flips every round, so a machine that slows down over the run does not
favour one tree), on the wall clock (older checkouts have no `--clock`): run it on a quiet machine. Prints each run, then the medians
and NEW/BASE ratios (throughput: higher is better; time per token: lower is better)."""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

THROUGHPUT = re.compile(r"^kvscope: .*= ([\d,]+) tok/s", re.M)
PER_TOKEN = re.compile(r"^kvscope: .*time per output token ([\d.]+) ms", re.M)


def run(tree: str, bench: str, model: str, extra: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.join(tree, "backend")}
    cmd = [sys.executable, "-m", "kvscope.cli", "bench", bench, "--no-hf", "--model", model, *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    found = (THROUGHPUT if bench == "throughput" else PER_TOKEN).search(out.stdout)
    if out.returncode or not found:
        sys.exit(f"{' '.join(cmd)} in {tree} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return float(found.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", action="append", help="default: the embedded model and shape:m30")
    args = ap.parse_args()
    models = args.model or ["backend/kvscope/assets/kvscope-mini", "shape:m30"]
    benches = {"throughput": ["--repeats", "1"], "latency": ["--repeats", "3"]}
    results: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        trees = (args.base, args.new) if r % 2 == 0 else (args.new, args.base)
        for model in models:
            for bench, extra in benches.items():
                for tree in trees:
                    value = run(tree, bench, model, extra)
                    results.setdefault((model, bench, tree), []).append(value)
                    print(f"round {r + 1} {model} {bench} {tree}: {value}", flush=True)
    print("\nmedians (NEW/BASE: throughput higher is better, ms per token lower is better)")
    for model in models:
        for bench in benches:
            base = statistics.median(results[(model, bench, args.base)])
            new = statistics.median(results[(model, bench, args.new)])
            unit = "tok/s" if bench == "throughput" else "ms/token"
            print(f"{model:40s} {bench:10s} base {base:,.3f} {unit}  new {new:,.3f} {unit}  "
                  f"new/base {new / base:.3f}")


if __name__ == "__main__":
    main()
