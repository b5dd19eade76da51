"""One attached vLLM server and its pools, one per data-parallel rank, numbered across servers."""
from __future__ import annotations

from dataclasses import dataclass, field

from kvscope.server.attach.kv_pool import AttachedPool
from kvscope.server.attach.kv_subscriber import KVSubscriber
from kvscope.server.attach.probe import KVEventSource, VllmServer
from kvscope.server.attach.vllm_client import VllmClient

EVENT_NOTES = {
    "waiting": "waiting for the first KV event from {endpoint}",
    "live": "subscribed to {endpoint}",
    "silent": "no answer from the KV-event publisher at {endpoint}: is the port open to this machine? "
              "(the other pools keep working; this one is retried every few seconds)",
}


@dataclass
class RankPool:
    """One data-parallel rank's pool, mirrored from its KV events."""
    index: int                        # the `pool` number in events
    replica: "Replica"
    rank: int
    source: KVEventSource | None
    mirror: AttachedPool | None = None
    subscriber: KVSubscriber | None = None
    events: str = "off"               # off (no KV events configured), waiting, live, silent
    figures: dict = field(default_factory=dict)   # this rank's share of the server's /metrics

    @property
    def name(self) -> str:
        r = self.replica
        return f"server {r.index + 1}" + (f" rank {self.rank}" if r.server.data_parallel_size > 1 else "")

    def events_note(self, hint: str) -> str:
        if self.source is None:
            return hint
        note = EVENT_NOTES[self.events].format(endpoint=self.source.endpoint)
        replay = self.source.replay_endpoint
        return note + (f" (replay {replay})" if replay and self.events == "live" else "")

    def stop(self) -> None:
        if self.subscriber is not None:
            self.subscriber.stop()
            self.subscriber = None

    def describe(self) -> dict:
        """This pool in hello.deployment.pools."""
        s = self.replica.server
        return {"pool": self.index, "name": self.name, "server": self.replica.index, "rank": self.rank,
                "url": s.url, "num_blocks": s.num_blocks, "block_size": s.block_size,
                "kv_events": self.source.endpoint if self.source else None}

    def state(self, hint: str) -> dict:
        """This pool in engine.vllm.pools."""
        return {"pool": self.index, "name": self.name, "connected": self.replica.connected,
                "events": self.events, "events_note": self.events_note(hint), "metrics": self.figures}


class Replica:
    """One vLLM server: its facts, its HTTP client, whether it answers, its ranks' pools."""

    def __init__(self, index: int, server: VllmServer, first_pool: int):
        self.index, self.server = index, server
        self.client = VllmClient(server.url, server.model)
        self.connected = True
        self.sample = None        # the last /metrics scrape, per rank ({rank: Sample})
        self.sample_t = 0.0
        self.pools = [RankPool(first_pool + rank, self, rank, source, events="waiting" if source else "off")
                      for rank, source in enumerate(server.kv_events or [None])]

    def describe(self) -> dict:
        """This server in hello.deployment.servers."""
        s = self.server
        return {"server": self.index, "url": s.url, "version": s.version, "model": s.model,
                "block_size": s.block_size, "num_blocks": s.num_blocks,
                "data_parallel_size": s.data_parallel_size, "pools": [p.index for p in self.pools]}
