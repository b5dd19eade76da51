"""`kvscope serve --attach URL [--kv-events ENDPOINT]`: check the vLLM server, then serve
the explainer drawing it. A bad URL is one line on stderr and exit code 2."""
from __future__ import annotations

import sys

from kvscope.server.attach.probe import AttachError, probe


def serve_attached(args) -> int:
    import uvicorn

    from kvscope.server.attach.app import create_attach_app
    from kvscope.server.attach.service import AttachService
    from kvscope.server.main import KEEP_ALIVE_S, WS_MAX_FRAME, server_config_from_args
    try:
        server = probe(args.attach, args.kv_events)
    except AttachError as exc:
        print(f"kvscope: {exc}", file=sys.stderr)
        return 2
    service = AttachService(server, server_config_from_args(args), args.kv_events)
    cfg = service.config
    url = f"http://{'localhost' if cfg.host in ('127.0.0.1', '::1') else cfg.host}:{cfg.port}"
    print(f"kvscope: attached to vLLM {server.version} at {server.url}: {server.model}; "
          f"{server.num_blocks} KV blocks of {server.block_size}; prefix caching "
          f"{'on' if server.enable_prefix_caching else 'off'}")
    print(f"kvscope: KV events: {service.kv_events_note()}")
    print(f"kvscope: serving {url}  (no engine of its own: prompts go to vLLM's /v1/completions)")
    print(f"kvscope: instructor token: {cfg.instructor_token}")
    uvicorn.Server(uvicorn.Config(create_attach_app(service), host=cfg.host, port=cfg.port,
                                  log_level=args.log_level, ws_max_size=WS_MAX_FRAME,
                                  ws_per_message_deflate=False, ws_ping_interval=20, ws_ping_timeout=20,
                                  timeout_keep_alive=KEEP_ALIVE_S)).run()
    return 0
