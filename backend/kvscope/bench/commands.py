"""Benchmarks that print figures: `kvscope bench throughput` (nano-vllm's workload: random
prompts and output lengths, EOS ignored) and `kvscope bench latency` (batch 1), each run
against Hugging Face transformers' generate on the same model in the same process and, with
`--against vllm`, against vLLM in its own process (vllm_peer.py), runs alternated. The
machine's ceilings are measured first, and each engine's fraction of them printed."""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch

from kvscope.bench import cpu_ceilings, shapes, vllm_peer
from kvscope.config import ATTENTION_BACKENDS
from kvscope.heap import freeze_start_up, thaw
from kvscope.instrumentation.facts import model_facts
from kvscope.sampling_params import SamplingParams
from kvscope.server.cli_args import add_cpu_compile_argument


def add_bench_subcommands(bench: argparse.ArgumentParser) -> None:
    sub = bench.add_subparsers(dest="bench", required=True)
    tp = sub.add_parser("throughput", help="many random requests: output tokens/s vs transformers")
    _common(tp)
    tp.add_argument("--num-requests", type=int, default=None)
    tp.add_argument("--input-len", type=int, nargs=2, metavar=("MIN", "MAX"), default=None)
    tp.add_argument("--output-len", type=int, nargs=2, metavar=("MIN", "MAX"), default=None)
    tp.add_argument("--max-num-seqs", type=int, default=None)
    tp.add_argument("--max-num-batched-tokens", type=int, default=None)
    tp.add_argument("--hf-batch-size", type=int, nargs="+", default=None,
                    help="transformers' static batch size; several: each is run and the fastest compared")
    tp.add_argument("--repeats", type=int, default=1, help="alternate the two engines N times; report medians")
    tp.add_argument("--instrument", choices=["off", "listen", "watch"], default="off",
                    help="attach instrumentation: none, a listener, or a listener watching --watchers requests "
                         "(watch also runs off and listen, alternated, and prints all three)")
    tp.add_argument("--watchers", type=int, nargs="+", default=[1],
                    help="with --instrument watch: requests watched, each by a viewer of its own; several "
                         "counts run alternated in the same run (e.g. --watchers 1 32)")
    tp.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="kvscope's runs timed by the wall clock, or by this process's CPU time (steadier on a "
                         "shared machine; set OMP_NUM_THREADS=1 so idle threads' spinning is not counted)")
    tp.set_defaults(run=run_throughput)
    lat = sub.add_parser("latency", help="batch-1 time to first token and time per output token")
    _common(lat)
    lat.add_argument("--input-len", type=int, default=None)
    lat.add_argument("--output-len", type=int, default=128)
    lat.add_argument("--repeats", type=int, default=3, help="alternate the two engines N times; report medians")
    lat.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                     help="cpu: this process's CPU time, steadier than wall time on a shared machine")
    lat.set_defaults(run=run_latency)
    par = sub.add_parser("parallel", help="one request with n choices vs n separate requests: prefill and KV blocks")
    _common(par)
    par.add_argument("--n", type=int, default=4)
    par.add_argument("--input-len", type=int, default=200)
    par.add_argument("--output-len", type=int, default=64)
    par.set_defaults(run=run_parallel)
    from kvscope.bench.spec import add_arguments as add_spec_arguments
    add_spec_arguments(sub.add_parser("spec", help="speculative decoding: acceptance rate and speed-up"))
    from kvscope.bench.attention import add_arguments as add_attention_arguments
    add_attention_arguments(sub.add_parser("attention", help="decode attention: each backend's K/V read rate "
                                                             "against the device's bandwidth"))
    from kvscope.bench.tp import add_arguments as add_tp_arguments
    add_tp_arguments(sub.add_parser("tp", help="tensor parallel: step time for N processes vs one"))
    try:
        from kvscope.bench import serve as serve_bench
        serve = sub.add_parser("serve", help="load a running server with viewers and streaming requests")
        serve_bench.add_arguments(serve)
        serve.set_defaults(run=serve_bench.run)
    except ImportError:
        pass


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", default=None,
                   help="checkpoint dir, hub id or shape:NAME (random weights; NAME one of "
                        f"{', '.join(shapes.SHAPES)}); default: the embedded model. "
                        "Repeatable for `throughput`: each model runs the same workload in turn")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--enforce-eager", action="store_true")
    add_cpu_compile_argument(p)
    p.add_argument("--attention-backend", default="auto",
                   choices=ATTENTION_BACKENDS)
    p.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    p.add_argument("--against", choices=["vllm"], default=None,
                   help="also run vLLM (its CPU build on a CPU) on the same checkpoint and workload, "
                        "alternated with kvscope; shape:NAME models get their random weights written once")
    p.add_argument("--vllm-python", default=sys.executable,
                   help="the Python that has vLLM (default: this one; tests/run.sh makes "
                        "~/.cache/kvscope/vllm-venv/bin/python)")
    p.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV cache space; vLLM gets exactly kvscope's (default: kvscope's own choice)")
    p.add_argument("--block-size", type=int, default=None,
                   help="tokens per KV block (default: the engine's; 32 with --against vllm, whose CPU "
                        "attention needs a multiple of 32)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="the same on every engine (default off: each run computes its prompts)")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="the same on every engine")


# -- workload ------------------------------------------------------------------------------
def make_workload(n: int, input_len, output_len, vocab: int, seed: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*input_len))] for _ in range(n)]
    outputs = [rng.randint(*output_len) for _ in range(n)]
    return prompts, outputs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _engine(args, **overrides):
    from kvscope.engine import LLMEngine
    if "model" not in overrides:
        overrides["model"], overrides["load_format"] = _one_model(args)
    kw = dict(load_format=args.load_format, device=args.device, dtype=args.dtype,
              seed=args.seed, enforce_eager=args.enforce_eager, cpu_compile=args.cpu_compile,
              attention_backend=args.attention_backend, enable_prefix_caching=args.enable_prefix_caching,
              enable_chunked_prefill=args.enable_chunked_prefill,
              block_size=args.block_size or (32 if args.against == "vllm" else None),
              kv_cache_memory_bytes=None if args.kv_cache_gib is None else int(args.kv_cache_gib * 2**30))
    kw.update({k: v for k, v in overrides.items() if v is not None})
    return LLMEngine(**{k: v for k, v in kw.items() if v is not None})


