"""`kvscope serve` arguments, importing nothing heavy: the CLI builds its parser without the web stack."""
from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from kvscope.config import ATTENTION_BACKENDS

CPU_DEFAULT_KV_BLOCKS = 1024   # a pool small enough to draw, big enough for a classroom


def flag_fields(kind, args: argparse.Namespace) -> dict:
    """The flags whose dest names a field of dataclass `kind`, as its keywords (None: the field's default)."""
    return {f.name: getattr(args, f.name) for f in fields(kind) if getattr(args, f.name, None) is not None}


def json_object(text: str) -> dict:
    """An argparse type: a JSON object such as --speculative-config '{"method": "ngram", ...}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def add_decoding_arguments(p: argparse.ArgumentParser) -> None:
    """--speculative-config and --tensor-parallel-size, shared by generate, serve and bench."""
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="processes splitting the model's weights and KV heads (gloo on CPU, NCCL on CUDA)")
    p.add_argument("--speculative-config", type=json_object, default=None,
                   help='vLLM\'s keys, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
                        '"prompt_lookup_max": 3}\' or \'{"model": "DIR", "num_speculative_tokens": 3}\'')


def add_cpu_compile_argument(p: argparse.ArgumentParser) -> None:
    """On by default for the long-lived commands (serve, bench); the Python API defaults off."""
    p.add_argument("--cpu-compile", action=argparse.BooleanOptionalAction, default=True,
                   help="compile decode steps on a CPU with torch.compile (about 2x faster decode for "
                        "small models, 10-15 %% for a 0.6B one; 10-35 s at start-up for a small model, "
                        "over 2 minutes for a 28-layer one the first time); --no-cpu-compile runs eagerly")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="checkpoint dir or hub id (default: the embedded kvscope-mini)")
    p.add_argument("--attach", default=None, nargs="+", metavar="URL",
                   help="draw running vLLM servers (e.g. http://127.0.0.1:8000) instead of loading a model: "
                        "their KV events (every data-parallel rank's pool), /metrics and OpenAI API feed the "
                        "pages; with several URLs, side by side, and prompts are routed between them (docs/vllm.md)")
    p.add_argument("--kv-events", default=None, metavar="ENDPOINT",
                   help="with one --attach URL: its rank 0's KV-event ZeroMQ endpoint (default: what its "
                        "/kv_event_sources says)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--instructor-token", default=None,
                   help="token for the instructor controls (default: a random one, printed at start-up)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help=f"KV blocks in the pool (default on CPU: {CPU_DEFAULT_KV_BLOCKS}; on GPU: from free memory)")
    p.add_argument("--kv-cache-mib", type=int, default=None, help="KV cache size instead of --num-kv-blocks")
    p.add_argument("--kv-cache-dtype", default="auto",
                   choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head"],
                   help="store K and V in 8 bits (vLLM's names); more blocks fit the same budget")
    p.add_argument("--structured-outputs-config", type=json_object, default={},
                   help='vLLM\'s keys, e.g. \'{"disable_any_whitespace": false}\' lets JSON outputs hold free '
                        'whitespace (kvscope compiles them compact by default)')
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--prefill-chunk-size", type=int, default=None)
    p.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS)
    p.add_argument("--enforce-eager", action="store_true")
    add_cpu_compile_argument(p)
    p.add_argument("--threads", dest="num_threads", type=int, default=None, help="CPU threads for the engine")
    add_decoding_arguments(p)
    # Each flag is named (dest) after its EngineConfig, ServerConfig or Limits field: see flag_fields.
    p.add_argument("--recordings-dir", type=Path, default=Path("recordings"), help="where record_start writes JSONL")
    p.add_argument("--frontend-dir", type=Path, default=None,
                   help="static front end (default: frontend/ in the checkout)")
    p.add_argument("--allow-origin", dest="extra_origins", action="append", default=[],
                   help="an extra WebSocket Origin to accept (repeatable), e.g. https://class.example.org")
    p.add_argument("--allow-host", dest="extra_hosts", action="append", default=[],
                   help="a Host name the server answers to (repeatable), e.g. class.example.org; loopback names, "
                        "IP addresses and --host always work (the check stops DNS rebinding)")
    p.add_argument("--max-watched-requests", type=int, default=8,
                   help="requests whose attention is captured at once (each costs engine time)")
    p.add_argument("--learner-max-tokens", dest="max_tokens", type=int, default=256)
    p.add_argument("--learner-max-prompt-tokens", dest="max_prompt_tokens", type=int, default=512)
    p.add_argument("--learner-submits-per-minute", dest="submits_per_minute", type=float, default=20)
    p.add_argument("--learner-max-active-requests", dest="max_active_requests", type=int, default=4,
                   help="requests in flight per learner")
    p.add_argument("--max-learner-requests", type=int, default=None,
                   help="requests in flight across all learners together (default: half of --max-num-seqs), "
                        "so learners never fill the engine")
    p.add_argument("--learner-max-sweep-in-flight", dest="max_sweep_in_flight", type=int, default=32,
                   help="requests a learner's throughput sweep may keep in flight at its top level, within "
                        "--max-learner-requests; the sweep counts as one request in flight (0: no learner sweeps)")
    p.add_argument("--hold-timeout", dest="hold_timeout_s", type=float, default=300,
                   help="seconds a learner's held request may sit untouched before it is cancelled")
    p.add_argument("--learner-messages-per-second", dest="messages_per_second", type=float, default=50,
                   help="WebSocket messages a second per learner connection")
    p.add_argument("--max-watched-prompt-tokens", type=int, default=256,
                   help="longest prompt whose attention a learner may watch (attention grows with its square)")
    p.add_argument("--max-pending-bytes", type=int, default=8 << 20,
                   help="bytes queued for one viewer before it is closed (1013) as not reading")
    p.add_argument("--learner-max-prompt-chars", dest="max_prompt_chars", type=int, default=8000,
                   help="characters in a learner's prompt, checked before tokenizing")
    p.add_argument("--rest-requests-per-minute", type=float, default=120,
                   help="REST/OpenAI prompts per minute per caller (learner id or address) without the token, "
                        "/api and /v1 together (0: unlimited)")
    p.add_argument("--rest-class-requests-per-minute", type=float, default=1200,
                   help="REST/OpenAI prompts per minute from all limited callers together (0: unlimited)")
    p.add_argument("--limit-loopback", action="store_true",
                   help="rate-limit REST/OpenAI callers on this machine too (default: loopback is not limited)")
    p.add_argument("--max-body-bytes", type=int, default=256 * 1024, help="largest REST/OpenAI request body")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
