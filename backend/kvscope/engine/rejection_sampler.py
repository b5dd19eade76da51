"""Verification of drafted tokens against the target model (speculative sampling).

The target scored the last known token and the k drafts in one pass, giving k + 1 rows of
logits. Draft i is accepted with probability min(1, p(d) / q(d)), p being the target's and q
the drafter's distribution at that position; at the first rejection a token is drawn from
the normalised residual max(0, p − q), and if all k are accepted the last row gives a bonus
token from p. The output then follows the target's distribution exactly. Greedy requests
accept a draft exactly when it is the target's argmax, so they produce the target's tokens.
A drafter without probabilities (n-gram lookup) proposes deterministically: q is one-hot.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.engine.sampler import filtered_logits
from kvscope.sampling_params import SamplingParams


@dataclass
class DraftCheck:
    """How one draft fared, for the explainer: target and draft probability and the draw."""
    token_id: int
    p: float
    q: float
    u: float | None        # the uniform draw compared with p/q (None for greedy)
    accepted: bool


@dataclass
class SpecVerdict:
    proposed: list[int]
    token_ids: list[int]                     # accepted drafts, then one recovered or bonus token
    checks: list[DraftCheck] = field(default_factory=list)

    @property
    def num_accepted(self) -> int:
        return len(self.token_ids) - 1

    @property
    def bonus(self) -> bool:
        """All drafts were accepted, so the last token came free from the final row."""
        return self.num_accepted == len(self.proposed)


def verify(logits: torch.Tensor, proposed: list[int], params: SamplingParams,
           generator: torch.Generator, draft_probs: torch.Tensor | None = None) -> SpecVerdict:
    """logits: [k + 1, V] float32 target logits; draft_probs: [k, V] or None (one-hot)."""
    if params.greedy:
        return _verify_greedy(logits, proposed)
    p = filtered_logits(logits, [params] * logits.shape[0]).softmax(dim=1)
    verdict = SpecVerdict(list(proposed), [])
    for i, d in enumerate(proposed):
        q_row = _draft_row(draft_probs, i, d, p.shape[1], p.device)
        ratio = float(p[i, d]) / max(float(q_row[d]), 1e-20)
        u = float(torch.rand((), generator=generator, device=generator.device))
        accepted = u < min(1.0, ratio)
        verdict.checks.append(DraftCheck(d, float(p[i, d]), float(q_row[d]), u, accepted))
        if not accepted:
            residual = (p[i] - q_row).clamp_min(0)
            verdict.token_ids.append(_draw(residual if residual.sum() > 0 else p[i], generator))
            return verdict
        verdict.token_ids.append(d)
    verdict.token_ids.append(_draw(p[len(proposed)], generator))
    return verdict


def _verify_greedy(logits: torch.Tensor, proposed: list[int]) -> SpecVerdict:
    best = logits.argmax(dim=1).tolist()
    probs = logits.softmax(dim=1)
    verdict = SpecVerdict(list(proposed), [])
    for i, d in enumerate(proposed):
        accepted = best[i] == d
        verdict.checks.append(DraftCheck(d, float(probs[i, d]), 1.0, None, accepted))
        verdict.token_ids.append(best[i])
        if not accepted:
            return verdict
    verdict.token_ids.append(best[len(proposed)])
    return verdict


def _draft_row(draft_probs, i: int, token: int, vocab: int, device) -> torch.Tensor:
    if draft_probs is not None:
        return draft_probs[i]
    return torch.zeros(vocab, device=device).index_fill_(0, torch.tensor([token], device=device), 1.0)


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
