"""Where a learner's prompt goes among several attached pools, by the instructor's policy:
round_robin, least_loaded (running and waiting) or prefix (llm-d's `LongestPrefixScorer`: the
prompt's blocks a pool holds from the first on, ties to the least loaded); pools still tied take
turns. The scores come from the KV events alone, as a router subscribed to them would know."""
from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("round_robin", "least_loaded", "prefix")


@dataclass
class Candidate:
    pool: int
    matched_blocks: int
    load: int
    up: bool


class Router:
    def __init__(self, policy: str = "prefix"):
        self.policy = policy
        self._turn = 0

    def choose(self, candidates: list[Candidate]) -> int | None:
        """The chosen pool's number; None when no pool answers."""
        up = [c for c in candidates if c.up]
        if not up:
            return None
        rank = {"round_robin": lambda c: 0, "least_loaded": lambda c: c.load,
                "prefix": lambda c: (-c.matched_blocks, c.load)}[self.policy]
        best = min(rank(c) for c in up)
        return self._in_turn([c.pool for c in up if rank(c) == best])

    def _in_turn(self, pools: list[int]) -> int:
        """The first of `pools` at or after the turn (wrapping round); the turn moves past it."""
        ordered = sorted(pools)
        pick = next((p for p in ordered if p >= self._turn), ordered[0])
        self._turn = pick + 1
        return pick
