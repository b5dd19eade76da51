"""Speculative decoding: vLLM's `speculative_config`, and the two halves of a speculative
step around the ordinary one — drafts proposed before scheduling, verified after the target
pass. The scheduler gives a sequence with drafts k + 1 query rows (its last token and the
drafts) in an ordinary step, so speculative and plain requests share the batch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from kvscope.engine.rejection_sampler import SpecVerdict, verify
from kvscope.engine.sampler import top_logprobs
from kvscope.engine.sequence import Sequence

METHODS = ("ngram", "draft_model")


@dataclass
class SpeculativeConfig:
    """The keys are vLLM's: {"method": "ngram", "num_speculative_tokens": k,
    "prompt_lookup_max": n, "prompt_lookup_min": m} or {"model": dir, "num_speculative_tokens": k}."""
    num_speculative_tokens: int
    method: str = "ngram"
    model: str | None = None
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1

    @classmethod
    def from_dict(cls, raw: dict | None) -> "SpeculativeConfig | None":
        if raw is None:
            return None
        if isinstance(raw, SpeculativeConfig):
            return raw
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {sorted(unknown)}; known: {sorted(known)}")
        if "num_speculative_tokens" not in raw:
            raise ValueError("speculative_config needs num_speculative_tokens")
        values = dict(raw)
        values.setdefault("method", "draft_model" if values.get("model") else "ngram")
        if "prompt_lookup_max" in raw and "prompt_lookup_min" not in raw:
            values["prompt_lookup_min"] = 1
        return cls(**values)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in 1..16, got {self.num_speculative_tokens}")
        if self.method == "draft_model" and not self.model:
            raise ValueError("a draft-model speculative_config needs 'model' (a checkpoint directory)")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")


@dataclass
class Draft:
    token_ids: list[int]
    probs: torch.Tensor | None = None        # [k, V] drafter distribution; None: one-hot


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]: ...
    def release(self, seq: Sequence) -> None: ...


@dataclass
class SpecStats:
    """Running totals for one request (or the whole engine)."""
    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    emitted: int = 0

    def add(self, verdict: SpecVerdict, emitted: int) -> None:
        self.proposed += len(verdict.proposed)
        self.accepted += verdict.num_accepted
        self.target_passes += 1
        self.emitted += emitted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.emitted / self.target_passes if self.target_passes else 0.0


@dataclass
class Speculator:
    config: SpeculativeConfig
    proposer: Proposer
    max_model_len: int
    drafts: dict[int, Draft] = field(default_factory=dict)
    stats: dict[int, SpecStats] = field(default_factory=dict)
    total: SpecStats = field(default_factory=SpecStats)
    last_stats: dict[int, SpecStats] = field(default_factory=dict)   # of requests finished this step

    def propose(self, running: list[Sequence]) -> None:
        """Draft for every running sequence whose next step is a decode. Never more drafts
        than the tokens it may still produce, so max_tokens cannot be overshot."""
        self.last_stats.clear()
        ready, ks = [], []
        for seq in running:
            if seq.num_tokens - seq.num_computed_tokens != 1 or seq.hold or seq.forks:
                continue
            room = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1
            k = min(self.config.num_speculative_tokens, room)
            if k > 0:
                ready.append(seq)
                ks.append(k)
        if not ready:
            return
        for seq, draft in zip(ready, self.proposer.propose(ready, ks)):
            self.drafts.pop(seq.seq_id, None)
            if draft.token_ids:
                seq.spec_token_ids = draft.token_ids
                self.drafts[seq.seq_id] = draft

    def verify(self, seq: Sequence, proposed: list[int], logits: torch.Tensor,
               generator: torch.Generator) -> SpecVerdict:
        draft = self.drafts.pop(seq.seq_id, None)
        probs = draft.probs[:len(proposed)] if draft is not None and draft.probs is not None else None
        return verify(logits, proposed, seq.params, generator, probs)

    def record(self, seq: Sequence, verdict: SpecVerdict, emitted: int) -> SpecStats:
        self.total.add(verdict, emitted)
        stats = self.stats.setdefault(seq.seq_id, SpecStats())
        stats.add(verdict, emitted)
        return stats

    def release(self, seq: Sequence) -> None:
        self.drafts.pop(seq.seq_id, None)
        stats = self.stats.pop(seq.seq_id, None)
        if stats is not None:
            self.last_stats[seq.seq_id] = stats
        self.proposer.release(seq)


def spec_logprobs(logits: torch.Tensor, token_ids: list[int], n: int) -> list[dict]:
    """Per emitted token: its log-probability under the target and the top n."""
    rows = logits[:len(token_ids)]
    chosen, top = top_logprobs(rows, torch.tensor(token_ids, device=rows.device), n)
    return [{"logprob": float(chosen[i]),
             "top": list(zip(top.indices[i].tolist(), top.values[i].tolist())) if n else []}
            for i in range(len(token_ids))]


def build_speculator(config: SpeculativeConfig | None, engine) -> Speculator | None:
    if config is None:
        return None
    if config.method == "ngram":
        from kvscope.engine.ngram_proposer import NgramProposer
        proposer = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_max,
                                 config.prompt_lookup_min)
    else:
        from kvscope.engine.draft_proposer import DraftModelProposer
        proposer = DraftModelProposer(config, engine)
    return Speculator(config, proposer, engine.max_model_len)
