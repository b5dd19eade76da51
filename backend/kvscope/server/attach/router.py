"""Where a learner's prompt goes when kvscope is attached to several pools (servers, or the
data-parallel ranks of one): the explainer's demonstration of what a cache-aware router
decides. Three policies, the instructor's pick:

- round_robin: the next pool in turn;
- least_loaded: the pool with the fewest requests running and waiting (vLLM's /metrics,
  plus those kvscope sent and has not heard back about);
- prefix: the pool holding the longest cached prefix of the prompt, scored as llm-d's
  KV-cache-aware scorer does (llm-d-kv-cache-manager, pkg/kvcache/kvblock_scorer.go,
  `LongestPrefixScorer`): a pool scores the number of the prompt's blocks it holds
  consecutively from the first block on; the first block it lacks ends its count. Ties go
  to the least loaded pool, then the lowest number (llm-d adds a load scorer's weight to
  the same end).

The scores come from the KV events alone (each pool's mirror), so they are exactly what a
router subscribed to the same events would know."""
from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("round_robin", "least_loaded", "prefix")
POLICY_NAMES = {"round_robin": "round robin", "least_loaded": "least loaded", "prefix": "longest cached prefix"}


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
        if self.policy == "round_robin":
            ordered = sorted(up, key=lambda c: c.pool)
            pick = next((c for c in ordered if c.pool >= self._turn), ordered[0])
            self._turn = pick.pool + 1
            return pick.pool
        if self.policy == "least_loaded":
            return min(up, key=lambda c: (c.load, c.pool)).pool
        return min(up, key=lambda c: (-c.matched_blocks, c.load, c.pool)).pool
