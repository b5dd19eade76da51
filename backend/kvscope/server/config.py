"""Server settings: where it listens, who is an instructor, and what learners may do."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.server.cli_args import flag_fields


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
    extra_origins: list[str] = field(default_factory=list)
    extra_hosts: list[str] = field(default_factory=list)   # Host names besides loopback, IP addresses and --host

    @classmethod
    def from_args(cls, args) -> ServerConfig:
        """The settings the `kvscope serve` flags give."""
        if args.max_watched_requests < 0:
            raise ValueError(f"--max-watched-requests must be >= 0, got {args.max_watched_requests}")
        return cls(**flag_fields(cls, args), limits=Limits(**flag_fields(Limits, args)))

    @property
    def url(self) -> str:
        return f"http://{'localhost' if self.host in ('127.0.0.1', '::1') else self.host}:{self.port}"
