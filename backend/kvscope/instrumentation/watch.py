"""Who watches which request, and the events built for watched requests only: attention
weights (caught by the side pass in `kvscope.instrumentation.capture`) and the sampler's
view of each draw. Viewers say which layers and heads they want; the side pass captures
the union, and each event carries the union of heads (the server slices per viewer)."""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from kvscope.engine.sampler import apply_min_p, apply_temperature, apply_top_k, apply_top_p
from kvscope.engine.sequence import Sequence

TOP_CANDIDATES = 10
DISTRIBUTION_FULL = 4096   # vocabularies up to this size send every logit
DISTRIBUTION_TOP = 512     # larger ones send this many of the largest
DECIMALS = 4        # a logit's
PROB_DECIMALS = 6   # a probability's
NEG_INF = float("-inf")
_SCALES = np.array([[10.0 ** DECIMALS], [10.0 ** PROB_DECIMALS]])   # a table's logits, its probabilities


@dataclass
class WatchSpec:
    layers: frozenset[int] | None = None   # None: every layer
    heads: frozenset[int] | None = None    # None: every head
    sampling: bool = True
    internals: bool = False                # embeddings, residual stream, MLP, logit lens


@dataclass(frozen=True)
class WatchWanted:
    """What every viewer of one request asks for, together."""
    layers: frozenset[int] | None   # None: every layer
    heads: list[int]                # those of num_heads asked for (all of them when any viewer wants every head)
    sampling: bool
    internals: bool
    num_heads: int


@dataclass
class Watch:
    seq: Sequence
    viewers: dict[str, WatchSpec] = field(default_factory=dict)   # viewer id -> what it wants
    covered: int = 0   # positions [0, covered) have had their rows captured
    fresh: bool = True  # a viewer joined since its last attention event: the next one lists every token
    _wanted: WatchWanted | None = field(default=None, repr=False, compare=False)

    def add(self, viewer: str, spec: WatchSpec) -> None:
        self.viewers[viewer] = spec
        self.fresh = True
        self._wanted = None

    def remove(self, viewer: str) -> None:
        self.viewers.pop(viewer, None)
        self._wanted = None

    def wanted(self, num_heads: int) -> WatchWanted:
        """The union of its viewers' specs, made again only when they change (every step reads it)."""
        if self._wanted is None or self._wanted.num_heads != num_heads:
            specs = list(self.viewers.values())
            layers = None if any(s.layers is None for s in specs) else frozenset().union(*(s.layers for s in specs))
            heads = (list(range(num_heads)) if any(s.heads is None for s in specs) else
                     sorted(h for h in set().union(*(s.heads for s in specs)) if h < num_heads))
            self._wanted = WatchWanted(layers, heads, any(s.sampling for s in specs),
                                       any(s.internals for s in specs), num_heads)
        return self._wanted


class WatchRegistry:
    """The one record of who watches what. Written on the engine thread (watch, unwatch,
    a request's end); read by the server's fan-out on the event loop, hence the lock."""

    def __init__(self):
        self._watches: dict[str, Watch] = {}   # request id -> its watch
        self._lock = threading.Lock()

    def add(self, request_id: str, viewer: str, spec: WatchSpec, seq: Sequence) -> Watch:
        with self._lock:
            w = self._watches.setdefault(request_id, Watch(seq))
            w.add(viewer, spec)
            return w

    def remove(self, request_id: str, viewer: str) -> None:
        with self._lock:
            w = self._watches.get(request_id)
            if w is not None:
                w.remove(viewer)
                if not w.viewers:
                    del self._watches[request_id]

    def drop_viewer(self, viewer: str) -> None:
        with self._lock:
            for rid, w in list(self._watches.items()):
                w.remove(viewer)
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


STAGES = (("temperature", apply_temperature, lambda p: p.temperature, 1.0),   # name, filter, its argument, a no-op one
          ("top_k", apply_top_k, lambda p: p.top_k, 0), ("top_p", apply_top_p, lambda p: p.top_p, 1.0),
          ("min_p", apply_min_p, lambda p: p.min_p, 0.0))


