"""What instrumentation costs the engine, in CPU seconds (robust on a shared machine where
wall time is not): the throughput workload of `kvscope bench throughput`, one thread, with
instrumentation off, listening, and listening while watching the first request. Modes are
interleaved round by round; medians are printed.

    OMP_NUM_THREADS=1 python scripts/bench_instrumentation.py [--requests 32] [--rounds 5]

Run it with PYTHONPATH pointing at another checkout's backend/ to compare two versions.
"""
from __future__ import annotations

import argparse
import inspect
import statistics
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    opts = ap.parse_args()
    torch.set_num_threads(1)
    from kvscope.bench import commands as bench
    from kvscope.default_model import default_model_path
    from kvscope.engine import LLMEngine
    from kvscope.instrumentation import attach_for_bench

    engine = LLMEngine(model=default_model_path(), device="cpu", dtype="float32", num_threads=1)
    prompts, outputs = bench.make_workload(opts.requests, (16, 256), (16, 256), engine.model_config.vocab_size, 0)
    takes_watcher = "watcher" in inspect.signature(bench.run_kvscope).parameters

    def one(mode: str) -> float:
        instr = attach_for_bench(engine, mode)
        kw = {}
        if mode == "watch":
            kw = {"watcher": instr} if takes_watcher else {"watch_first": True}
        start = time.process_time()
        bench.run_kvscope(engine, prompts, outputs, **kw)
        spent = time.process_time() - start
        if instr is not None:
            instr.detach()
        engine.reset()
        return spent

    one("off")   # warm-up
    times = {m: [] for m in ("off", "listen", "watch")}
    for _ in range(opts.rounds):
        for mode in times:
            times[mode].append(one(mode))
    off = statistics.median(times["off"])
    for mode, values in times.items():
        med = statistics.median(values)
        print(f"{mode:6s} CPU {med:.2f} s (median of {len(values)}; runs {', '.join(f'{v:.2f}' for v in values)})"
              f"{'' if mode == 'off' else f'  {100 * (med / off - 1):+.1f} % vs off'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
