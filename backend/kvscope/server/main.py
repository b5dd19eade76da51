"""`kvscope serve`: load the model chosen at start-up, start the engine thread, serve."""
from __future__ import annotations

import argparse
from pathlib import Path

from kvscope.server.cli_args import CPU_DEFAULT_KV_BLOCKS, add_serve_arguments
from kvscope.server.config import Limits, ServerConfig

WS_MAX_FRAME = 1 << 20   # larger frames are closed by the protocol; up to this, refused with an error
KEEP_ALIVE_S = 75          # idle keep-alive connections: see the uvicorn call below


def engine_from_args(args):
    from kvscope.config import EngineConfig
    from kvscope.engine.plan import resolve_device
    from kvscope.engine.llm_engine import LLMEngine
    blocks = args.num_kv_blocks
    if blocks is None and args.kv_cache_mib is None and resolve_device(args.device).type == "cpu":
        blocks = CPU_DEFAULT_KV_BLOCKS
    return LLMEngine(EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, load_format=args.load_format, seed=args.seed,
        block_size=args.block_size, num_kv_blocks=blocks,
        kv_cache_memory_bytes=None if args.kv_cache_mib is None else args.kv_cache_mib << 20,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, prefill_chunk_size=args.prefill_chunk_size,
        kv_cache_dtype=args.kv_cache_dtype,
        attention_backend=args.attention_backend, num_threads=args.threads,
        enforce_eager=args.enforce_eager, cpu_compile=args.cpu_compile,
        speculative_config=args.speculative_config, tensor_parallel_size=args.tensor_parallel_size,
        structured_outputs_config=args.structured_outputs_config))


def server_config_from_args(args) -> ServerConfig:
    if args.max_watched_requests < 0:
        raise ValueError(f"--max-watched-requests must be >= 0, got {args.max_watched_requests}")
    config = ServerConfig(
        host=args.host, port=args.port,
        limits=Limits(max_tokens=args.learner_max_tokens, max_prompt_tokens=args.learner_max_prompt_tokens,
                      max_prompt_chars=args.learner_max_prompt_chars,
                      max_active_requests=args.learner_max_active_requests,
                      max_learner_requests=args.max_learner_requests, hold_timeout_s=args.hold_timeout,
                      messages_per_second=args.learner_messages_per_second,
                      max_watched_prompt_tokens=args.max_watched_prompt_tokens,
                      submits_per_minute=args.learner_submits_per_minute),
        rest_requests_per_minute=args.rest_requests_per_minute, limit_loopback=args.limit_loopback,
        rest_class_requests_per_minute=args.rest_class_requests_per_minute,
        max_body_bytes=args.max_body_bytes, max_pending_bytes=args.max_pending_bytes,
        recordings_dir=Path(args.recordings_dir),
        frontend_dir=Path(args.frontend_dir) if args.frontend_dir else None,
        extra_origins=tuple(args.allow_origin), extra_hosts=tuple(args.allow_host),
        max_watched_requests=args.max_watched_requests)
    if args.instructor_token:
        config.instructor_token = args.instructor_token
    return config


def build_app(args):
    """(app, service) from parsed serve arguments."""
    from kvscope.server.app import create_app
    from kvscope.server.service import EngineService
    service = EngineService(engine_from_args(args), server_config_from_args(args))
    return create_app(service), service


def serve(args: argparse.Namespace) -> int:
    if getattr(args, "attach", None):
        from kvscope.server.attach.main import serve_attached
        return serve_attached(args)
    import uvicorn

    from kvscope.engine.plan import resolve_device
    if args.cpu_compile and resolve_device(args.device).type == "cpu":
        print("kvscope: compiling the decode step for this CPU (10-35 s the first time for a small model, "
              "over 2 minutes for a 28-layer 0.6B one; inductor's cache makes later starts faster; "
              "--no-cpu-compile skips it)", flush=True)
    app, service = build_app(args)
    cfg = service.config
    url = f"http://{'localhost' if cfg.host in ('127.0.0.1', '::1') else cfg.host}:{cfg.port}"
    hello = service.hello
    print(f"kvscope: {hello['model']['name']} ({hello['model']['num_params']:,} parameters, {hello['model']['dtype']}) "
          f"on {hello['device']['name']}; KV cache {hello['engine']['kv_cache']}, blocks of {hello['engine']['block_size']}; "
          f"decode {hello['engine']['decode']}")
    print(f"kvscope: serving {url}  (WebSocket {url.replace('http', 'ws')}/ws, OpenAI API {url}/v1)")
    print(f"kvscope: instructor token: {cfg.instructor_token}   console: {url}/console?token={cfg.instructor_token}")
    if cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"kvscope: listening on {cfg.host}: anyone who can reach this address can use the engine")
    uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=args.log_level,
                                  ws_max_size=WS_MAX_FRAME, ws_per_message_deflate=False,
                                  ws_ping_interval=20, ws_ping_timeout=20,
                                  # Longer than clients' pool expiry (httpx: 5 s), so the client closes
                                  # an idle keep-alive connection first: with equal timeouts a request
                                  # sent as the server closes it is lost before the engine sees it.
                                  timeout_keep_alive=KEEP_ALIVE_S)).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvscope serve")
    add_serve_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
