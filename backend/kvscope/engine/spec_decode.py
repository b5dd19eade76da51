"""Speculative decoding: vLLM's `speculative_config`, and the two halves of a speculative
step around the ordinary one — drafts proposed before scheduling, verified after the target
pass. The scheduler gives a sequence with drafts k + 1 query rows (its last token and the
drafts) in an ordinary step, so speculative and plain requests share the batch.

Verification (`verify`, rejection sampling): the target scored the last known token and the k drafts in one pass, giving k + 1 rows of
logits. Draft i is accepted with probability min(1, p(d) / q(d)), p being the target's and q
the drafter's distribution at that position; at the first rejection a token is drawn from
the normalised residual max(0, p − q), and if all k are accepted the last row gives a bonus
token from p. The output then follows the target's distribution exactly. Greedy requests
accept a draft exactly when it is the target's argmax, so they produce the target's tokens.
A drafter without probabilities (n-gram lookup) proposes deterministically: q is one-hot."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from kvscope.engine.block_manager import BlockManager
from kvscope.engine.model_runner import load_model_and_runner
from kvscope.engine.sampler import filtered_logits, logprob_entries
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.models.loader import read_model_config, resolve_model_path
from kvscope.sampling_params import SamplingParams

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


# -- verification: rejection sampling ----------------------------------------------------
@dataclass
class DraftCheck:
    """How one draft fared, for the explainer: target and draft probability and the draw."""
    token_id: int
    target: float | torch.Tensor   # p(draft), or for greedy the row's logits (p on demand)
    q: float
    u: float | None        # the uniform draw compared with p/q (None for greedy)
    accepted: bool

    @property
    def p(self) -> float:
        """The target's probability of the draft. A greedy check needs only the argmax, so
        the softmax is computed when someone (the explainer) asks."""
        if isinstance(self.target, torch.Tensor):
            self.target = float(self.target.softmax(dim=0)[self.token_id])
        return self.target


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
    verdict = SpecVerdict(list(proposed), [])
    for i, d in enumerate(proposed):
        accepted = best[i] == d
        verdict.checks.append(DraftCheck(d, logits[i], 1.0, None, accepted))
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


# -- drafts and their bookkeeping ----------------------------------------------------------
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
            # a grammar's mask holds for the next token only, so constrained requests are not drafted
            if seq.num_tokens - seq.num_computed_tokens != 1 or seq.held or seq.forks or seq.grammar is not None:
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

    def record(self, seq: Sequence, verdict: SpecVerdict, emitted: int) -> None:
        self.total.add(verdict, emitted)
        self.stats.setdefault(seq.seq_id, SpecStats()).add(verdict, emitted)

    def release(self, seq: Sequence) -> None:
        self.drafts.pop(seq.seq_id, None)
        stats = self.stats.pop(seq.seq_id, None)
        if stats is not None:
            self.last_stats[seq.seq_id] = stats
        self.proposer.release(seq)


def spec_logprobs(logits: torch.Tensor, token_ids: list[int], n: int) -> list[dict]:
    """Per emitted token: its log-probability under the target and the top n."""
    rows = logits[:len(token_ids)]
    return logprob_entries(rows, torch.tensor(token_ids, device=rows.device), [n] * len(token_ids))


class NgramProposer:
    """Prompt lookup (n-gram) drafting: no extra model. The last n tokens of a sequence are
    looked up earlier in the same sequence; the tokens that followed the most recent earlier
    occurrence are proposed as the continuation. Longest n first, from prompt_lookup_max
    down to prompt_lookup_min. (Drafting with a small model: DraftModelProposer, below.)"""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_max: int, prompt_lookup_min: int):
        self.k = num_speculative_tokens
        self.max_n, self.min_n = prompt_lookup_max, prompt_lookup_min

    def propose(self, seqs: list, ks: list[int]) -> list[Draft]:
        return [Draft(self.lookup(seq.token_ids, k)) for seq, k in zip(seqs, ks)]

    def release(self, seq) -> None:
        """Nothing is kept per sequence."""

    def lookup(self, token_ids: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        for n in range(min(self.max_n, len(token_ids) - 1), self.min_n - 1, -1):
            start = self._latest_match(token_ids, n)
            if start is not None:
                return token_ids[start + n:start + n + k]
        return []

    @staticmethod
    def _latest_match(token_ids: list[int], n: int) -> int | None:
        """Start of the most recent earlier occurrence of the last n tokens, or None."""
        tail = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):
            if token_ids[start:start + n] == tail:
                return start
        return None


# -- drafting with a small model ----------------------------------------------------------
GREEDY = SamplingParams(temperature=0.0)


class DraftModelProposer:
    """Drafting with a small model that shares the target's vocabulary.

    The draft model has its own paged KV cache, its own block manager and its own model
    runner (the same classes the target uses). Each target sequence has a mirror sequence on
    the draft side. Before drafting, the mirror forgets the K/V of any earlier drafts the
    target rejected (its computed count falls back to the prefix it shares with the target
    and the surplus blocks are given back), catches up on the tokens it has not seen, then
    decodes k tokens. The draft proposes its most likely token at each position, so its
    distribution q is one-hot and the rejection sampler accepts a draft with probability
    p(draft)."""
    def __init__(self, config: SpeculativeConfig, engine):
        path = resolve_model_path(config.model)
        self.model_config = read_model_config(path)
        if self.model_config.vocab_size != engine.model_config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({self.model_config.vocab_size}) differs "
                             f"from the target's ({engine.model_config.vocab_size})")
        num_blocks = engine.block_manager.num_blocks   # as many as the target's: a draft per sequence
        self.model, self.runner, _ = load_model_and_runner(engine.config, path, self.model_config, engine.dtype,
                                                           engine.device, engine.max_model_len,
                                                           lambda model: num_blocks, load_format="auto")
        self.block_manager = BlockManager(num_blocks, engine.config.block_size, enable_prefix_caching=False)
        self.mirrors: dict[int, Sequence] = {}
        self.num_steps = 0

    @property
    def kv_cache_bytes(self) -> int:
        return self.runner.kv_cache_bytes

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        mirrors = [self._sync(seq) for seq in seqs]
        drafts: dict[int, list[int]] = {m.seq_id: [] for m in mirrors}
        active = list(zip(mirrors, ks))
        while active:
            out = SchedulerOutput(step=self.num_steps)
            self.num_steps += 1
            for mirror, _ in active:
                n = mirror.num_tokens - mirror.num_computed_tokens
                if not self.block_manager.try_append(mirror, n):
                    continue      # the draft cache is full: this sequence drafts no further
                out.entries.append(ScheduledSeq.row(mirror, n))
            if out.is_empty:
                break
            result = self.runner.run(out, {})
            for entry in out.entries:
                mirror = entry.seq
                mirror.num_computed_tokens += entry.num_new_tokens
                token = result.tokens[mirror.seq_id][0]
                mirror.token_ids.append(token)
                drafts[mirror.seq_id].append(token)
            scheduled = {e.seq.seq_id for e in out.entries}
            active = [(m, k) for m, k in active if m.seq_id in scheduled and len(drafts[m.seq_id]) < k]
        return [Draft(drafts[m.seq_id]) for m in mirrors]

    def _sync(self, seq: Sequence) -> Sequence:
        """The mirror with the target's tokens, keeping K/V only for the shared prefix."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = self.mirrors[seq.seq_id] = Sequence(list(seq.prompt_token_ids), GREEDY)
        shared = 0
        for a, b in zip(mirror.token_ids, seq.token_ids):
            if a != b:
                break
            shared += 1
        mirror.num_computed_tokens = min(mirror.num_computed_tokens, shared, seq.num_tokens - 1)
        self.block_manager.trim(mirror)
        mirror.token_ids = list(seq.token_ids)
        return mirror

    def release(self, seq: Sequence) -> None:
        mirror = self.mirrors.pop(seq.seq_id, None)
        if mirror is not None:
            self.block_manager.free(mirror)