def _one_model(args) -> tuple[str | None, str]:
    models = args.model or [None]
    if len(models) > 1:
        raise ValueError(f"`kvscope bench {args.bench}` takes one --model (only `throughput` takes several)")
    return _resolve_model(args, models[0])


def _resolve_model(args, model: str | None) -> tuple[str | None, str]:
    """(checkpoint, load format) for a --model value; against vLLM a shape:NAME becomes a
    checkpoint of seeded random weights written once, so every engine loads the same ones."""
    if args.against == "vllm":
        return shapes.checkpoint(model, args.seed), args.load_format
    return shapes.resolve(model, args.load_format)


def _settings_line(engine) -> str:
    plan, knobs = engine.plan, engine.knobs()
    chunk = f"on, {knobs['max_num_batched_tokens']} tokens a step" if knobs["enable_chunked_prefill"] else "off"
    return (f"settings (every engine): prefix caching {'on' if plan.enable_prefix_caching else 'off'}, "
            f"chunked prefill {chunk}, block size {plan.block_size}, at most {knobs['max_num_seqs']} sequences, "
            f"KV cache {plan.kv_cache_bytes / 2**20:,.0f} MiB, greedy, EOS ignored")


def _plan_phrase(plan) -> str:
    return (f"device {plan.device}, dtype {plan.dtype_name}, attention {plan.attention_backend}, "
            f"decode {plan.decode}")


