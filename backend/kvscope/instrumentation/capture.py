"""What a watched request's widgets draw, read from the engine's own step.

The step runs as it would unwatched (compiled on a CPU, CUDA graphs on a GPU). In a decode
step on the CPU kernels, the decode kernel itself writes the watched rows' attention weights
and their mean over the heads, in half precision, while their keys are in cache
(weights.py watch_rows: the same graph, no second read of the keys). Otherwise each
attention layer copies queries into a tensor made before the step (attention.KeptQueries, a
copy_ that a compiled graph and a CUDA graph make too): every row's in a decode step, whose
graph keeps the shapes it was recorded with, the watched rows' in a step with prompts. After
the step, the watched rows' weights are computed from those queries and the keys the step
has just written to the paged cache, for the layers and heads viewers asked for: on a CPU by
the C kernel beside the decode kernel, which reads each row's keys in place through its block
table; on a GPU the decode rows' by a Triton kernel that does the same (both in weights.py);
elsewhere (a quantized cache, a GPU's prompt rows) from keys gathered out of the pool, the
decode rows of every watched sequence and layer in one batched product. Kept in half
precision and copied to the host without waiting (HostCopy).

A side pass runs only for what the step did not compute: rows the prefix cache spared the
engine (the first step a request is watched, so every prompt row shows) and a watch of the
model's internals (the residual stream and the MLP, caught by forward hooks on every decoder
layer). It re-runs those sequences' rows, no further than the deepest layer needed, writing
their K/V to the engine's scratch slot (the cache holds them already), and keeps its queries
the same way.

With nobody watching nothing is kept and nothing runs after the step."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from kvscope.engine.block_manager import cdiv
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import (MAX_DECODE_GROUPS, MIN_DECODE_GROUP, StepBuffers, batch_order,
                                       prepare_inputs)
from kvscope.instrumentation.watch import Watch
from kvscope.instrumentation.weights import cpu_weights, triton_usable, triton_weights, watch_rows
from kvscope.layers.attention import KeptQueries, Route, gather_context, query_room, step_metadata
from kvscope.layers.kernels import cpu_unavailable


class SeqView:
    """What capture reads of a sequence, as it was when the step was scheduled (by the time
    capture runs the engine has appended tokens, and freed a finished one's blocks). Its
    tokens are the sequence's own up to the step's end, read when asked for: the engine only
    appends past them (a stop string cuts only what the step drew), and most rows never ask."""

    def __init__(self, seq: Sequence, end: int, spec_token_ids: list[int]):
        self.seq, self.end, self.spec_token_ids = seq, end, spec_token_ids
        self.block_table = list(seq.block_table)
        self.forks: list = []

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[:self.end - len(self.spec_token_ids)] + self.spec_token_ids


@dataclass
class WatchedRows:
    """One watched sequence's rows: scheduled this step, and recomputed before them."""
    seq: Sequence
    first: int                      # first position captured (earlier ones were, in earlier steps)
    step_start: int                 # first position the step computed; [first, step_start) were recomputed
    end: int                        # one past the last position computed
    view: SeqView
    sample_row: int | None = None   # its row among the step's logits, when it samples
    layers: set[int] | None = None  # layers to capture (None: every layer)
    heads: list[int] | None = None  # heads to keep (None: every head)
    internals: bool = False         # also the residual stream and the MLP's activations
    row_start: int = 0              # its first row in the side pass, when it takes one
    batch_index: int = 0            # its place in the step's batch order

    @property
    def positions(self) -> list[int]:
        return list(range(self.first, self.end))

    @property
    def rows(self) -> slice:
        return slice(self.row_start, self.row_start + self.end - self.first)

    def parts(self) -> list[tuple[slice, list[int], int, bool]]:
        """(its rows among this sequence's, their positions, their context, recomputed): the
        rows the prefix cache spared, then the step's own."""
        cut = self.step_start - self.first
        parts = [(slice(0, cut), list(range(self.first, self.step_start)), self.step_start, True)] if cut else []
        return parts + [(slice(cut, None), list(range(self.step_start, self.end)), self.end, False)]

    @property
    def side(self) -> bool:
        """It needs the side pass: rows the step did not compute, or the model's internals."""
        return self.internals or self.first < self.step_start

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def depth(self, num_layers: int) -> int:
        """Layers the side pass must run for this sequence."""
        if self.internals or self.layers is None:
            return num_layers
        return max(self.layers, default=-1) + 1

    def entry(self) -> ScheduledSeq:
        """Its part of the side pass, as the scheduler would have planned it."""
        n = self.end - self.first
        return ScheduledSeq(self.view, n, self.first, False, "decode" if n == 1 else "prefill")


def watched_rows(scheduled: SchedulerOutput, watches: Mapping[int, Watch], num_heads: int) -> list[WatchedRows]:
    """The watched sequences (seq_id -> its watch) in this step's batch."""
    found, sample = [], 0
    for i, e in enumerate(batch_order(scheduled.entries)):
        w = watches.get(e.seq.seq_id)
        if w is not None:
            end, wanted = e.start + e.num_new_tokens, w.wanted(num_heads)
            found.append(WatchedRows(e.seq, min(w.covered, e.start), e.start, end, SeqView(e.seq, end, e.spec_token_ids),
                                     sample if e.samples else None, wanted.layers, wanted.heads, wanted.internals,
                                     batch_index=i))
        if e.samples:   # logits rows: one per draft and one more, and one per choice forking here
            sample += 1 + len(e.spec_token_ids) + len(e.forks)
    return found


def attention_weights(q: torch.Tensor, keys: torch.Tensor, positions: list[int], scale: float) -> torch.Tensor:
    """q: [rows, H, D] at absolute `positions`; keys: [context, KVH, D] → causal softmax
    weights [H, rows, context] in float32 (the eager model's, as transformers computes them)."""
    q, keys = q.float(), keys.float()
    keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
    scores = torch.einsum("rhd,chd->hrc", q, keys) * scale
    pos = torch.tensor(positions, device=scores.device)[:, None]
    causal = torch.arange(keys.shape[0], device=scores.device)[None, :] <= pos
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)


