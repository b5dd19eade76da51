"""`kvscope bench spec`: speculative decoding on the same requests as the plain engine —
acceptance rate, tokens per target pass, wall time and speed-up, for a prompt that repeats
itself (prompt lookup thrives) and a free-form one, for each drafter given."""
from __future__ import annotations

import argparse
import json
import statistics
import time

from kvscope.sampling_params import SamplingParams

FREE_FORM = "Once upon a time, a little fox found a shiny stone near the river. She"
# the same opening again after the model's own continuation of it: the retelling can be
# looked up in the prompt almost token for token
REPETITIVE = (FREE_FORM + " was kind, and she loved telling jokes. One sunny morning, Omar and Oscar went to the "
              "river to play with her new paint box. They saw cool clear water and smooth stones.\n\nThen the "
              "wind began to blow, and the sky turned gray. Soon it began to rain very hard.\n\n" + FREE_FORM)
WORKLOADS = {"repetitive": REPETITIVE, "free-form": FREE_FORM}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kvscope.server.cli_args import json_object
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--speculative-config", type=json_object, action="append", default=None,
                   help="a drafter to compare (repeatable); default: n-gram k=3 and the shipped draft model k=3")
    p.add_argument("--output-len", type=int, default=96)
    p.add_argument("--batch", type=int, default=1, help="copies of each prompt run together")
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(run=run)


def default_configs() -> list[dict]:
    from kvscope.default_model import DEFAULT_DRAFT_NAME, default_draft_path
    configs = [{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}]
    if default_draft_path() is not None:
        configs.append({"model": DEFAULT_DRAFT_NAME, "num_speculative_tokens": 3})
    return configs


def timed_run(engine, prompt: str, n: int, batch: int) -> tuple[float, list[list[int]]]:
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    seqs = [engine.add_request(prompt, params) for _ in range(batch)]
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start, [s.output_token_ids for s in seqs]


def measure(engine, prompt: str, args) -> tuple[float, list[list[int]]]:
    timed_run(engine, prompt, 4, 1)       # warm-up
    times, tokens = [], None
    for _ in range(args.repeats):
        if engine.speculator is not None:
            engine.speculator.total.__init__()
        engine.block_manager.enable_prefix_caching = False   # every repeat recomputes its prompt
        elapsed, tokens = timed_run(engine, prompt, args.output_len, args.batch)
        times.append(elapsed)
    return statistics.median(times), tokens


def run(args) -> int:
    from kvscope.engine import LLMEngine
    configs = args.speculative_config or default_configs()
    base = LLMEngine(model=args.model, device=args.device, dtype=args.dtype)
    print(f"model {base.model_config.name}, device {base.device}, dtype {str(base.dtype).removeprefix('torch.')}, "
          f"greedy, {args.output_len} output tokens x batch {args.batch}, median of {args.repeats}")
    plain = {name: measure(base, prompt, args) for name, prompt in WORKLOADS.items()}
    for name, (t, _) in plain.items():
        print(f"  plain        {name:10s}  {t * 1e3:8.1f} ms  {args.output_len * args.batch / t:7.1f} tok/s")
    for cfg in configs:
        engine = LLMEngine(model=args.model, device=args.device, dtype=args.dtype, speculative_config=cfg)
        label = cfg.get("method") if not cfg.get("model") else "draft-model"
        for name, prompt in WORKLOADS.items():
            t, tokens = measure(engine, prompt, args)
            s = engine.speculator.total
            same = "same tokens" if tokens == plain[name][1] else "TOKENS DIFFER"
            print(f"  {label:11s}  {name:10s}  {t * 1e3:8.1f} ms  {args.output_len * args.batch / t:7.1f} tok/s  "
                  f"speed-up {plain[name][0] / t:4.2f}x  acceptance {s.acceptance_rate:5.1%}  "
                  f"tokens/target pass {s.tokens_per_pass:4.2f}  ({same})  {json.dumps(cfg)}")
    return 0