def _start_ceilings(engine):
    """The CPU's ceilings, measured before any engine runs (None on a GPU)."""
    if engine.plan.device.type != "cpu":
        return None
    ceilings = cpu_ceilings.measure(engine.plan.dtype)
    print(ceilings.describe())
    return ceilings


def run_kvscope(engine, prompts, outputs, clock=time.perf_counter) -> dict:
    bm = engine.block_manager
    bm.reset_prefix_cache()   # each run computes its prompts, as transformers does
    hits_before = bm.num_prefix_hits
    seqs = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=o, ignore_eos=True))
            for p, o in zip(prompts, outputs)]
    peak_used, steps = 0, 0
    _sync(engine.device)
    start = clock()
    while engine.has_unfinished():
        engine.step()
        steps += 1
        peak_used = max(peak_used, bm.num_used_blocks)
    _sync(engine.device)
    elapsed = clock() - start
    generated = sum(s.num_output_tokens for s in seqs)
    return {"elapsed": elapsed, "generated": generated, "steps": steps, "peak_used_blocks": peak_used,
            "preemptions": sum(s.num_preemptions for s in seqs), "prefix_hits": bm.num_prefix_hits - hits_before,
            "failed": sum(s.finish_reason == "error" for s in seqs)}


def _instrument_modes(args) -> list[str]:
    """The runs --instrument asks for: watch runs off, listen and watch-N for each --watchers N."""
    if args.instrument != "watch":
        return [args.instrument]
    return ["off", "listen", *(f"watch-{n}" for n in args.watchers)]


def _instrumented(engine, prompts, outputs, mode: str, clock: str = "wall") -> dict:
    """One run with instrumentation `mode` (off, listen, watch-N) attached for it (kvscope.instrumentation.bench)."""
    from kvscope.instrumentation import attach_for_bench
    kind, _, watchers = mode.partition("-")
    instr = attach_for_bench(engine, kind, int(watchers or 0))
    try:
        return run_kvscope(engine, prompts, outputs, time.process_time if clock == "cpu" else time.perf_counter)
    finally:
        if instr is not None:
            instr.detach()


def _instrument_line(by_mode: dict[str, list[dict]], clock: str) -> str:
    rates = {m: _median(r)["generated"] / _median(r)["elapsed"] for m, r in by_mode.items()}
    off = rates["off"]
    parts = [f"{m} {r:,.0f} tok/s ({100 * r / off:.0f}%)"
             for m, r in rates.items()]
    return (f"instrumentation (same run, alternated, medians of {len(by_mode['off'])}, {clock} clock): "
            + ", ".join(parts))


def hf_model_like(engine):
    """transformers' model for the same checkpoint (random weights for a dummy engine)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    path = str(engine.model_path)
    if engine.config.load_format == "dummy":
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    else:
        model = AutoModelForCausalLM.from_pretrained(path)
    # cast after loading: the dtype keyword differs between transformers 4 and 5
    return model.to(device=engine.device, dtype=engine.dtype).eval()


@torch.inference_mode()
def run_hf_static(model, prompts, outputs, batch_size: int, device) -> dict:
    """Static batches: left-padded prompts, every row decodes until the batch's longest output."""
    _sync(device)
    start = time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        batch, outs = prompts[i:i + batch_size], outputs[i:i + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(batch):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        n = max(outs)
        model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0, eos_token_id=None)
    _sync(device)
    return {"elapsed": time.perf_counter() - start, "generated": sum(outputs)}


def kv_read_bytes(prompts, outputs, bytes_per_token: int) -> float:
    """K/V a run reads while decoding: each output token attends to its prompt and, on
    average, half of its own output."""
    return sum(o * (len(p) + o / 2) for p, o in zip(prompts, outputs)) * bytes_per_token