def spread_heads(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q: [N, H, D] → [N, H, KVH * D]: each query head laid over the width of every KV head's
    keys, zero but for its own, so one product with a row's gathered keys as they lie
    ([C, KVH * D], no copy per KV head) gives every head's scores."""
    n, num_heads, d = q.shape
    spread = q.new_zeros(n, num_kv_heads, num_heads // num_kv_heads, num_kv_heads, d)
    own = torch.arange(num_kv_heads, device=q.device)
    spread[:, own, :, own, :] = q.view(n, num_kv_heads, -1, d).transpose(0, 1)
    return spread.view(n, num_heads, -1)


class HostCopy:
    """A tensor on its way to the host. On a GPU the copy goes into pinned memory on a side
    stream, so the engine's next step is not held up; reading it (np.asarray, as the
    encoder does off the engine thread) waits for that copy only."""
    _streams: dict[torch.device, torch.cuda.Stream] = {}

    def __init__(self, t: torch.Tensor):
        self.shape, self.done, self.array = tuple(t.shape), None, None
        if t.device.type != "cuda":
            self.host = t
            return
        stream = self._streams.setdefault(t.device, torch.cuda.Stream(t.device))
        stream.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(stream):
            self.host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.host.copy_(t, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record(stream)
        t.record_stream(stream)   # its memory is not reused before the copy has read it

    def __array__(self, dtype=None, copy=None):
        if self.array is None:   # once: every event of a step reads its part of one copy
            if self.done is not None:
                self.done.synchronize()
            self.array = self.host.numpy()
        return self.array if dtype is None else self.array.astype(dtype)

    def __getitem__(self, key) -> "HostView":
        return HostView(self, (key,))

    def parts(self) -> "HostCopy | np.ndarray":
        """What to cut each event's part from: on the host already (a CPU's), the array
        itself, whose views cost nothing to make and nothing to read."""
        return self if self.done is not None else self.__array__()


@dataclass
class HostView:
    """Part of a HostCopy (one sequence's rows of a batched copy), cut when it is read:
    `keys` index it one after the other, as numpy would."""
    copy: HostCopy
    keys: tuple

    def __getitem__(self, key) -> "HostView":
        return HostView(self.copy, self.keys + (key,))

    def __array__(self, dtype=None, copy=None):
        part = self.copy.__array__()
        for key in self.keys:
            part = part[key]
        return part if dtype is None else part.astype(dtype)


@dataclass
class StepWeights:
    """A decode step's watched rows' weights, written by the CPU decode kernel as it read their
    keys (weights.py watch_rows): every layer's, every head's."""
    weights: torch.Tensor                                    # [layers, rows, H, width] float16
    means: torch.Tensor                                      # [layers, rows, width] float16
    by_seq: dict[int, int]                                   # seq_id -> its row among them


@dataclass
class StepQueries:
    """The queries a step keeps for capture, and where each watched sequence's rows are among them."""
    kept: KeptQueries                                        # what the step itself is handed
    by_seq: dict[int, slice] = field(default_factory=dict)   # seq_id -> its rows of kept.out


class QueryKeeper:
    """The model runner's `keep_queries` while someone watches: which rows' queries a step
    keeps. A decode step on the CPU kernels keeps none: the decode kernel writes the watched
    rows' weights itself, its keys in cache (`watch_rows`, the same step, compiled or not).
    Elsewhere a decode step keeps every row (a decode graph keeps the shapes it was recorded
    with, and a decode row is small); a step with prompts only the watched sequences' rows.
    The step is handed a plain KeptQueries, the type the compiled graph was warmed up with
    (a subclass fails its guards and recompiles it)."""

    def __init__(self, engine):
        self.layers, self.dtype, self.device = engine.model.attention_layers, engine.dtype, engine.device
        self.in_kernel = engine.plan.attention.eager is Route.CPU_KERNELS and in_place(self.layers[0])
        self.seq_ids: set[int] = set()   # whose rows the next step keeps
        self.rows: list[WatchedRows] = []  # theirs, in batch order (where a decode step's kernel finds them)
        self.kept: StepQueries | StepWeights | None = None   # what the last step run kept
        self.writing = False   # whether the layers' decode kernels write weights

    def take(self) -> StepQueries | StepWeights | None:
        """What the last step kept; its layers stop writing weights."""
        self.release()
        return self.kept

    def release(self) -> None:
        if self.writing:
            watch_rows(self.layers, None)
            self.writing = False

    def __call__(self, out: SchedulerOutput, decode: bool) -> KeptQueries | None:
        self.release()
        if decode and self.in_kernel:   # one row a sequence, in batch order
            self.kept = self._in_kernel(out)
            return None
        by_seq, taken, row = {}, [], 0
        for e in batch_order(out.entries):   # where prepare_inputs puts each sequence's rows
            n = e.num_new_tokens
            if e.seq.seq_id in self.seq_ids:
                first = row if decode else len(taken)
                by_seq[e.seq.seq_id] = slice(first, first + n)
                taken += range(row, row + n)
            row += n
        self.kept = None if not by_seq else StepQueries(KeptQueries(
            slice(None) if decode else torch.tensor(taken, device=self.device),
            query_room(self.layers, row if decode else len(taken), self.dtype, self.device)), by_seq)
        return None if self.kept is None else self.kept.kept

    def _in_kernel(self, out: SchedulerOutput) -> StepWeights | None:
        """Ask each layer's decode kernel for the watched rows' weights (rows in batch order)."""
        if not self.rows:
            return None
        slots, by_seq, width = [-1] * len(out.entries), {}, 0
        for r in self.rows:   # a decode row's batch index is its row
            slots[r.batch_index] = by_seq[r.seq.seq_id] = len(by_seq)
            width = max(width, r.end)
        layer = self.layers[0]
        kept = StepWeights(torch.empty(len(self.layers), len(by_seq), layer.num_heads, width, dtype=torch.float16),
                           torch.empty(len(self.layers), len(by_seq), width, dtype=torch.float16), by_seq)
        watch_rows(self.layers, torch.tensor(slots, dtype=torch.int32), kept.weights, kept.means)
        self.writing = True
        return kept


@dataclass
class Capture:
    """What capture computed for a step's watched rows."""
    watched: list[WatchedRows]
    # (seq, recomputed) -> (its layers, positions, weights [layers, heads, rows, context], mean
    # over every head [layers, rows, context]), in float16: one attention event each
    attention: dict[tuple[int, bool], tuple[list[int], list[int], HostView | np.ndarray, HostView | np.ndarray]] = (
        field(default_factory=dict))
    # internals, float32 on the CPU, [rows, ...] each: (seq, layer, what) -> tensor, where
    # what is "input", "attention" (the sublayer's output), "mlp", "output", "gate", "up"
    tensors: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict)


@torch.inference_mode()
def capture(engine, watched: list[WatchedRows], kept: StepQueries | StepWeights | None,
            buffers: StepBuffers) -> Capture:
    """Attention weights (and internals) for the step's watched rows: as the step wrote them, or
    from their queries, which the step kept or a side pass computes."""
    result = Capture(watched)
    layers, block_size = engine.model.attention_layers, engine.plan.block_size
    if isinstance(kept, StepWeights):   # the decode kernel wrote them: every layer, every head
        written = [w for w in watched if not w.side and w.seq.seq_id in kept.by_seq]
        _hand_out(written, [kept.by_seq[w.seq.seq_id] for w in written], [layer.layer_idx for layer in layers],
                  kept.weights.numpy(), kept.means.numpy(), result)
        if len(written) == len(watched):
            return result
        done = {id(w) for w in written}
        watched = [w for w in watched if id(w) not in done]
        kept = None
    from_step = [w for w in watched if not w.side and kept is not None and w.seq.seq_id in kept.by_seq]
    stacked = torch.stack(kept.kept.out) if from_step else None   # [layers, rows, H, D]
    queries = {w.seq.seq_id: stacked[:, kept.by_seq[w.seq.seq_id]] for w in from_step}
    # the side pass runs as deep as any row is drawn: decode rows are computed together
    if rest := [w for w in watched if w.seq.seq_id not in queries]:
        queries |= side_pass(engine, rest, max(w.depth(len(layers)) for w in watched), buffers, result)
    # decode rows in groups of similar context length (as the reference attention groups them):
    # each group is padded to its own longest context, not to the longest of all. The C
    # kernel reads no padding, so it takes them all in one call a layer
    if decodes := sorted((w for w in watched if w.end - w.first == 1), key=lambda w: w.end):
        groups = 1 if in_place(layers[0]) else min(MAX_DECODE_GROUPS, cdiv(len(decodes), MIN_DECODE_GROUP))
        size = cdiv(len(decodes), groups)
        for start in range(0, len(decodes), size):
            _decode_weights(layers, decodes[start:start + size], queries, block_size, result)
    for w in watched:
        if w.end - w.first > 1:
            table, positions = w.view.block_table[:cdiv(w.end, block_size)], w.positions
            drawn = [layer for layer in layers if w.wants(layer.layer_idx)]
            if drawn and in_place(drawn[0]):   # causal: row r sees the keys up to its own position
                tables = torch.tensor([table], dtype=torch.int32).expand(len(positions), -1).contiguous()
                lens = torch.arange(w.first + 1, w.end + 1, dtype=torch.int32)
                written = torch.empty(len(drawn), len(positions), layers[0].num_heads, w.end, dtype=torch.float16)
                means = torch.empty(len(drawn), len(positions), w.end, dtype=torch.float16)   # each layer's, in place
                for layer, out, mean in zip(drawn, written, means):
                    cpu_weights(queries[w.seq.seq_id][layer.layer_idx].contiguous(), layer.k_cache, tables, lens,
                                layer.scale, out, mean)
                per_layer = [_heads(halves, w.heads) for halves in written.transpose(1, 2)]
            else:
                per_layer, means = [], []
                for layer in drawn:
                    keys = gather_context(layer.readable_caches()[0], torch.tensor(table, device=engine.device), w.end)
                    probs = attention_weights(queries[w.seq.seq_id][layer.layer_idx], keys, positions, layer.scale)
                    per_layer.append(_heads(probs.half(), w.heads))
                    means.append(probs.mean(0).half())
                means = torch.stack(means) if drawn else None
            if drawn:   # one copy for every layer: [layers, heads, rows, context], [layers, rows, context]
                kept_heads, mean = HostCopy(torch.stack(per_layer)).parts(), HostCopy(means).parts()
                numbers = [layer.layer_idx for layer in drawn]
                for rows, positions, context, recomputed in w.parts():   # the recomputed rows, the step's
                    result.attention[(w.seq.seq_id, recomputed)] = (
                        numbers, positions, kept_heads[:, :, rows, :context], mean[:, rows, :context])
    return result


def _decode_weights(layers, decodes: list[WatchedRows], queries: dict, block_size: int, result: Capture) -> None:
    """Every decode row of `decodes` (sorted by context length) in every layer any of them
    wants: one softmax, one copy to the host for all of them; each event reads its part."""
    wanted = [layer for layer in layers if any(w.wants(layer.layer_idx) for w in decodes)]
    if not wanted:
        return
    width = max(cdiv(w.end, block_size) for w in decodes)
    device = layers[0].k_cache.device
    tables = [w.view.block_table[:cdiv(w.end, block_size)] + [0] * (width - cdiv(w.end, block_size))
              for w in decodes]   # padding: block 0 (the kernel stops at each row's length; gathering masks it)
    n, context = len(decodes), max(w.end for w in decodes)
    q = torch.cat([queries[w.seq.seq_id] for w in decodes], dim=1)[[layer.layer_idx for layer in wanted]]
    num_heads = q.shape[2]
    if in_place(wanted[0]):   # the C kernel reads each row's keys where they lie, and writes halves and means
        tables = torch.tensor(tables, dtype=torch.int32)
        lens = torch.tensor([w.end for w in decodes], dtype=torch.int32)
        halves = torch.empty(len(wanted), n, num_heads, context, dtype=torch.float16)
        means = torch.empty(len(wanted), n, context, dtype=torch.float16)
        for i, layer in enumerate(wanted):
            cpu_weights(q[i], layer.k_cache, tables, lens, layer.scale, halves[i], means[i])
    else:   # a GPU: Triton reads each row's keys in place (a quantized cache: gathered, dequantized)
        tables = torch.tensor(tables, dtype=torch.int32, device=device)
        if triton_usable(wanted[0]):
            lens = torch.tensor([w.end for w in decodes], dtype=torch.int32, device=device)
            probs = torch.stack([triton_weights(q[i], layer.k_cache, tables, lens, layer.scale, context)
                                 for i, layer in enumerate(wanted)])
        else:
            probs = _gathered_decode_weights(wanted, decodes, q, tables, context)
        halves, means = probs.half(), probs.mean(2).half()
    # [layers, seqs, H, C], [layers, seqs, C]
    _hand_out(decodes, range(n), [layer.layer_idx for layer in wanted], HostCopy(halves).parts(),
              HostCopy(means).parts(), result)


def _hand_out(decodes: list[WatchedRows], rows, numbers: list[int], halves, means, result: Capture) -> None:
    """Each decode row's attention event: its layers and heads of halves [layers, rows, H, C]
    and means [layers, rows, C] (layers `numbers`; decodes[j] is row rows[j]), cut to its context."""
    num_heads = halves.shape[2]
    for i, w in zip(rows, decodes):
        heads = _head_index(w.heads, num_heads)
        mine = numbers if w.layers is None else [n for n in numbers if n in w.layers]
        index = slice(None) if len(mine) == len(numbers) else [numbers.index(n) for n in mine]
        weights = halves[index, i] if isinstance(heads, slice) else halves[index, i][:, heads]
        result.attention[(w.seq.seq_id, False)] = (
            mine, [w.first], weights[:, :, None, :w.end], means[index, i, None, :w.end])


def _gathered_decode_weights(wanted, decodes: list[WatchedRows], q: torch.Tensor, tables: torch.Tensor,
                             context: int) -> torch.Tensor:
    """q [layers, seqs, H, D] → softmax weights [layers, seqs, H, context], each row's keys
    gathered out of the pool (any device, any cache format), masked past its length."""
    n, device = len(decodes), q.device
    spread = spread_heads(q.flatten(0, 1).float() * wanted[0].scale, wanted[0].num_kv_heads)   # [layers * seqs, H, .]
    scores = torch.empty(len(wanted) * n, spread.shape[1], context, device=device)
    for i, layer in enumerate(wanted):   # q·k for every row's context, up to the longest
        keys = gather_context(layer.readable_caches()[0], tables, context).float()   # [seqs, C, KVH, D]
        torch.bmm(spread[i * n:(i + 1) * n], keys.flatten(2).transpose(1, 2), out=scores[i * n:(i + 1) * n])
    scores = scores.view(len(wanted), n, *scores.shape[1:])
    if decodes[0].end < context:   # shorter contexts than the longest: mask their padding
        lens = torch.tensor([w.end for w in decodes], device=device)
        past = torch.arange(context, device=device)[None, :] >= lens[:, None]
        scores.masked_fill_(past[None, :, None, :], float("-inf"))
    return scores.softmax(dim=-1)


def in_place(layer) -> bool:
    """Whether this layer's weights can be read from its cache in place, by the C kernel: a
    plain (not quantized) cache on the CPU in a dtype the kernel takes, and a compiler."""
    return (not layer.kv_format.quantized and layer.k_cache.device.type == "cpu"
            and cpu_unavailable(layer.k_cache.dtype) is None)


def _head_index(heads: list[int] | None, num_heads: int) -> slice | list[int]:
    return slice(None) if heads is None or len(heads) == num_heads else heads


def _heads(probs: torch.Tensor, heads: list[int] | None) -> torch.Tensor:
    """probs [H, ...] cut to the heads asked for."""
    index = _head_index(heads, probs.shape[0])
    return probs if isinstance(index, slice) else probs[index]


def side_pass(engine, watched: list[WatchedRows], depth: int, buffers: StepBuffers,
              result: Capture) -> dict[int, torch.Tensor]:
    """Run these sequences' rows again through the first `depth` layers, keeping their
    queries (returned: seq_id -> [layers, rows, H, D]) and, for a watch of the internals,
    each decoder layer's tensors (into result.tensors)."""
    model, layers = engine.model, engine.model.model.layers
    out = SchedulerOutput(step=-1, entries=[w.entry() for w in watched])
    row = 0
    by_view = {id(w.view): w for w in watched}
    for e in batch_order(out.entries):   # where prepare_inputs puts each sequence's rows
        by_view[id(e.seq)].row_start = row
        row += e.num_new_tokens
    inputs = prepare_inputs(out, engine.plan.block_size, buffers, engine.plan.attention.eager)
    # every layer's room (those past `depth` stay unused)
    kept = KeptQueries(slice(None), query_room(model.attention_layers, row, engine.dtype, engine.device))
    md = replace(inputs.metadata, queries=kept,   # K/V to the scratch slot: the cache holds them already
                 slot_mapping=torch.full_like(inputs.metadata.slot_mapping, engine.plan.scratch_slot))
    handles = _internals_hooks(layers, watched, result) if any(w.internals for w in watched) else []
    try:
        with step_metadata(model, md):   # the decoder's forward, stopped after `depth` layers
            x = model.model.embed_tokens(inputs.input_ids)
            rope = model.model.rotary.cos_sin(inputs.positions, x.dtype)
            for decoder_layer in layers[:depth]:
                x = decoder_layer(rope, x)
    finally:
        for handle in handles:
            handle.remove()
    stacked = torch.stack(kept.out)
    return {w.seq.seq_id: stacked[:, w.rows] for w in watched}


def _internals_hooks(layers, watched: list[WatchedRows], result: Capture) -> list:
    """Forward hooks on every decoder layer (its input and output), its attention and MLP
    sublayers and the MLP's gate/up projection, keeping the watched rows' tensors."""
    def keep(layer: int, what: str, t: torch.Tensor) -> None:
        for w in watched:
            if w.internals:
                result.tensors[(w.seq.seq_id, layer, what)] = t[w.rows].float().cpu()

    def keep_gate_up(layer: int, t: torch.Tensor) -> None:
        gate, up = t.chunk(2, dim=-1)
        keep(layer, "gate", gate)
        keep(layer, "up", up)

    handles = []
    for i, layer in enumerate(layers):
        handles += [
            layer.register_forward_pre_hook(lambda m, args, i=i: keep(i, "input", args[1])),
            layer.register_forward_hook(lambda m, args, out, i=i: keep(i, "output", out)),
            layer.self_attn.register_forward_hook(lambda m, args, out, i=i: keep(i, "attention", out)),
            layer.mlp.register_forward_hook(lambda m, args, out, i=i: keep(i, "mlp", out)),
            layer.mlp.gate_up_proj.register_forward_hook(lambda m, args, out, i=i: keep_gate_up(i, out)),
        ]
    return handles