def token_bits(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The first vocab_size bits of each row of an int32 bitmask, as 0/1 ints."""
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten(1)[:, :vocab_size]


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
                    texts: Mapping[int, str], ts: float, with_distribution: list[bool]) -> list[dict]:
    """The sampler's view of each watched draw, every row at once. logits: the model's [rows,
    vocab] rows for `seqs`, on the CPU; `texts`: each token id's text (token_texts: cached, as
    every step shows the likeliest few again); `with_distribution` adds the logits themselves
    (watches that ask for internals). The candidates are listed once (ids and texts); each
    stage shows how many tokens it keeps and the candidates' logits and probabilities, in
    arrays parallel to them; a stage a request does not apply only says so (it changed
    nothing: a greedy row's numbers are its logits stage's). A request under structured
    outputs is shown as the sampler saw it: the
    grammar's forbidden tokens at -inf (`allowed_tokens` counts the rest), while `logprob`
    stays the model's own, as on request.token.

    The filters, the softmax and the candidates are tensor operations over every row at once;
    the candidates' numbers are read out and rounded in one table and reach Python in one
    `tolist`, whose rows are the stages' arrays as sent. What is left per row is a handful of
    dicts around them (a class watches 32 rows a step)."""
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
    orders, index = _candidate_columns(rows, chosen, masked=rows is not model_rows)
    shown, table, final = _stage_table(stages, index)
    if rows is model_rows:   # the model's own probabilities are the first stage's
        logprobs = np.log(table[:, 0, 1, -1])
    else:
        logprobs = model_rows.numpy()[np.arange(n), index[:, -1]] - model_rows.logsumexp(dim=1).double().numpy()
    logprobs = _rounded(logprobs, 10.0 ** PROB_DECIMALS).tolist()
    ranks, cdfs = _draw_places(final, table[:, -1, 1, -1], orders, chosen)
    table = _rounded(table, _SCALES)   # logits to DECIMALS, probabilities to PROB_DECIMALS
    if stages[-1][3]:   # some stage left a token at -inf: a candidate it removed has a null logit
        gone = np.isneginf(table[:, :, 0])
        table = table.astype(object)
        table[:, :, 0][gone] = None
    table = table.tolist()
    events = []
    for r, (seq, p, c, order, values) in enumerate(zip(seqs, params, chosen, orders, table)):
        width = len(order)   # a row's candidates are its first columns (padding and its chosen token follow)
        stages = [{"name": name, "applied": True, "kept": vocab if kept is None else kept[r],
                   "logits": values[block][0][:width], "probs": values[block][1][:width]} if on[r]
                  else {"name": name, "applied": False}   # nothing changed for this row: no numbers
                  for name, on, block, kept in shown]
        p_chosen = values[-1][1][-1]   # in the last shown stage, rounded
        cdf_low, cdf_high = cdfs[r] or (0.0, p_chosen)
        event = {"type": "sampling", "ts": ts, "request_id": seq.request_id, "step": step,
                 "index": seq.num_output_tokens - 1,
                 "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p},
                 "candidates": {"ids": order, "texts": [texts[i] for i in order]}, "stages": stages,
                 "draw": {"method": "sample" if sampled[r] else "greedy", "rank": ranks[r],
                          "cdf_low": cdf_low, "cdf_high": cdf_high},
                 "chosen": {"id": c, "text": texts[c], "prob": p_chosen, "logprob": logprobs[r]}}
        if masks[r] is not None:
            event["allowed_tokens"] = int(masks[r].sum())
        if with_distribution[r]:
            event["distribution"] = raw_distribution(rows[r])
        events.append(event)
    return events


def _candidate_columns(rows: torch.Tensor, chosen: list[int], masked: bool) -> tuple[list[list[int]], np.ndarray]:
    """Each row's candidates (its TOP_CANDIDATES likeliest allowed tokens, and the chosen one
    if it is not among them) and the columns of `rows` to read for them: a row's candidates
    first, then padding, and its chosen token last (the draw's own figures)."""
    top = rows.topk(min(TOP_CANDIDATES, rows.shape[1]), dim=1)
    ids = top.indices.numpy()
    if not masked or bool((top.values[:, -1] > NEG_INF).all()):   # sorted: the last is allowed, so all are
        orders = [order if c in order else order + [c] for order, c in zip(ids.tolist(), chosen)]
        return orders, np.concatenate([ids, np.array(chosen)[:, None]], axis=1)   # a missing chosen: after the top
    # a grammar's mask left fewer
    orders = [[i for i, v in zip(order, values) if v > NEG_INF]
              for order, values in zip(ids.tolist(), top.values.tolist())]
    orders = [order if c in order else order + [c] for order, c in zip(orders, chosen)]
    width = max(map(len, orders)) + 1
    return orders, np.array([order + [order[0]] * (width - 1 - len(order)) + [c] for order, c in zip(orders, chosen)])


def _stage_table(stages: list[tuple], index: np.ndarray) -> tuple[list[tuple], np.ndarray, torch.Tensor]:
    """The candidates' logits and probabilities at every stage some row applies, read out
    of the [rows, vocab] stages into one float64 table [rows, stages shown, 2, columns];
    with, per stage, (name, on, its place in the table, or None: as the stage before; the
    tokens kept per row, or None: the whole vocabulary), and the last stage's probabilities."""
    every_row = np.arange(len(index))[:, None]
    shown, blocks, seen = [], [], None
    for name, on, t, pruned in stages:
        if t is seen:   # no row applied it: every row shows the stage before
            shown.append((name, on, None, None))
            continue
        probs = t.softmax(dim=1)
        shown.append((name, on, len(blocks), torch.isfinite(t).sum(1).tolist() if pruned else None))
        blocks.append((t.numpy()[every_row, index], probs.numpy()[every_row, index]))
        seen = t
    return shown, np.array(blocks, dtype=np.float64).transpose(2, 0, 1, 3), probs


def _draw_places(final: torch.Tensor, p_final: np.ndarray, orders: list[list[int]],
                 chosen: list[int]) -> tuple[list[int], list[tuple[float, float] | None]]:
    """Each draw's place in its sorted final distribution: how many tokens are likelier (its
    rank), and [cdf_low, cdf_high), the mass above it and that plus its own probability,
    rounded. Every filter keeps the likeliest token, so a row that drew it (every greedy row)
    has rank 0 and [0, its probability): None, nothing to compute."""
    ranks, cdfs = [0] * len(chosen), [None] * len(chosen)
    below = [r for r, (order, c) in enumerate(zip(orders, chosen)) if c != order[0]]
    if not below:
        return ranks, cdfs
    part, p_chosen = final[below], p_final[below]
    above = part > torch.from_numpy(p_chosen.astype(np.float32))[:, None]
    scale = 10.0 ** PROB_DECIMALS   # rounded as _rounded rounds
    for r, rank, mass, p in zip(below, above.sum(1).tolist(), (part * above).sum(1).double().tolist(),
                                p_chosen.tolist()):
        ranks[r] = rank
        cdfs[r] = (round(min(mass, 1.0) * scale) / scale, round(min(mass + p, 1.0) * scale) / scale)
    return ranks, cdfs


def _rounded(values: np.ndarray, scale) -> np.ndarray:
    """`values` (float64) rounded as torch's and numpy's round(decimals=) do: scaled, to the nearest even, back."""
    return np.rint(values * scale) / scale


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


class TokenTexts(dict):
    """Token id -> its text, each decoded on first use (a dict, so a lookup is the cheapest
    Python has: a watched class looks up hundreds a step)."""

    def __init__(self, decode: Callable[[int], str]):
        super().__init__()
        self.decode = decode

    def __missing__(self, token_id: int) -> str:
        text = self[token_id] = self.decode(token_id)
        return text


_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> its TokenTexts


def token_texts(tokenizer) -> TokenTexts:
    """Each token id's text, decoded once per tokenizer: observers that come and go (a
    benchmark attaches one a run) share what the ones before them decoded."""
    if tokenizer is None:
        return TokenTexts(_id_text)
    texts = _TEXTS.get(tokenizer)
    if texts is None:
        owner = weakref.ref(tokenizer)   # the cache must not keep its tokenizer alive
        texts = _TEXTS[tokenizer] = TokenTexts(lambda token_id: owner().decode([token_id]))
    return texts


def _id_text(token_id: int) -> str:
    return f"<{token_id}>"
