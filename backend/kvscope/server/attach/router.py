"""Where a learner's prompt goes when kvscope is attached to several pools (servers, or the
data-parallel ranks of one): the explainer's demonstration of what a cache-aware router
decides. Three policies, the instructor's pick:

- round_robin: the next pool in turn;
- least_loaded: the pool with the fewest requests running and waiting (vLLM's /metrics,
  or those kvscope sent and has not heard back about, whichever is more);
- prefix: the pool holding the longest cached prefix of the prompt, scored as llm-d's
  KV-cache-aware scorer does (llm-d-kv-cache-manager, pkg/kvcache/kvblock_scorer.go,
  `LongestPrefixScorer`): a pool scores the number of the prompt's blocks it holds
  consecutively from the first block on; the first block it lacks ends its count. Ties go
  to the least loaded pool (llm-d adds a load scorer's weight to the same end).

Pools still tied are taken in turn, so prompts nobody has cached spread over the pools
instead of all landing on the first.

The scores come from the KV events alone (each pool's mirror), so they are exactly what a
router subscribed to the same events would know."""
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