def roofline_tokens_per_s(engine, prompts, outputs, concurrency: int) -> float:
    """Upper bound from memory bandwidth alone: every decode step reads all weights once
    (shared by the batch) plus each sequence's KV cache."""
    from kvscope.hardware import device_spec
    cfg = engine.model_config
    spec = device_spec(engine.plan.device)
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    kv_per_token = engine.plan.kv_format.bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    total_out = sum(outputs)
    steps = total_out / max(1, min(concurrency, len(prompts)))
    kv_read = kv_read_bytes(prompts, outputs, kv_per_token)
    seconds = (steps * weights + kv_read) / spec.peak_bandwidth_bytes_per_s
    return total_out / seconds, spec


def _defaults(args, engine_device_is_gpu: bool) -> None:
    gpu = engine_device_is_gpu
    args.num_requests = args.num_requests or (256 if gpu else 64)
    args.input_len = args.input_len or ([100, 1024] if gpu else [16, 256])
    args.output_len = args.output_len or ([100, 1024] if gpu else [16, 256])
    args.max_num_seqs = args.max_num_seqs or (256 if gpu else 64)
    args.max_num_batched_tokens = args.max_num_batched_tokens or (16384 if gpu else 2048)
    args.hf_batch_size = args.hf_batch_size or [64 if gpu else 16]


def run_throughput(args) -> int:
    """One run over every --model given (the same workload for each), then a summary."""
    gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    _defaults(args, gpu)
    if args.against == "vllm":
        vllm_peer.find_vllm(args.vllm_python)   # before anything loads: a missing vLLM is one message
    models = args.model or [None]
    rows = []
    for i, model in enumerate(models):
        if i:
            print()
        rows.append(_throughput_one(args, model))
    if len(rows) > 1:
        print("\nsummary (same workload, alternated runs, medians):")
        for row in rows:
            print("  " + "  ".join(f"{k} {v}" for k, v in row.items()))
    return 0


