"""Server settings: where it listens, who is an instructor, and what learners may do."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Limits:
    """What a learner (no instructor token) may do; stated in every refusal."""
    max_prompt_tokens: int = 512
    max_prompt_chars: int = 8000
    max_tokens: int = 256
    submits_per_minute: float = 20
    messages_per_second: float = 50
    max_frame_bytes: int = 64 * 1024
    max_active_requests: int = 4            # in flight per learner
    max_learner_requests: int | None = None # in flight across all learners (default: half of --max-num-seqs)
    max_sweep_in_flight: int = 32           # a learner's sweep's top level, within the learners' share (0: no sweeps)
    hold_timeout_s: float = 300             # a learner's held request untouched this long is cancelled
    max_watched_prompt_tokens: int = 256    # a learner may watch requests with prompts up to this long
    max_watches: int = 2                    # requests one learner may watch at once
    max_watched_layers_x_heads: int = 4096


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    instructor_token: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    limits: Limits = field(default_factory=Limits)
    rest_requests_per_minute: float = 120   # per caller (learner id or address), /api and /v1 together
    rest_class_requests_per_minute: float = 1200   # all limited REST callers together
    limit_loopback: bool = False            # loopback REST callers (a local script) are not rate-limited
    max_body_bytes: int = 256 * 1024        # REST and OpenAI request bodies
    max_pending_events: int = 512           # a viewer's queued display events before coalescing
    max_pending_bytes: int = 8 << 20        # a viewer this far behind on its own events is closed (1013)
    max_frame_out_bytes: int = 1 << 20      # one outgoing frame joins queued events up to about this size
    min_frame_interval: float = 0.1         # display-only frames at most 10/s per viewer
    max_watched_requests: int = 8
    recordings_dir: Path = Path("recordings")
    frontend_dir: Path | None = None
    extra_origins: tuple[str, ...] = ()
    extra_hosts: tuple[str, ...] = ()       # Host names besides loopback, IP addresses and --host

    @classmethod
    def from_args(cls, args) -> ServerConfig:
        """The settings the `kvscope serve` flags (cli_args.py) give, with or without --attach."""
        if args.max_watched_requests < 0:
            raise ValueError(f"--max-watched-requests must be >= 0, got {args.max_watched_requests}")
        config = cls(
            host=args.host, port=args.port,
            limits=Limits(max_tokens=args.learner_max_tokens, max_prompt_tokens=args.learner_max_prompt_tokens,
                          max_prompt_chars=args.learner_max_prompt_chars,
                          max_active_requests=args.learner_max_active_requests,
                          max_learner_requests=args.max_learner_requests, hold_timeout_s=args.hold_timeout,
                          max_sweep_in_flight=args.learner_max_sweep_in_flight,
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

    @property
    def url(self) -> str:
        return f"http://{'localhost' if self.host in ('127.0.0.1', '::1') else self.host}:{self.port}"
