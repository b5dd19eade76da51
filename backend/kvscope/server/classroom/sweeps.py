"""A learner's throughput sweep (chapter 20): rising levels of requests in flight run one after
the other as one job. How it counts against the class's limits is decided here, once, for
both services that run sweeps (kvscope's own engine and an attached vLLM); each service
supplies `measure` (one level's run), `hub`, `config` and `learner_share`."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

SWEEP_PAUSE_S = 0.5   # between two levels of a sweep: a recording's runs are told apart by this gap


def sweep_requests(level: int) -> int:
    """Requests a sweep level runs: two rounds of its concurrency, at least 4 (for a TTFT percentile)."""
    return max(4, 2 * level)


@dataclass
class Sweep:
    """A measured sweep in progress. A learner's counts once against their in-flight limit,
    and its top level stays reserved in the learners' share from its start to its end."""
    owner: str
    top: int
    request_ids: set[str] = field(default_factory=set)


class SweepAccounts:
    """The sweeps in progress and the in-flight counts the learner limits read."""

    def __init__(self):
        self.sweeps: dict[str, Sweep] = {}       # by owner: one sweep per viewer at a time

    @property
    def sweep_cap(self) -> int:
        """The most requests a learner's sweep may keep in flight: its own limit, within the share."""
        return min(self.config.limits.max_sweep_in_flight, self.learner_share)

    def learner_requests(self) -> int:
        """Learners' requests in flight, a sweep counted at its top level for its whole run."""
        total = 0
        for v in self.hub.viewers.values():
            if not v.is_instructor:
                sweep = self.sweeps.get(v.id)
                total += len(v.active) if sweep is None else len(v.active - sweep.request_ids) + sweep.top
        return total

    def own_requests(self, viewer) -> int:
        """A viewer's requests in flight as its limit counts them: a sweep is one."""
        sweep = self.sweeps.get(viewer.id)
        return len(viewer.active) if sweep is None else len(viewer.active - sweep.request_ids) + 1

    async def sweep(self, sweep: Sweep, levels: list[int], max_tokens: int) -> None:
        """Throughput runs at rising concurrency, one level after the other (`sweep_requests`
        each), a short pause between levels. Registered in `sweeps` by the caller, until done."""
        try:
            for i, level in enumerate(levels):
                if sweep.owner not in self.hub.viewers:
                    return
                if i:
                    await asyncio.sleep(SWEEP_PAUSE_S)
                await self.measure(sweep, level, sweep_requests(level), max_tokens)
        finally:
            self.sweeps.pop(sweep.owner, None)