def _throughput_one(args, model_arg: str | None) -> dict:
    model_path, load_format = _resolve_model(args, model_arg)
    against_vllm = args.against == "vllm"
    max_len = args.input_len[1] + args.output_len[1] if against_vllm else None   # vLLM sizes its pool by it
    engine = _engine(args, model=model_path, load_format=load_format, max_num_seqs=args.max_num_seqs,
                     max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=max_len)
    prompts, outputs = make_workload(args.num_requests, args.input_len, args.output_len,
                                     engine.model_config.vocab_size, args.seed)
    print(f"workload: {len(prompts)} requests, prompts {args.input_len[0]}-{args.input_len[1]} tokens, "
          f"outputs {args.output_len[0]}-{args.output_len[1]} tokens (EOS ignored)")
    label = model_arg or engine.model_config.name
    print(f"model: {label} ({engine.model_config.architecture}, {model_facts(engine).num_params / 1e6:.1f}M "
          f"parameters), {_plan_phrase(engine.plan)}, {cpu_ceilings.threads_phrase()}")
    print(_settings_line(engine))
    ceilings = _start_ceilings(engine)
    # --instrument watch runs all three, alternated, so their figures share the machine's load
    modes = _instrument_modes(args)
    peer = vllm_peer.start(engine, max_len, args) if against_vllm else None
    try:
        # warm-up. A GPU's first pass over the workload is slower by a factor of three or more
        # (Triton compiling each kernel variant, the caching allocator growing): it runs whole
        if engine.device.type == "cuda":
            _instrumented(engine, prompts, outputs, modes[-1])
        else:
            _instrumented(engine, prompts[:4], [4] * 4, modes[-1])
        if peer is not None:
            # vLLM's engine core is still settling when it says ready: a first timed kvscope
            # run beside it once measured 0.09x of what the next two measured
            peer.throughput(prompts[:4], [4] * 4)
        freeze_start_up()   # as the server does once started: timed runs see the collector it runs with
        model = None if args.no_hf else hf_model_like(engine)
        if model is not None:
            run_hf_static(model, prompts[:2], [2, 2], 2, engine.device)   # warm-up
        by_mode, vllm_runs, hf_runs = {m: [] for m in modes}, [], {size: [] for size in args.hf_batch_size}
        for _ in range(max(1, args.repeats)):   # alternated, so every engine sees the same machine load
            for mode in modes:
                by_mode[mode].append(_instrumented(engine, prompts, outputs, mode, args.clock))
            if peer is not None:
                vllm_runs.append(peer.throughput(prompts, outputs))
            if model is not None:
                for size, runs in hf_runs.items():
                    runs.append(run_hf_static(model, prompts, outputs, size, engine.device))
    finally:
        thaw()
        if peer is not None:
            peer.close()
    if args.clock == "cpu" and (peer is not None or model is not None):
        print("note: only kvscope's runs are timed by CPU time; transformers and vLLM by the wall clock")
    ours_runs = by_mode[modes[-1]]
    ours = _median(ours_runs)
    ours_rate = ours["generated"] / ours["elapsed"]
    runs = f", median of {len(ours_runs)}" if len(ours_runs) > 1 else ""
    runs += ", cpu clock" if args.clock == "cpu" else ""
    if len(modes) > 1:
        print(_instrument_line(by_mode, args.clock))
    print(f"kvscope: {ours['generated']} output tokens in {ours['elapsed']:.2f} s = {ours_rate:,.0f} tok/s "
          f"({ours['steps']} steps, {ours['preemptions']} preemptions, {ours['failed']} failed, "
          f"{ours['prefix_hits']} prefix-cache blocks reused, "
          f"instrumentation {modes[-1]}{runs})")
    print(f"kv cache: peak {ours['peak_used_blocks']}/{engine.plan.num_blocks} blocks used "
          f"(budget {engine.plan.kv_cache_bytes / 2**20:.1f} MiB, never exceeded: preallocated)")
    row = {"model": label, "kvscope": f"{ours_rate:,.0f} tok/s"}
    rates = {"kvscope": ours_rate}
    if peer is not None:
        theirs = _median(vllm_runs)
        rates["vLLM"] = theirs["generated"] / theirs["elapsed"]
        print(f"vLLM {peer.version}: {theirs['generated']} output tokens in {theirs['elapsed']:.2f} s = "
              f"{rates['vLLM']:,.0f} tok/s{runs}")
        print(f"kvscope / vLLM: {ours_rate / rates['vLLM']:.2f}x")
        row |= {"vLLM": f"{rates['vLLM']:,.0f} tok/s", "kvscope/vLLM": f"{ours_rate / rates['vLLM']:.2f}x"}
    if model is not None:
        medians = {size: _median(r) for size, r in hf_runs.items()}
        for size, hf in medians.items():
            print(f"transformers generate (static batches of {size}): {hf['generated']} output "
                  f"tokens in {hf['elapsed']:.2f} s = {hf['generated'] / hf['elapsed']:,.0f} tok/s{runs}")
        best = min(medians, key=lambda size: medians[size]["elapsed"])
        hf_rate = medians[best]["generated"] / medians[best]["elapsed"]
        rates["transformers"] = hf_rate
        vs = f" (vs transformers' fastest batch size here, {best})" if len(medians) > 1 else ""
        print(f"speed-up: {ours_rate / hf_rate:.2f}x{vs}")
        row |= {"transformers": f"{hf_rate:,.0f} tok/s", "speed-up": f"{ours_rate / hf_rate:.2f}x"}
    roof, spec = roofline_tokens_per_s(engine, prompts, outputs, args.max_num_seqs)
    print(f"bandwidth roofline: {roof:,.0f} tok/s at {spec.peak_bandwidth_bytes_per_s / 1e9:,.0f} GB/s "
          f"({spec.bandwidth_source}, {spec.name}); kvscope reaches {100 * ours_rate / roof:.1f}%")
    facts = model_facts(engine)
    kv_read = kv_read_bytes(prompts, outputs, facts.kv_bytes_per_token)
    computed = sum(len(p) for p in prompts) + sum(outputs)
    flops = 2 * facts.read_weight_bytes / facts.dtype_bytes * computed
    if ceilings is not None:
        # the least any engine could take: decode steps of the whole batch, every prompt computed once
        ideal_steps = sum(outputs) / max(1, min(args.max_num_seqs, len(prompts)))
        seconds, bound = ceilings.limit_seconds(ideal_steps * facts.read_weight_bytes + kv_read, flops)
        limit = sum(outputs) / seconds
        print(_roofline_line(f"{limit:,.0f} tok/s", bound, {k: r / limit for k, r in rates.items()}))
        row["roofline"] = " ".join(f"{k} {100 * r / limit:.0f}%" for k, r in rates.items())
    lines = cpu_ceilings.report(engine, ours["elapsed"], ours["steps"] * facts.read_weight_bytes + kv_read,
                                flops, ceilings)
    for line in lines[1:]:
        print(line)
    if lines:
        row["ceilings"] = lines[-1].removeprefix("achieved: ")
    return row


