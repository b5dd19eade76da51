"""`kvscope serve`: load the model chosen at start-up, start the engine thread, serve."""
from __future__ import annotations

import argparse

from kvscope.server.cli_args import CPU_DEFAULT_KV_BLOCKS, add_serve_arguments, flag_fields
from kvscope.server.config import ServerConfig


def engine_from_args(args):
    from kvscope.config import EngineConfig
    from kvscope.engine.plan import resolve_device
    from kvscope.engine.llm_engine import LLMEngine
    blocks = args.num_kv_blocks
    if blocks is None and args.kv_cache_mib is None and resolve_device(args.device).type == "cpu":
        blocks = CPU_DEFAULT_KV_BLOCKS
    memory = None if args.kv_cache_mib is None else args.kv_cache_mib << 20
    return LLMEngine(EngineConfig(**{**flag_fields(EngineConfig, args), "num_kv_blocks": blocks,
                                     "kv_cache_memory_bytes": memory}))


def build_app(args):
    from kvscope.server.app import create_app
    from kvscope.server.service.engine_service import EngineService
    service = EngineService(engine_from_args(args), ServerConfig.from_args(args))
    return create_app(service), service


def serve(args: argparse.Namespace) -> int:
    if getattr(args, "attach", None):
        from kvscope.server.attach.main import serve_attached
        return serve_attached(args)
    from kvscope.engine.plan import resolve_device
    from kvscope.server.app import run
    if args.cpu_compile and resolve_device(args.device).type == "cpu":
        print("kvscope: compiling the decode step for this CPU (10-35 s the first time for a small model, "
              "over 2 minutes for a 28-layer 0.6B one; inductor's cache makes later starts faster; "
              "--no-cpu-compile skips it)", flush=True)
    app, service = build_app(args)
    cfg, url = service.config, service.config.url
    hello = service.hello
    print(f"kvscope: {hello['model']['name']} ({hello['model']['num_params']:,} parameters, {hello['model']['dtype']}) "
          f"on {hello['device']['name']}; KV cache {hello['engine']['kv_cache']}, blocks of {hello['engine']['block_size']}; "
          f"decode {hello['engine']['decode']}")
    print(f"kvscope: serving {url}  (WebSocket {url.replace('http', 'ws')}/ws, OpenAI API {url}/v1)")
    print(f"kvscope: instructor token: {cfg.instructor_token}   console: {url}/console?token={cfg.instructor_token}")
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"kvscope: listening on {cfg.host}: anyone who can reach this address can use the engine")
    run(app, cfg, args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvscope serve")
    add_serve_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
