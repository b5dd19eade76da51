"""Who watches which request, and the events built for watched requests only: attention
weights (caught by the side pass in `kvscope.instrumentation.capture`) and the sampler's
view of each draw. Viewers say which layers and heads they want; the side pass captures
the union, and each event carries the union of heads (the server slices per viewer)."""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvscope.engine.sampler import apply_min_p, apply_temperature, apply_top_k, apply_top_p, token_bits
from kvscope.engine.sequence import Sequence

TOP_CANDIDATES = 10
DISTRIBUTION_FULL = 4096   # vocabularies up to this size send every logit
DISTRIBUTION_TOP = 512     # larger ones send this many of the largest
DECIMALS = 4


@dataclass
class WatchSpec:
    layers: frozenset[int] | None = None   # None: every layer
    heads: frozenset[int] | None = None    # None: every head
    sampling: bool = True
    internals: bool = False                # embeddings, residual stream, MLP, logit lens


@dataclass
class Watch:
    seq: Sequence
    viewers: dict[str, WatchSpec] = field(default_factory=dict)   # viewer id -> what it wants
    covered: int = 0   # positions [0, covered) have had their rows captured

    def layers(self) -> set[int] | None:
        specs = list(self.viewers.values())
        if any(s.layers is None for s in specs):
            return None
        return set().union(*(s.layers for s in specs))

    def heads(self, num_heads: int) -> list[int]:
        specs = list(self.viewers.values())
        if any(s.heads is None for s in specs):
            return list(range(num_heads))
        return sorted(h for h in set().union(*(s.heads for s in specs)) if h < num_heads)

    @property
    def sampling(self) -> bool:
        return any(s.sampling for s in self.viewers.values())

    @property
    def internals(self) -> bool:
        return any(s.internals for s in self.viewers.values())


class WatchRegistry:
    """The one record of who watches what. Written on the engine thread (watch, unwatch,
    a request's end); read by the server's fan-out on the event loop, hence the lock."""

    def __init__(self):
        self._watches: dict[str, Watch] = {}   # request id -> its watch
        self._lock = threading.Lock()

    def add(self, request_id: str, viewer: str, spec: WatchSpec, seq: Sequence) -> Watch:
        with self._lock:
            w = self._watches.setdefault(request_id, Watch(seq))
            w.viewers[viewer] = spec
            return w

    def remove(self, request_id: str, viewer: str) -> None:
        with self._lock:
            w = self._watches.get(request_id)
            if w is not None:
                w.viewers.pop(viewer, None)
                if not w.viewers:
                    del self._watches[request_id]

    def drop_viewer(self, viewer: str) -> None:
        with self._lock:
            for rid, w in list(self._watches.items()):
                w.viewers.pop(viewer, None)
                if not w.viewers:
                    del self._watches[rid]

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._watches.pop(request_id, None)

    def clear(self) -> None:
        with self._lock:
            self._watches.clear()

    def spec(self, request_id: str, viewer: str) -> WatchSpec | None:
        """What `viewer` asked to see of `request_id` (None: it does not watch it)."""
        with self._lock:
            w = self._watches.get(request_id)
            return None if w is None else w.viewers.get(viewer)

    def viewers(self, request_id: str) -> list[str]:
        with self._lock:
            w = self._watches.get(request_id)
            return [] if w is None else list(w.viewers)

    def by_seq_id(self) -> dict[int, Watch]:
        with self._lock:
            return {w.seq.seq_id: w for w in self._watches.values()}

    def __len__(self) -> int:
        return len(self._watches)

    def __bool__(self) -> bool:
        return bool(self._watches)


def rounded(t: torch.Tensor) -> list:
    return ((t.double() * 10**DECIMALS).round() / 10**DECIMALS).tolist()


