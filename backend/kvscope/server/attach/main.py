"""`kvscope serve --attach URL [--kv-events ENDPOINT]`: check the vLLM server, then serve
the explainer drawing it. A bad URL is one line on stderr and exit code 2."""
from __future__ import annotations

import sys

from kvscope.server.attach.probe import AttachError, probe


def serve_attached(args) -> int:
    from kvscope.server.app import run
    from kvscope.server.attach.app import create_attach_app
    from kvscope.server.attach.service import AttachService
    from kvscope.server.config import ServerConfig
    try:
        server = probe(args.attach, args.kv_events)
    except AttachError as exc:
        print(f"kvscope: {exc}", file=sys.stderr)
        return 2
    service = AttachService(server, ServerConfig.from_args(args), args.kv_events)
    cfg, url = service.config, service.config.url
    print(f"kvscope: attached to vLLM {server.version} at {server.url}: {server.model}; "
          f"{server.num_blocks} KV blocks of {server.block_size}; prefix caching "
          f"{'on' if server.enable_prefix_caching else 'off'}")
    print(f"kvscope: KV events: {service.kv_events_note()}")
    print(f"kvscope: serving {url}  (no engine of its own: prompts go to vLLM's /v1/completions)")
    print(f"kvscope: instructor token: {cfg.instructor_token}")
    run(create_attach_app(service), cfg, args.log_level)
    return 0
