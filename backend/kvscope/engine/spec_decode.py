"""Speculative decoding (vLLM's `speculative_config`): drafts proposed before scheduling, a
sequence with k drafts taking k + 1 rows of an ordinary step, then verified by rejection
sampling (accept with min(1, p/q), else draw from max(0, p - q)), so the output follows the
target's distribution exactly; a greedy request accepts exactly the target's argmax."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.config import SpeculativeConfig
from kvscope.engine.block_manager import BlockManager
from kvscope.engine.model_runner import ModelRunner
from kvscope.engine.sampler import filtered_logits, logprob_entries
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.models.loader import read_model_config, resolve_model_path
from kvscope.sampling_params import SamplingParams

@dataclass
class DraftCheck:
    """How one draft fared, for the explainer: target and draft probability and the draw."""
    token_id: int
    target: float | torch.Tensor   # p(draft), or for greedy the row's logits (p on demand)
    q: float
    u: float | None                # the uniform draw compared with p/q (None for greedy)
    accepted: bool
    rows: tuple[torch.Tensor, torch.Tensor] | None = None   # (p, q) over the vocabulary: views, no copy

    @property
    def p(self) -> float:
        """p(draft): a greedy check needs only the argmax, so the softmax waits for the explainer."""
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
    def bonus(self) -> bool:   # every draft accepted: the last token came free from the final row
        return self.num_accepted == len(self.proposed)


def verify(logits: torch.Tensor, proposed: list[int], params: SamplingParams,
           generator: torch.Generator, draft_probs: torch.Tensor | None = None) -> SpecVerdict:
    """logits: [k + 1, V] float32 target logits; draft_probs: [k, V] or None (one-hot)."""
    if params.greedy:   # drafts accepted up to the first that is not its row's argmax; the tokens are the argmaxes
        best = logits.argmax(dim=1).tolist()
        n = next((i for i, d in enumerate(proposed) if best[i] != d), len(proposed))   # drafts accepted
        checks = [DraftCheck(d, logits[i], 1.0, None, best[i] == d) for i, d in enumerate(proposed[:n + 1])]
        return SpecVerdict(list(proposed), best[:n + 1], checks)
    p = filtered_logits(logits, [params] * logits.shape[0]).softmax(dim=1)
    if draft_probs is None:
        draft_probs = torch.nn.functional.one_hot(torch.tensor(proposed, device=p.device), p.shape[1]).float()
    verdict = SpecVerdict(list(proposed), [])
    for i, d in enumerate(proposed):
        p_d, q_d = float(p[i, d]), float(draft_probs[i, d])
        u = float(torch.rand((), generator=generator, device=generator.device))
        accepted = u < min(1.0, p_d / max(q_d, 1e-20))
        verdict.checks.append(DraftCheck(d, p_d, q_d, u, accepted, (p[i], draft_probs[i])))
        if not accepted:
            residual = (p[i] - draft_probs[i]).clamp_min(0)
            verdict.token_ids.append(_draw(residual if residual.sum() > 0 else p[i], generator))
            return verdict
        verdict.token_ids.append(d)
    verdict.token_ids.append(_draw(p[len(proposed)], generator))
    return verdict


def _draw(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))


@dataclass
class SpecStats:
    """Running totals: the engine's (`Speculator.total`), or one request's (the explainer keeps those)."""
    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0
    emitted: int = 0

    def add(self, verdict: SpecVerdict) -> None:
        self.proposed += len(verdict.proposed)
        self.accepted += verdict.num_accepted
        self.target_passes += 1
        self.emitted += len(verdict.token_ids)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.emitted / self.target_passes if self.target_passes else 0.0


class Speculator:
    def __init__(self, config: SpeculativeConfig, engine):
        self.config, self.max_model_len = config, engine.max_model_len
        # both drafters propose deterministically (prompt lookup, a greedy draft model): q is one-hot
        self.draft_model = DraftModelProposer(config, engine) if config.method == "draft_model" else None
        self.total = SpecStats()   # the engine's running totals

    def propose(self, running: list[Sequence]) -> None:
        """Draft for every running sequence about to decode, never past what it may still produce."""
        ready, ks = [], []
        for seq in running:
            # a grammar's mask holds for the next token only, so constrained requests are not drafted
            if seq.num_tokens - seq.num_computed_tokens != 1 or seq.paused or seq.forks or seq.grammar is not None:
                continue
            room = min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1
            if (k := min(self.config.num_speculative_tokens, room)) > 0:
                ready.append(seq)
                ks.append(k)
        c = self.config
        drafts = (self.draft_model.propose(ready, ks) if self.draft_model is not None else
                  [ngram_lookup(s.token_ids, k, c.prompt_lookup_max, c.prompt_lookup_min) for s, k in zip(ready, ks)])
        for seq, draft in zip(ready, drafts):
            seq.spec_token_ids = draft

    def verify(self, out: SchedulerOutput, result, generators: dict[int, torch.Generator],
               default: torch.Generator) -> None:
        """Accept or reject each sequence's drafts against the target's rows (`result.spec_logits`)."""
        for entry in out.entries:
            seq = entry.seq
            if (logits := result.spec_logits.get(seq.seq_id)) is None:
                continue
            verdict = result.spec[seq.seq_id] = verify(logits, entry.spec_token_ids, seq.params,
                                                       generators.get(seq.seq_id, default))
            self.total.add(verdict)
            result.tokens[seq.seq_id] = ids = verdict.token_ids
            if (n := seq.params.logprobs) is not None:   # each emitted token's, under the target
                drawn = torch.tensor(ids, device=logits.device)
                result.logprobs[seq.seq_id] = logprob_entries(logits[:len(ids)], drawn, [n] * len(ids))

    def release(self, seq: Sequence) -> None:
        if self.draft_model is not None:   # prompt lookup keeps nothing per sequence
            self.draft_model.release(seq)


def ngram_lookup(token_ids: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Prompt lookup: the k tokens that followed the most recent earlier occurrence of the last n
    tokens, longest n first (prompt_lookup_max down to prompt_lookup_min)."""
    for n in range(min(max_n, len(token_ids) - 1), min_n - 1, -1):
        tail = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):   # the most recent occurrence first
            if token_ids[start:start + n] == tail:
                return token_ids[start + n:start + n + k]
    return []


