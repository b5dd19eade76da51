"""Who watches which request, and the events built for watched requests only: attention
weights (caught by the side pass in `kvscope.instrumentation.capture`) and the sampler's
view of each draw. Viewers say which layers and heads they want; the side pass captures
the union, and each event carries the union of heads (the server slices per viewer)."""
from __future__ import annotations

import functools
import threading
import weakref
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


def attention_event(seq: Sequence, step: int, layer: int, positions: list[int], token_ids: list[int], weights, mean,
                    heads: list[int], kv_heads: list[int], num_heads: int, ts: float, recomputed: bool = False) -> dict:
    """weights: [len(heads), rows, context] and mean (over every head): [rows, context],
    arrays (float16, possibly still on their way to the host: encode.py reads them off the
    engine thread); token_ids: the context's (a SharedIds, the same for each layer's event);
    `recomputed`: rows the prefix cache spared the engine, rebuilt by the side pass."""
    return {"type": "attention", "ts": ts, "request_id": seq.request_id, "step": step, "layer": layer,
            "heads": heads, "kv_heads": kv_heads, "num_heads": num_heads,
            "query_positions": positions, "context_len": len(token_ids), "token_ids": token_ids,
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
    model's own, as on request.token.

    Every number is computed and rounded by tensor operations over all rows at once; what
    is left per row is putting the lists into the event's shape (a class watches 32 rows a
    step, so per-row Python is what this costs)."""
    model_rows = logits.float()
    n, vocab = model_rows.shape
    device = model_rows.device
    masks = [grammar_allowed(s.grammar, vocab) if s.grammar is not None else None for s in seqs]
    rows = model_rows
    if any(m is not None for m in masks):
        every = torch.ones(vocab, dtype=torch.bool)
        rows = model_rows.masked_fill(~torch.stack([every if m is None else m for m in masks]).to(device),
                                      float("-inf"))
    params = [s.params for s in seqs]
    # each stage: (name, which rows apply it, its logits, whether any token is at -inf by now)
    stages, cur, pruned = [("logits", [True] * n, rows, rows is not model_rows)], rows, rows is not model_rows
    sampled = [not p.greedy for p in params]
    for name, fn, arg, noop in STAGES:   # one filter over every row; rows it does not apply to keep their values
        on = [s and _applies(name, p) for s, p in zip(sampled, params)] if any(sampled) else [False] * n
        if any(on):
            new = fn(cur, torch.tensor([arg(p) if o else noop for p, o in zip(params, on)], device=device))
            cur = torch.where(torch.tensor(on, device=device)[:, None], new, cur)
            pruned = pruned or name != "temperature"
        stages.append((name, on, cur, pruned))
    orders = _candidate_orders(rows, chosen)
    width = max(map(len, orders))
    index = torch.tensor([order + [order[0]] * (width - len(order)) for order in orders], device=device)
    shown, seen = [], None   # per stage: (name, on, its candidates per row) or None: as the stage before
    for name, on, t, pruned in stages:
        if t is seen:   # no row applied it: every row shows the stage before
            shown.append((name, on, None))
            continue
        probs = t.softmax(dim=1)
        if t is model_rows:
            model_probs = probs
        kept = torch.isfinite(t).sum(1).tolist() if pruned else [vocab] * n
        shown.append((name, on, _candidates(orders, text_of, t.gather(1, index), probs.gather(1, index), kept)))
        seen = t
    final = probs   # the last stage's: each row's own last filter
    picked = torch.tensor(chosen, device=device)[:, None]
    p_chosen = final.gather(1, picked).double()
    # the draw's place in the sorted distribution: how many tokens are likelier, and their mass.
    # Every filter keeps the likeliest token, so a row that drew it (every greedy row) has none
    ranks, low = [0] * n, torch.zeros_like(p_chosen)
    if below := [r for r, (order, c) in enumerate(zip(orders, chosen)) if c != order[0]]:
        part = final[below]
        above = part > p_chosen[below].float()
        for r, rank in zip(below, above.sum(1).tolist()):
            ranks[r] = rank
        low[below] = (part * above).sum(1, keepdim=True).double()
    if rows is model_rows:   # the model's own probabilities are the first stage's
        logprob = model_probs.gather(1, picked).double().log()
    else:
        logprob = model_rows.gather(1, picked).double() - model_rows.logsumexp(dim=1, keepdim=True).double()
    # cdf_low, cdf_high, the chosen's prob, its logprob
    draws = torch.cat([low.clamp(max=1.0), (low + p_chosen).clamp(max=1.0), p_chosen, logprob],
                      dim=1).round(decimals=6).tolist()
    events = []
    for r, (seq, p, c) in enumerate(zip(seqs, params, chosen)):
        out_stages = []
        for name, on, candidates in shown:
            if candidates is not None and on[r]:
                num_kept, listed = candidates[r]
                out_stages.append({"name": name, "applied": True, "kept": num_kept, "candidates": listed})
            else:   # a stage that changed nothing for this row (greedy: all of them) shows what the last one did
                out_stages.append({**out_stages[-1], "name": name, "applied": on[r]})
        cdf_low, cdf_high, p_c, logprob = draws[r]
        event = {"type": "sampling", "ts": ts, "request_id": seq.request_id, "step": step,
                 "index": seq.num_output_tokens - 1,
                 "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p},
                 "stages": out_stages,
                 "draw": {"method": "sample" if sampled[r] else "greedy", "rank": ranks[r],
                          "cdf_low": cdf_low, "cdf_high": cdf_high},
                 "chosen": {"id": c, "text": text_of(c), "prob": p_c, "logprob": logprob}}
        if masks[r] is not None:
            event["allowed_tokens"] = int(masks[r].sum())
        if with_distribution[r]:
            event["distribution"] = raw_distribution(rows[r])
        events.append(event)
    return events


def _candidate_orders(rows: torch.Tensor, chosen: list[int]) -> list[list[int]]:
    """Each row's candidates: its TOP_CANDIDATES likeliest allowed tokens, and the chosen one."""
    top = rows.topk(min(TOP_CANDIDATES, rows.shape[1]), dim=1)
    if bool(torch.isfinite(top.values).all()):
        orders = top.indices.tolist()
    else:   # a grammar's mask left fewer
        orders = [[i for i, v in zip(ids, values) if v > float("-inf")]
                  for ids, values in zip(top.indices.tolist(), top.values.tolist())]
    return [order if c in order else order + [c] for order, c in zip(orders, chosen)]


