"""Turn each row of logits into a token: greedy, temperature, top-k, top-p, min-p.

Random draws use the exponential race (argmax of p / E with E ~ Exp(1) is a draw from p),
with the noise for a seeded request coming from that request's own generator, so the same
seed gives the same tokens whatever else shares the batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvscope.sampling_params import SamplingParams

NEG_INF = float("-inf")


@dataclass
class SamplingBatch:
    params: list[SamplingParams]
    generators: list[torch.Generator | None]


def apply_temperature(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    return logits / temps.clamp_min(1e-6).unsqueeze(1)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """top_k: [B] with 0 meaning no limit."""
    vocab = logits.shape[1]
    k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab))
    kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p."""
    sorted_logits, order = logits.sort(dim=1, descending=True)
    probs = sorted_logits.softmax(dim=1)
    before = probs.cumsum(dim=1) - probs          # mass strictly above each token
    drop_sorted = before >= top_p.unsqueeze(1)
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = logits.softmax(dim=1)
    threshold = probs.max(dim=1, keepdim=True).values * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, NEG_INF)


def filtered_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p, min-p — each applied only if some row asks for it."""
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], device=dev)
    logits = apply_temperature(logits, temps)
    if any(p.top_k > 0 for p in params):
        logits = apply_top_k(logits, torch.tensor([p.top_k for p in params], device=dev))
    if any(p.top_p < 1.0 for p in params):
        logits = apply_top_p(logits, torch.tensor([p.top_p for p in params], device=dev))
    if any(p.min_p > 0.0 for p in params):
        logits = apply_min_p(logits, torch.tensor([p.min_p for p in params], device=dev))
    return logits


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest value (the first, on ties). On a CPU through numpy:
    torch's argmax over a 2,048-wide row runs at a twentieth of numpy's speed (233 against
    10 µs for 64 rows, 1 thread), a cost every greedy decode step pays."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(x.contiguous().numpy().argmax(axis=1))
    return x.argmax(dim=1)


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """logits: [B, V] float32 → token ids [B]."""
        greedy = row_argmax(logits)
        if all(p.greedy for p in batch.params):
            return greedy
        probs = filtered_logits(logits, batch.params).softmax(dim=1)
        noise = torch.empty_like(probs)
        for row, gen in enumerate(batch.generators):
            if gen is not None:
                noise[row].exponential_(generator=gen)
        unseeded = [r for r, g in enumerate(batch.generators) if g is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=probs.device) \
                .exponential_(generator=self.generator)
        drawn = row_argmax(probs / noise)
        is_greedy = torch.tensor([p.greedy for p in batch.params], device=logits.device)
        return torch.where(is_greedy, greedy, drawn)


def logprob_entries(logits: torch.Tensor, tokens: torch.Tensor, ns: list[int]) -> list[dict]:
    """Per row: the log-probability (of the unmodified distribution) of its chosen token and
    its ns[row] most likely (token, logprob) pairs."""
    logp = logits.log_softmax(dim=1)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
    top = logp.topk(max(ns), dim=1) if max(ns) else None
    return [{"logprob": chosen[row],
             "top": list(zip(top.indices[row, :n].tolist(), top.values[row, :n].tolist())) if n else []}
            for row, n in enumerate(ns)]