def _median(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["elapsed"])[len(runs) // 2]


def _roofline_line(limit: str, bound: str, fractions: dict[str, float]) -> str:
    reached = ", ".join(f"{name} {100 * f:.0f}%" for name, f in fractions.items())
    return f"roofline for this workload (measured ceilings): {limit}, {bound}; reached: {reached}"


def run_latency(args) -> int:
    gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    args.input_len = args.input_len or (512 if gpu else 128)
    if args.against == "vllm":
        vllm_peer.find_vllm(args.vllm_python)   # before anything loads: a missing vLLM is one message
    max_len = args.input_len + args.output_len + args.repeats + 1 if args.against == "vllm" else None
    engine = _engine(args, max_num_seqs=8, max_model_len=max_len)
    prompts, _ = make_workload(1, (args.input_len, args.input_len), (1, 1), engine.model_config.vocab_size, args.seed)
    prompt, n = prompts[0], args.output_len
    print(f"batch 1: prompt {len(prompt)} tokens, {n} output tokens; model {engine.model_config.name}, "
          f"{_plan_phrase(engine.plan)}, {cpu_ceilings.threads_phrase()}")
    print(_settings_line(engine))
    ceilings = _start_ceilings(engine)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    peer = vllm_peer.start(engine, max_len, args) if args.against == "vllm" else None
    if peer is not None and args.clock == "cpu":
        print("note: vLLM runs in other processes; its times are wall-clock whatever --clock says")
    times = {"kvscope": [], "vLLM": [], "transformers": []}
    try:
        run_kvscope(engine, [prompt[:8]], [4])   # warm-up
        model = None if args.no_hf else hf_model_like(engine)
        for r in range(args.repeats):   # alternated, so every engine sees the same machine load
            vocab = engine.model_config.vocab_size
            fresh = [(t + r + 1) % vocab for t in prompt]   # a new prompt each time: no prefix-cache hits
            times["kvscope"].append(_kvscope_latency(engine, fresh, n, clock))
            if peer is not None:
                times["vLLM"].append(peer.latency(fresh, n))
            if model is not None:
                times["transformers"].append(_hf_latency(model, prompt, n, engine.device, clock))
    finally:
        if peer is not None:
            peer.close()
    medians = {name: (statistics.median(t for t, _ in runs), statistics.median(p for _, p in runs))
               for name, runs in times.items() if runs}
    ttft, tpot = medians["kvscope"]
    print(f"kvscope: TTFT {1e3 * ttft:.2f} ms, time per output token {1e3 * tpot:.3f} ms "
          f"({1 / tpot:,.0f} tok/s, {args.clock} clock, median of {args.repeats})")
    if peer is not None:
        v_ttft, v_tpot = medians["vLLM"]
        print(f"vLLM {peer.version}: TTFT {1e3 * v_ttft:.2f} ms, time per output token {1e3 * v_tpot:.3f} ms "
              f"({1 / v_tpot:,.0f} tok/s; one token then {n}, the difference)")
        print(f"kvscope / vLLM decode speed: {v_tpot / tpot:.2f}x")
    if "transformers" in medians:
        hf_ttft, hf_tpot = medians["transformers"]
        print(f"transformers generate: TTFT {1e3 * hf_ttft:.2f} ms, time per output token {1e3 * hf_tpot:.3f} ms "
              f"({1 / hf_tpot:,.0f} tok/s)")
        print(f"decode speed-up: {hf_tpot / tpot:.2f}x")
    facts = model_facts(engine)
    per_token = facts.read_weight_bytes + (len(prompt) + n / 2) * facts.kv_bytes_per_token
    flops = 2 * facts.read_weight_bytes / facts.dtype_bytes
    if ceilings is not None:
        seconds, bound = ceilings.limit_seconds(per_token, flops)
        print(_roofline_line(f"{1e3 * seconds:.3f} ms per output token", bound,
                             {name: seconds / p for name, (_, p) in medians.items()}))
    for line in cpu_ceilings.report(engine, tpot, per_token, flops, ceilings)[1:]:
        print(line)
    return 0


def _kvscope_latency(engine, prompt, n, clock):
    seq = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    _sync(engine.device)
    start = clock()
    first = None
    while engine.has_unfinished():
        engine.step()
        if first is None and seq.num_output_tokens:
            _sync(engine.device)
            first = clock()
    _sync(engine.device)
    end = clock()
    return first - start, (end - first) / max(1, n - 1)


@torch.inference_mode()
def _hf_latency(model, prompt, n, device, clock):
    """One measurement: generate 1 token (TTFT), then n; the difference is the decode time."""
    ids = torch.tensor([prompt], device=device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, eos_token_id=None)
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)   # warm-up
    _sync(device)
    t = clock()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
    _sync(device)
    ttft = clock() - t
    t = clock()
    model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
    _sync(device)
    return ttft, (clock() - t - ttft) / max(1, n - 1)


