"""A throughput sweep (chapter 20): how it counts against the limits and runs, once for both services."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kvscope.instrumentation.observer import RequestLabel
from kvscope.sampling_params import SamplingParams

# the story prompts a sweep (and the instructor's inject) cycles through, each request with its own seed
SYNTHETIC_PROMPTS = [
    "Once upon a time, a little fox found a shiny stone by the river.",
    "The old lighthouse keeper climbed the stairs every evening and",
    "Mia wanted to bake a cake for her grandmother, so she",
    "In a small village by the sea, there lived a curious cat named",
    "Tom looked out of the window and saw that the snow had",
    "The robot woke up in the empty garden and wondered why",
    "Every morning the baker opened his shop and the first customer was",
    "A tiny dragon who was afraid of fire asked the wise owl",
]
SWEEP_PAUSE_S = 0.5   # between two levels of a sweep: a recording's runs are told apart by this gap


def sweep_requests(level: int) -> int:
    """Requests a sweep level runs: two rounds of its concurrency, at least 4 (for a TTFT percentile)."""
    return max(4, 2 * level)


@dataclass
class Sweep:
    """A sweep in progress: one request of its learner's limit, its top level reserved in the learners' share."""
    owner: str
    top: int
    request_ids: set[str] = field(default_factory=set)


class SweepAccounts:
    """The sweeps in progress (`sweeps`, by owner) and the in-flight counts the learner limits read."""
    sweeps: dict[str, Sweep]

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
        """The levels one after the other, a short pause between; the caller registered it in `sweeps`."""
        try:
            for i, level in enumerate(levels):
                if sweep.owner not in self.hub.viewers:
                    return
                if i:
                    await asyncio.sleep(SWEEP_PAUSE_S)
                await self.measure(sweep, level, sweep_requests(level), max_tokens)
        finally:
            self.sweeps.pop(sweep.owner, None)

    async def measure(self, sweep: Sweep, concurrency: int, total: int, max_tokens: int) -> None:
        """One level: `concurrency` requests in flight, the next added as one finishes, none once the owner left."""
        prompt_ids = await self.sweep_prompt_ids()
        numbers = iter(range(total))

        async def worker():
            for i in numbers:   # one iterator shared by the workers: each number is taken once
                if sweep.owner not in self.hub.viewers:
                    return
                k = i % len(SYNTHETIC_PROMPTS)
                params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, seed=i, ignore_eos=True)
                rid = self.new_request_id()
                sweep.request_ids.add(rid)
                await self.run_sweep_request(rid, prompt_ids[k], params, RequestLabel(owner=sweep.owner,
                                                                                     prompt=SYNTHETIC_PROMPTS[k]))
        await asyncio.gather(*(worker() for _ in range(concurrency)))
