"""`kvscope serve --attach URL ...`: check every vLLM server, then serve; bad input is one line, exit 2."""
from __future__ import annotations

import sys

from kvscope.server.attach.probe import AttachError, VllmServer, normalized_url, probe


def probe_all(urls: list[str], kv_events: str | None) -> list[VllmServer]:
    """Every server, or why they cannot be drawn together: one model, one block size (pools count in blocks)."""
    seen = [normalized_url(u) for u in urls]
    if len(set(seen)) != len(seen):
        raise AttachError(f"--attach names the same server twice ({', '.join(seen)})")
    if kv_events and len(urls) > 1:
        raise AttachError("--kv-events names one server's endpoint; with several --attach URLs "
                          "each server's own /kv_event_sources is used")
    servers = [probe(u, kv_events) for u in urls]
    first = servers[0]
    for s in servers[1:]:
        if s.model != first.model:
            raise AttachError(f"{s.url} serves {s.model!r} but {first.url} serves {first.model!r}: a router sends a "
                              f"prompt to replicas of one model; attach each model from its own kvscope")
        if s.block_size != first.block_size:
            raise AttachError(f"{s.url} stores blocks of {s.block_size} tokens but {first.url} blocks of "
                              f"{first.block_size}: pools and prefix scores count in blocks, so they are drawn "
                              f"together only with one --block-size; attach each from its own kvscope")
    return servers


def serve_attached(args) -> int:
    from kvscope.server.app import create_app, run
    from kvscope.server.attach.service import AttachService
    from kvscope.server.config import ServerConfig
    try:
        servers = probe_all(args.attach, args.kv_events)
    except AttachError as exc:
        print(f"kvscope: {exc}", file=sys.stderr)
        return 2
    service = AttachService(servers, ServerConfig.from_args(args), args.kv_events)
    cfg, url = service.config, service.config.url
    for server in servers:
        print(f"kvscope: attached to vLLM {server.version} at {server.url}: {server.model}; "
              f"{server.num_blocks} KV blocks of {server.block_size}"
              f"{f' on each of {server.data_parallel_size} data-parallel ranks' if server.data_parallel_size > 1 else ''}"
              f"; prefix caching {'on' if server.enable_prefix_caching else 'off'}")
    print(f"kvscope: KV events: {service.kv_events_note()}")
    if len(service.pools) > 1:
        print(f"kvscope: {len(service.pools)} pools; prompts from the pages are routed by "
              f"'{service.router.policy}' (the instructor picks another in chapter 16)")
    print(f"kvscope: serving {url}  (no engine of its own: prompts go to vLLM's /v1/completions)")
    print(f"kvscope: instructor token: {cfg.instructor_token}")
    run(create_app(service, "kvscope (attached to vLLM)", engine_routes=False), cfg, args.log_level)
    return 0