def attention_event(seq: Sequence, step: int, layer: int, positions: list[int], context_len: int, weights, mean,
                    heads: list[int], num_heads: int, num_kv_heads: int, ts: float, recomputed: bool = False) -> dict:
    """weights: [len(heads), rows, context_len] and mean (over every head): [rows, context_len],
    arrays (float16, possibly still on their way to the host: encode.py reads them off the
    engine thread); `recomputed`: rows the prefix cache spared the engine, rebuilt by the side pass."""
    group = num_heads // num_kv_heads
    return {"type": "attention", "ts": ts, "request_id": seq.request_id, "step": step, "layer": layer,
            "heads": heads, "kv_heads": [h // group for h in heads], "num_heads": num_heads,
            "query_positions": positions, "context_len": context_len, "token_ids": seq.token_ids[:context_len],
            "weights": weights, "mean": mean, "recomputed": recomputed}


def _stage(name: str, applied: bool, logits: torch.Tensor, order: list[int], texts: dict[int, str]) -> dict:
    """One stage of the sampler as the widget shows it: how many tokens it keeps, and the
    candidates' logits and probabilities (read in one gather each)."""
    probs = logits.softmax(dim=0)
    values, chances = logits[order].tolist(), probs[order].tolist()
    return {"name": name, "applied": applied, "kept": int(torch.isfinite(logits).sum()),
            "candidates": [{"id": i, "text": texts[i], "logit": None if v == float("-inf") else round(v, 4),
                            "prob": round(c, 6)} for i, v, c in zip(order, values, chances)]}, probs


def grammar_allowed(grammar, width: int) -> torch.Tensor | None:
    """Which of `width` logits a grammar's latest mask let through (bool), or None before any."""
    if grammar.last_bitmask is None:
        return None
    allowed = torch.zeros(width, dtype=torch.bool)
    n = min(width, grammar.vocab_size)
    allowed[:n] = token_bits(grammar.last_bitmask.unsqueeze(0), grammar.vocab_size)[0, :n].bool()
    return allowed


def sampling_event(seq: Sequence, step: int, logits: torch.Tensor, chosen: int, text_of: Callable[[int], str],
                   ts: float, with_distribution: bool = False) -> dict:
    """logits: the model's [vocab] row for this sequence; `text_of`: a token id's text
    (token_texts: cached, as every step shows the likeliest few again); `with_distribution` adds the
    logits themselves (watches that ask for internals). A request under structured outputs
    is shown as the sampler saw it: the grammar's forbidden tokens at -inf (`allowed_tokens`
    counts the rest), while `logprob` stays the model's own, as on request.token."""
    p = seq.params
    model_row = logits.float()
    allowed = grammar_allowed(seq.grammar, model_row.shape[0]) if seq.grammar is not None else None
    row = (model_row if allowed is None else model_row.masked_fill(~allowed, float("-inf"))).unsqueeze(0)
    stages = [("logits", True, row)]
    cur = apply_temperature(row, torch.tensor([p.temperature])) if not p.greedy else row
    stages.append(("temperature", not p.greedy, cur))
    for name, on, fn, arg in (("top_k", p.top_k > 0, apply_top_k, torch.tensor([p.top_k])),
                              ("top_p", p.top_p < 1.0, apply_top_p, torch.tensor([p.top_p])),
                              ("min_p", p.min_p > 0.0, apply_min_p, torch.tensor([p.min_p]))):
        if on and not p.greedy:
            cur = fn(cur, arg)
        stages.append((name, on and not p.greedy, cur))
    top = row[0].topk(min(TOP_CANDIDATES, row.shape[1]))
    order = [i for i, v in zip(top.indices.tolist(), top.values.tolist()) if v > float("-inf")]
    if chosen not in order:
        order.append(chosen)
    texts = {i: text_of(i) for i in order}
    out_stages, previous, final = [], None, None
    for name, applied, lg in stages:
        if lg is previous:   # a stage that changed nothing (greedy: all of them) shows what the last one did
            out_stages.append({**out_stages[-1], "name": name, "applied": applied})
            continue
        stage, final = _stage(name, applied, lg[0], order, texts)
        out_stages.append(stage)
        previous = lg
    p_chosen = final[chosen]
    above = final > p_chosen   # the draw's place in the sorted distribution: the mass of the likelier tokens
    rank, low = int(above.sum()), float(final[above].sum())
    draw = {"method": "greedy" if p.greedy else "sample", "rank": rank,
            "cdf_low": round(min(low, 1.0), 6), "cdf_high": round(min(low + float(p_chosen), 1.0), 6)}
    logprob = float(model_row.log_softmax(dim=0)[chosen])
    event = {"type": "sampling", "ts": ts, "request_id": seq.request_id, "step": step,
            "index": seq.num_output_tokens - 1,
            "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p},
            "stages": out_stages, "draw": draw,
            "chosen": {"id": chosen, "text": texts[chosen], "prob": round(float(p_chosen), 6),
                       "logprob": round(logprob, 6)}}
    if allowed is not None:
        event["allowed_tokens"] = int(allowed.sum())
    if with_distribution:
        event["distribution"] = raw_distribution(row[0])
    return event


def raw_distribution(logits: torch.Tensor) -> dict:
    """The logits for a widget to reshape as the sampler does: the whole row for a small
    vocabulary (exact), else the DISTRIBUTION_TOP largest (`complete` false). A masked row
    sends only the tokens its grammar allowed, with their `ids` (all of them for a small
    vocabulary; `complete` when none is left out)."""
    small = logits.shape[0] <= DISTRIBUTION_FULL
    num_finite = int(torch.isfinite(logits).sum())
    if small and num_finite == logits.shape[0]:
        return {"complete": True, "logits": rounded(logits)}
    top = logits.topk(min(DISTRIBUTION_FULL if small else DISTRIBUTION_TOP, num_finite))
    return {"complete": top.indices.numel() == num_finite, "ids": top.indices.tolist(), "logits": rounded(top.values)}


def token_texts(tokenizer) -> Callable[[int], str]:
    """A token id's text, each decoded once."""
    @functools.lru_cache(maxsize=1 << 16)
    def text_of(token_id: int) -> str:
        return f"<{token_id}>" if tokenizer is None else tokenizer.decode([token_id])
    return text_of