class DraftModelProposer:
    """A small model sharing the target's vocabulary, with its own runner, KV pool and a mirror of
    each sequence (its rejected drafts' K/V forgotten before it catches up); greedy, so q is one-hot."""
    def __init__(self, config: SpeculativeConfig, engine):
        path = resolve_model_path(config.model)
        self.model_config = read_model_config(path)
        if self.model_config.vocab_size != engine.model_config.vocab_size:
            raise ValueError(f"the draft model's vocabulary ({self.model_config.vocab_size}) differs "
                             f"from the target's ({engine.model_config.vocab_size})")
        num_blocks = engine.block_manager.num_blocks   # as many as the target's: a draft per sequence
        self.runner = ModelRunner(engine.config, path, self.model_config, engine.dtype, engine.device,
                                  engine.max_model_len, lambda model: num_blocks, load_format="auto")
        self.block_manager = BlockManager(num_blocks, engine.config.block_size, enable_prefix_caching=False)
        self.mirrors: dict[int, Sequence] = {}

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        mirrors = [self._sync(seq) for seq in seqs]
        active = [(m, m.num_tokens + k) for m, k in zip(mirrors, ks)]   # a mirror and its length when done
        while active:
            out = SchedulerOutput(step=0)   # the draft's steps are no one's to watch
            for mirror, _ in active:
                n = mirror.num_tokens - mirror.num_computed_tokens
                if self.block_manager.try_append(mirror, n):   # a full draft cache ends its drafting here
                    out.entries.append(ScheduledSeq.row(mirror, n))
            if not out.entries:
                break
            result = self.runner.run(out, {})
            for entry in out.entries:
                entry.seq.num_computed_tokens += entry.num_new_tokens
                entry.seq.token_ids.append(result.tokens[entry.seq.seq_id][0])
            scheduled = {e.seq.seq_id for e in out.entries}
            active = [(m, end) for m, end in active if m.seq_id in scheduled and m.num_tokens < end]
        return [m.token_ids[seq.num_tokens:] for m, seq in zip(mirrors, seqs)]

    def _sync(self, seq: Sequence) -> Sequence:
        """The mirror with the target's tokens, keeping K/V only for the shared prefix."""
        mirror = self.mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = self.mirrors[seq.seq_id] = Sequence(list(seq.prompt_token_ids), SamplingParams(temperature=0.0))
        pairs = enumerate(zip(mirror.token_ids, seq.token_ids))
        shared = next((i for i, (a, b) in pairs if a != b), min(mirror.num_tokens, seq.num_tokens))
        mirror.num_computed_tokens = min(mirror.num_computed_tokens, shared, seq.num_tokens - 1)
        self.block_manager.trim(mirror)
        mirror.token_ids = list(seq.token_ids)
        return mirror

    def release(self, seq: Sequence) -> None:
        if (mirror := self.mirrors.pop(seq.seq_id, None)) is not None:
            self.block_manager.free(mirror)
