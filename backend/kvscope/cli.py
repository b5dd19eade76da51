"""Command line: `kvscope generate`, `kvscope serve`, `kvscope bench`, `kvscope export-site`."""
from __future__ import annotations

import argparse
import shlex
import sys
import time


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: the embedded model)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")


def _generate_args(p: argparse.ArgumentParser) -> None:
    _engine_args(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--show-stats", action="store_true", help="print a stats line after the text")
    from kvscope.server.cli_args import add_decoding_arguments
    add_decoding_arguments(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvscope", description="A paged, batched LLM engine that explains itself")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_args(sub.add_parser("generate", help="generate a continuation of a prompt"))
    serve = sub.add_parser("serve", help="run the live server and the explainer pages")
    try:
        from kvscope.server.cli_args import add_serve_arguments
        add_serve_arguments(serve)
    except ImportError:
        serve.set_defaults(server_missing=True)
    export = sub.add_parser("export-site", help="write the whole book as static files (any static host, or file://)")
    export.add_argument("directory", help="folder to write the site into (created if missing)")
    bench = sub.add_parser("bench", help="benchmarks that print figures")
    from kvscope.bench.commands import add_bench_subcommands
    add_bench_subcommands(bench)
    return parser


def cmd_generate(args) -> int:
    from kvscope import LLM, SamplingParams
    from kvscope.llm import apply_chat_template
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, seed=args.seed, max_tokens=args.max_new_tokens)
    with LLM(args.model, device=args.device, dtype=args.dtype, speculative_config=args.speculative_config,
             tensor_parallel_size=args.tensor_parallel_size) as llm:
        prompt = apply_chat_template(llm.tokenizer, [{"role": "user", "content": args.prompt}]) \
            if args.chat else args.prompt
        start = time.perf_counter()
        out = llm.generate([prompt], params)[0]
        elapsed = time.perf_counter() - start
    choice = out.outputs[0]
    if choice.finish_reason == "error":
        raise ValueError(out.error)
    print(args.prompt + choice.text if not args.chat else choice.text)
    if args.show_stats:
        engine, plan = llm.engine, llm.engine.plan
        rate = len(choice.token_ids) / elapsed if elapsed > 0 else 0.0
        print(f"prompt_tokens={len(out.prompt_token_ids)} generated_tokens={len(choice.token_ids)} "
              f"elapsed_seconds={elapsed:.3f} tokens_per_second={rate:.1f} "
              f"device={plan.device} dtype={plan.dtype_name} dtype_reason={shlex.quote(plan.dtype_reason)} "
              f"decode={shlex.quote(plan.decode)}")
        if engine.speculator is not None:
            s = engine.speculator.total
            print(f"spec_proposed={s.proposed} spec_accepted={s.accepted} acceptance_rate={s.acceptance_rate:.3f} "
                  f"tokens_per_target_pass={s.tokens_per_pass:.2f}")
    return 0


def cmd_serve(args) -> int:
    if getattr(args, "server_missing", False):
        raise ValueError("the server needs the web extras: pip install 'kvscope[server]'")
    from kvscope.server.main import serve
    return serve(args) or 0


def cmd_export_site(args) -> int:
    from pathlib import Path

    from kvscope.server.pages import export_static_site
    out = export_static_site(Path(args.directory))
    print(f"kvscope: wrote the book to {out}; open {out / 'index.html'} or serve the folder with any static host")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kvscope.models.loader import ModelConfigError
    from kvscope.models.loader import ModelLoadError
    handlers = {"generate": cmd_generate, "serve": cmd_serve, "export-site": cmd_export_site,
                "bench": lambda a: a.run(a)}
    try:
        return handlers[args.command](args)
    except (ModelLoadError, ModelConfigError, ValueError) as exc:
        print(f"kvscope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
