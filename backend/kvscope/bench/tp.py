"""`kvscope bench tp`: step time with the model split over N processes against one, on the
same batch, and the bytes each step all-reduces (rank 0's count)."""
from __future__ import annotations

import argparse
import statistics
import time

from kvscope.sampling_params import SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--tensor-parallel-size", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="CPU threads per process")
    p.set_defaults(run=run)


def measure(engine, args) -> tuple[float, float, float]:
    """Median prefill step, median decode step (seconds), mean bytes all-reduced per decode step."""
    from kvscope.engine import EngineObserver

    class CommBytes(EngineObserver):   # each step record's bytes between ranks
        last = 0

        def on_step(self, record) -> None:
            self.last = record.comm_bytes

    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request([(7 * i + j) % vocab for j in range(args.input_len)], params)
    prefill, decode, comm = [], [], []
    listener = CommBytes()
    engine.add_observer(listener)
    try:
        while engine.has_unfinished():
            t = time.perf_counter()
            engine.step()
            elapsed = time.perf_counter() - t
            if engine.scheduler.num_steps == 1:
                prefill.append(elapsed)
            else:
                decode.append(elapsed)
                comm.append(listener.last)
    finally:
        engine.remove_observer(listener)
    return statistics.median(prefill), statistics.median(decode), statistics.mean(comm)


def run(args) -> int:
    from kvscope.engine import LLMEngine
    print(f"batch {args.batch} x {args.input_len} prompt tokens, {args.output_len} output tokens, greedy")
    for size in args.tensor_parallel_size:
        engine = LLMEngine(model=args.model, load_format=args.load_format, device=args.device, dtype=args.dtype,
                           tensor_parallel_size=size, num_threads=args.threads)
        try:
            measure(engine, argparse.Namespace(**{**vars(args), "batch": 1, "output_len": 4}))   # warm-up
            engine.scheduler.num_steps = 0
            prefill, decode, comm = measure(engine, args)
        finally:
            engine.shutdown()
        print(f"  tensor_parallel_size {size}: prefill step {prefill * 1e3:8.2f} ms, decode step "
              f"{decode * 1e3:7.2f} ms, all-reduced per decode step {comm / 1024:8.1f} KiB "
              f"({engine.model_config.name}, {engine.device}, {str(engine.dtype).removeprefix('torch.')})")
    return 0
