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


STAGES = (("temperature", apply_temperature, lambda p: p.temperature, 1.0),   # name, filter, its argument, a no-op one
          ("top_k", apply_top_k, lambda p: p.top_k, 0), ("top_p", apply_top_p, lambda p: p.top_p, 1.0),
          ("min_p", apply_min_p, lambda p: p.min_p, 0.0))


def grammar_allowed(grammar, width: int) -> torch.Tensor | None:
    """Which of `width` logits a grammar's latest mask let through (bool), or None before any."""
    if grammar.last_bitmask is None:
        return None
    allowed = torch.zeros(width, dtype=torch.bool)
    n = min(width, grammar.vocab_size)
    allowed[:n] = token_bits(grammar.last_bitmask.unsqueeze(0), grammar.vocab_size)[0, :n].bool()
    return allowed


def _applies(name: str, p) -> bool:
    return not p.greedy and (name == "temperature" or (p.top_k > 0 if name == "top_k" else
                                                       p.top_p < 1.0 if name == "top_p" else p.min_p > 0.0))


def sampling_events(seqs: list[Sequence], step: int, logits: torch.Tensor, chosen: list[int],
                    text_of: Callable[[int], str], ts: float, with_distribution: list[bool]) -> list[dict]:
    """The sampler's view of each watched draw, every row at once. logits: the model's [rows,
    vocab] rows for `seqs`; `text_of`: a token id's text (token_texts: cached, as every step
    shows the likeliest few again); `with_distribution` adds the logits themselves (watches
    that ask for internals). Each stage shows how many tokens it keeps and the candidates'
    logits and probabilities; a stage a request does not apply shows what the one before
    did. A request under structured outputs is shown as the sampler saw it: the grammar's
    forbidden tokens at -inf (`allowed_tokens` counts the rest), while `logprob` stays the
    model's own, as on request.token."""
    model_rows = logits.float()
    vocab = model_rows.shape[1]
    masks = [grammar_allowed(s.grammar, vocab) if s.grammar is not None else None for s in seqs]
    rows = model_rows
    if any(m is not None for m in masks):
        every = torch.ones(vocab, dtype=torch.bool)
        rows = model_rows.masked_fill(~torch.stack([every if m is None else m for m in masks]).to(rows.device),
                                      float("-inf"))
    params = [s.params for s in seqs]
    stages, cur = [("logits", [True] * len(seqs), rows)], rows
    for name, fn, arg, noop in STAGES:   # one filter over every row; rows it does not apply to keep their values
        on = [_applies(name, p) for p in params]
        if any(on):
            new = fn(cur, torch.tensor([arg(p) if o else noop for p, o in zip(params, on)], device=rows.device))
            cur = torch.where(torch.tensor(on, device=rows.device)[:, None], new, cur)
        stages.append((name, on, cur))
    top = rows.topk(min(TOP_CANDIDATES, vocab), dim=1)
    orders = [[i for i, v in zip(ids, values) if v > float("-inf")]
              for ids, values in zip(top.indices.tolist(), top.values.tolist())]
    orders = [order if c in order else order + [c] for order, c in zip(orders, chosen)]
    width = max(map(len, orders))
    index = torch.tensor([order + [order[0]] * (width - len(order)) for order in orders], device=rows.device)
    shown, seen = [], None
    for name, on, t in stages:
        if t is seen:   # no row applied it: every row shows the stage before
            shown.append((name, on, None))
            continue
        probs = t.softmax(dim=1)
        shown.append((name, on, (t.gather(1, index).tolist(), probs.gather(1, index).tolist(),
                                 torch.isfinite(t).sum(1).tolist())))
        seen = t
    final = probs   # the last stage's: each row's own last filter
    picked = torch.tensor(chosen, device=rows.device)[:, None]
    p_chosen = final.gather(1, picked)
    above = final > p_chosen   # the draw's place in the sorted distribution: the mass of the likelier tokens
    ranks, lows = above.sum(1).tolist(), (final * above).sum(1).tolist()
    logprobs = model_rows.log_softmax(dim=1).gather(1, picked)[:, 0].tolist()
    events = []
    for r, (seq, p, c, order) in enumerate(zip(seqs, params, chosen, orders)):
        texts = {i: text_of(i) for i in order}
        out_stages, at = [], None
        for name, on, values in shown:
            if values is not None and on[r]:
                at = values
                logit_values, chances, kept = values[0][r], values[1][r], values[2][r]
                out_stages.append({"name": name, "applied": True, "kept": kept, "candidates": [
                    {"id": i, "text": texts[i], "logit": None if v == float("-inf") else round(v, 4),
                     "prob": round(ch, 6)} for i, v, ch in zip(order, logit_values, chances)]})
            else:   # a stage that changed nothing for this row (greedy: all of them) shows what the last one did
                out_stages.append({**out_stages[-1], "name": name, "applied": on[r]})
        p_c = at[1][r][order.index(c)]
        low = lows[r]
        draw = {"method": "greedy" if p.greedy else "sample", "rank": ranks[r],
                "cdf_low": round(min(low, 1.0), 6), "cdf_high": round(min(low + p_c, 1.0), 6)}
        event = {"type": "sampling", "ts": ts, "request_id": seq.request_id, "step": step,
                 "index": seq.num_output_tokens - 1,
                 "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p},
                 "stages": out_stages, "draw": draw,
                 "chosen": {"id": c, "text": texts[c], "prob": round(p_c, 6), "logprob": round(logprobs[r], 6)}}
        if masks[r] is not None:
            event["allowed_tokens"] = int(masks[r].sum())
        if with_distribution[r]:
            event["distribution"] = raw_distribution(rows[r])
        events.append(event)
    return events


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
