"""One connected page: its subscriptions and its outgoing queue, where display events coalesce when it falls
behind and essential ones never drop; a page that does not read is closed (1013)."""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from kvscope.server.config import ServerConfig
from kvscope.server.classroom.ratelimit import TokenBucket, per_minute


@dataclass(frozen=True)
class Filter:
    request_ids: frozenset[str] | None = None
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None

    @classmethod
    def parse(cls, raw: dict | None) -> "Filter":
        raw = raw or {}

        def as_set(v):
            return None if v is None else frozenset(v if isinstance(v, list) else [v])
        return cls(as_set(raw.get("request_id")), as_set(raw.get("layer")), as_set(raw.get("head")))

    @property
    def is_open(self) -> bool:
        return self.request_ids is None and self.layers is None and self.heads is None

    def admits(self, event: dict) -> bool:
        rid = event.get("request_id")
        if self.request_ids is not None and rid is not None and rid not in self.request_ids:
            return False
        return not (self.layers is not None and event["type"] == "attention" and event["layer"] not in self.layers)

    def as_dict(self) -> dict:
        named = {"request_id": self.request_ids, "layer": self.layers, "head": self.heads}
        return {key: sorted(value) for key, value in named.items() if value is not None}


@dataclass
class Chunk:
    """Serialised events: comma-joined JSON texts or one binary frame; `kv`/`memory` count coalescible ones."""
    text: str | bytes
    count: int
    essential: bool
    kv: int = 0
    memory: int = 0
    size: int = field(init=False)   # bytes on the wire

    def __post_init__(self):
        ascii_or_binary = isinstance(self.text, bytes) or self.text.isascii()
        self.size = len(self.text) if ascii_or_binary else len(self.text.encode("utf-8", "surrogatepass"))

    @property
    def binary(self) -> bool:
        return isinstance(self.text, bytes)


class Viewer:
    def __init__(self, viewer_id: str, peer: str, config: ServerConfig, role: str = "learner"):
        self.id, self.peer, self.role = viewer_id, peer, role
        self.config = config
        self.connected_at = time.monotonic()
        self.families: dict[str, Filter] = {}
        self.active: set[str] = set()          # its own requests still in flight
        self.sandbox = None                    # created on first use
        self.pending: deque[Chunk] = deque()
        self.display_count = 0
        self.essential_count = 0
        self.pending_bytes = 0
        self.dropped = 0
        self.need_kv = self.need_memory = False
        self.overflowed = False
        self.on_overflow = None                # called once when the queue outgrows max_pending_bytes
        self.wake = asyncio.Event()
        limits = config.limits
        self.messages = TokenBucket(limits.messages_per_second, 2 * limits.messages_per_second)
        self.submits = per_minute(limits.submits_per_minute)
        self.signature: tuple[str, ...] = ()   # families with no filter: viewers sharing one share frames
        self.filtered = False

    @property
    def is_instructor(self) -> bool:
        return self.role == "instructor"

    def subscribe(self, families: list[str], flt: Filter) -> None:
        for f in families:
            self.families[f] = flt
        self._resign()

    def unsubscribe(self, families: list[str]) -> None:
        for f in families:
            self.families.pop(f, None)
        self._resign()

    def _resign(self) -> None:
        self.signature = tuple(sorted(f for f, flt in self.families.items() if flt.is_open))
        self.filtered = any(not flt.is_open for flt in self.families.values())

    def offer(self, chunk: Chunk) -> int:
        """Queue a chunk; returns display events dropped to make room."""
        if self.overflowed:   # closing: nothing more is queued for it
            return 0
        self.pending.append(chunk)
        self.pending_bytes += chunk.size
        dropped = 0
        if chunk.essential:
            self.essential_count += chunk.count
        else:
            self.display_count += chunk.count
        if self.display_count > self.config.max_pending_events or self.pending_bytes > self.config.max_pending_bytes:
            dropped = self._coalesce()
        if self.pending_bytes > self.config.max_pending_bytes:
            self.overflowed = True
            self.pending.clear()
            self.pending_bytes = self.essential_count = 0
            if self.on_overflow is not None:
                self.on_overflow()
        self.wake.set()
        return dropped

    def _coalesce(self) -> int:
        kept: deque[Chunk] = deque()
        dropped = 0
        for c in self.pending:
            if c.essential:
                kept.append(c)
                continue
            self.need_kv |= c.kv > 0
            self.need_memory |= c.memory > 0
            dropped += c.count - c.kv - c.memory
        self.pending, self.display_count = kept, 0
        self.pending_bytes = sum(c.size for c in kept)
        self.dropped += dropped
        return dropped

    def take_frame(self, snapshots) -> tuple[str | bytes | None, bool]:
        """One frame up to about max_frame_out_bytes (a binary one alone) and whether it held essential events."""
        texts, count, essential, size = [], 0, False, 0
        for kind, needed in (("kv", self.need_kv), ("memory", self.need_memory)):
            if needed:
                for text in snapshots(kind):   # attached to several pools: one kv snapshot each
                    texts.append(text)
                    count += 1
        self.need_kv = self.need_memory = False
        while self.pending and (not texts or size + self.pending[0].size <= self.config.max_frame_out_bytes):
            if self.pending[0].binary and texts:
                break   # a binary frame goes alone, after the texts queued before it
            c = self.pending.popleft()
            texts.append(c.text)
            count += c.count
            size += c.size
            essential |= c.essential
            self.pending_bytes -= c.size
            if c.essential:
                self.essential_count -= c.count
            else:
                self.display_count -= c.count
            if c.binary:
                break
        if self.pending:
            self.wake.set()   # more to send
        if not texts:
            return None, False
        if isinstance(texts[0], bytes) or count == 1:
            return texts[0], essential
        return "[" + ",".join(texts) + "]", essential

    def summary(self) -> dict:
        return {"client_id": self.id, "role": self.role, "peer": self.peer,
                "connected_s": round(time.monotonic() - self.connected_at, 3),
                "families": sorted(self.families), "pending": self.display_count + self.essential_count,
                "dropped": self.dropped, "active_requests": len(self.active)}