def _candidates(orders: list[list[int]], text_of: Callable[[int], str], logit_values: torch.Tensor,
                chances: torch.Tensor, kept: list[int]) -> list[tuple[int, list[dict]]]:
    """One stage's (tokens kept, candidates) for each row: the candidates' logits (None where
    the stage removed one) and probabilities, rounded in one operation for every row."""
    logit_values = logit_values.double().round(decimals=4)
    finite = bool(torch.isfinite(logit_values).all())
    logit_rows, chance_rows = logit_values.tolist(), chances.double().round(decimals=6).tolist()
    out = []
    for order, values, probs, k in zip(orders, logit_rows, chance_rows, kept):
        if not finite:
            values = [None if v == float("-inf") else v for v in values]
        out.append((k, [{"id": i, "text": text_of(i), "logit": v, "prob": ch}
                        for i, v, ch in zip(order, values, probs)]))
    return out


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


_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> its token_texts


def token_texts(tokenizer) -> Callable[[int], str]:
    """A token id's text, each decoded once per tokenizer: observers that come and go (a
    benchmark attaches one a run) share what the ones before them decoded."""
    if tokenizer is None:
        return _id_text
    text_of = _TEXTS.get(tokenizer)
    if text_of is None:
        owner = weakref.ref(tokenizer)   # the cache must not keep its tokenizer alive

        @functools.lru_cache(maxsize=1 << 16)
        def text_of(token_id: int) -> str:
            return owner().decode([token_id])
        _TEXTS[tokenizer] = text_of
    return text_of


def _id_text(token_id: int) -> str:
    return f"<{token_id}>"