def run_parallel(args) -> int:
    """The same n samples of one prompt, on a fresh engine each time (prefix caching off, so
    only the fork shares): as one request with n choices, and as n separate requests."""
    from kvscope.engine.llm_engine import EngineObserver

    class PromptTokens(EngineObserver):
        computed = 0

        def on_step(self, record):
            for e in record.scheduled.entries:
                self.computed += max(0, min(e.start + e.num_new_tokens, e.seq.num_prompt_tokens) - e.start)

    print(f"{args.n} samples of a {args.input_len}-token prompt, {args.output_len} tokens each (EOS ignored)")
    together = SamplingParams(temperature=1.0, seed=args.seed, max_tokens=args.output_len, ignore_eos=True, n=args.n)
    for label, params in ((f"one request, n={args.n}", [together]),
                          (f"{args.n} separate requests", [together.for_choice(i) for i in range(args.n)])):
        engine = _engine(args, enable_prefix_caching=False, max_num_seqs=max(8, args.n))
        counter = PromptTokens()
        engine.add_observer(counter)
        prompt = make_workload(1, (args.input_len,) * 2, (1, 1), engine.model_config.vocab_size, args.seed)[0][0]
        for p in params:
            engine.add_request(prompt, p)
        peak, start = 0, time.perf_counter()
        while engine.has_unfinished():
            engine.step()
            peak = max(peak, engine.block_manager.num_used_blocks)
        print(f"{label}: {counter.computed} prompt tokens computed, peak {peak} KV blocks held, "
              f"{engine.block_manager.num_copies} copy-on-write copies, {time.perf_counter() - start:.2f} s")
    return 0
