"""What a watched request's widgets draw, read out of the model by a side pass.

The engine's step runs as it would unwatched (compiled on a CPU, CUDA graphs on a GPU):
fast kernels never materialise attention weights, and no hook runs inside a graph. After
the step, a side pass re-runs the watched rows only, and no further than the deepest
layer anyone watches: the engine's own step for just those rows, except that their K/V
go to the runner's scratch slot (the cache already holds them: the step wrote them). A
forward hook on each watched attention layer takes the rows' queries and rebuilds their
weights against the keys in the paged cache, for the heads viewers asked for, in half
precision, and starts the copy to the host without waiting for it. Rows the prefix cache
spared the engine are included in the same pass, so every prompt row shows. A watch that
asks for the model's internals also hooks every decoder layer (its input and output), its
attention and MLP sublayers and the MLP's gate/up projection, in the same side pass.

With nobody watching there is no side pass and no hook."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from kvscope.engine.block_manager import cdiv
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import StepBuffers, batch_order, prepare_inputs
from kvscope.layers.attention import PagedAttention, gather_context, step_metadata


@dataclass
class SeqView:
    """What the side pass reads of a sequence, as it was when the step was scheduled (by the
    time the side pass runs the engine has appended tokens, and freed a finished one's blocks)."""
    token_ids: list[int]
    block_table: list[int]
    forks: list = field(default_factory=list)


@dataclass
class WatchedRows:
    """One watched sequence's rows: scheduled this step, and recomputed before them."""
    seq: Sequence
    first: int                      # first position the side pass computes (earlier ones were captured)
    step_start: int                 # first position the step computed; [first, step_start) were recomputed
    end: int                        # one past the last position computed
    view: SeqView
    sample_row: int | None = None   # its row among the step's logits, when it samples
    layers: set[int] | None = None  # layers to capture (None: every layer)
    heads: list[int] | None = None  # heads to keep (None: every head)
    internals: bool = False         # also the residual stream and the MLP's activations
    row_start: int = 0              # its first row in the side pass

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


@dataclass
class WatchWanted:
    """What the viewers of one sequence asked for (the registry's union)."""
    first: int                      # positions before it have been captured already
    layers: set[int] | None
    heads: list[int] | None
    internals: bool


def watched_rows(scheduled: SchedulerOutput, wanted: dict[int, WatchWanted]) -> list[WatchedRows]:
    """The watched sequences (seq_id -> what is wanted) in this step's batch."""
    found, sample = [], 0
    for e in batch_order(scheduled.entries):
        w = wanted.get(e.seq.seq_id)
        if w is not None:
            end = e.start + e.num_new_tokens
            view = SeqView(e.seq.token_ids[:end - len(e.spec_token_ids)] + e.spec_token_ids, list(e.seq.block_table))
            found.append(WatchedRows(e.seq, min(w.first, e.start), e.start, end, view,
                                     sample if e.samples else None, w.layers, w.heads, w.internals))
        if e.samples:   # logits rows: one per draft and one more, and one per choice forking here
            sample += 1 + len(e.spec_token_ids) + len(e.forks)
    return found


def attention_weights(q: torch.Tensor, keys: torch.Tensor, positions: list[int], scale: float) -> torch.Tensor:
    """q: [rows, H, D] at absolute `positions`; keys: [context, KVH, D] → causal softmax
    weights [H, rows, context] in float32."""
    q, keys = q.float(), keys.float()
    keys = keys.repeat_interleave(q.shape[1] // keys.shape[1], dim=1)
    scores = torch.einsum("rhd,chd->hrc", q, keys) * scale
    pos = torch.tensor(positions, device=scores.device)[:, None]
    causal = torch.arange(keys.shape[0], device=scores.device)[None, :] <= pos
    return scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)


def last_row_weights(q: torch.Tensor, keys: torch.Tensor, lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Many sequences' newest row at once (decode steps). q: [N, H, D]; keys: [N, C, KVH, D],
    each padded past its own length `lens` → weights [N, H, C] in float32 (0 past each length)."""
    n, num_heads, d = q.shape
    num_kv_heads = keys.shape[2]
    grouped = q.float().view(n, num_kv_heads, num_heads // num_kv_heads, d)   # query heads sharing a KV head
    by_head = keys.float().transpose(1, 2).contiguous()                         # [N, KVH, C, D]
    scores = torch.matmul(grouped, by_head.transpose(-1, -2)).reshape(n, num_heads, -1) * scale
    valid = torch.arange(keys.shape[1], device=q.device)[None, :] < lens[:, None]
    return scores.masked_fill(~valid[:, None, :], float("-inf")).softmax(dim=-1)


class HostCopy:
    """A tensor on its way to the host. On a GPU the copy goes into pinned memory on a side
    stream, so the engine's next step is not held up; reading it (np.asarray, as the
    encoder does off the engine thread) waits for that copy only."""
    _streams: dict[torch.device, torch.cuda.Stream] = {}

    def __init__(self, t: torch.Tensor):
        self.shape, self.done = tuple(t.shape), None
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
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy() if dtype is None else self.host.numpy().astype(dtype)

    def __getitem__(self, key) -> "HostView":
        return HostView(self, key)


@dataclass
class HostView:
    """Part of a HostCopy (one sequence's rows of a batched copy), cut when it is read."""
    copy: HostCopy
    key: tuple

    def __array__(self, dtype=None, copy=None):
        part = np.asarray(self.copy)[self.key]
        return part if dtype is None else part.astype(dtype)


@dataclass
class SideCapture:
    """The side pass's hooks and what they caught."""
    watched: list[WatchedRows]
    block_size: int
    # (seq, layer, recomputed) -> (positions, weights [heads, rows, context], mean over every
    # head [rows, context]), in float16
    attention: dict[tuple[int, int, bool], tuple[list[int], HostView, HostView]] = field(default_factory=dict)
    # internals, float32 on the CPU, [rows, ...] each: (seq, layer, what) -> tensor, where
    # what is "input", "attention" (the sublayer's output), "mlp", "output", "gate", "up"
    tensors: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict)
    _handles: list = field(default_factory=list)
    _blocks: dict[int, torch.Tensor] = field(default_factory=dict)   # seq -> blocks holding its context
    _tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)   # decode rows' padded tables

    def install(self, layers) -> "SideCapture":
        for i, layer in enumerate(layers):
            if any(w.wants(i) for w in self.watched):
                self._handles.append(layer.self_attn.attn.register_forward_hook(self._on_attention))
        if any(w.internals for w in self.watched):
            for i, layer in enumerate(layers):
                self._handles += [
                    layer.register_forward_pre_hook(lambda m, args, i=i: self._keep(i, "input", args[1])),
                    layer.register_forward_hook(lambda m, args, out, i=i: self._keep(i, "output", out)),
                    layer.self_attn.register_forward_hook(lambda m, args, out, i=i: self._keep(i, "attention", out)),
                    layer.mlp.register_forward_hook(lambda m, args, out, i=i: self._keep(i, "mlp", out)),
                    layer.mlp.gate_up_proj.register_forward_hook(lambda m, args, out, i=i: self._keep_gate_up(i, out)),
                ]
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _keep(self, layer: int, what: str, t: torch.Tensor) -> None:
        for w in self.watched:
            if w.internals:
                self.tensors[(w.seq.seq_id, layer, what)] = t[w.rows].float().cpu()

    def _keep_gate_up(self, layer: int, t: torch.Tensor) -> None:
        gate, up = t.chunk(2, dim=-1)
        self._keep(layer, "gate", gate)
        self._keep(layer, "up", up)

    def _on_attention(self, module: PagedAttention, inputs, _output) -> None:
        q, layer = inputs[0], module.layer_idx
        keys = module.readable_caches()[0]
        watching = [w for w in self.watched if w.wants(layer)]
        decodes = [w for w in watching if w.end - w.first == 1]
        if decodes:   # one batched product for every sequence's single row
            tables, lens = self._decode_tables(decodes, q.device)
            probs = last_row_weights(q[[w.row_start for w in decodes]], gather_context(keys, tables), lens,
                                     module.scale)
            # one conversion and one copy to the host for all of them; each event reads its part
            halves, means = HostCopy(probs.half()), HostCopy(probs.mean(1).half())
            for i, w in enumerate(decodes):
                heads = slice(None) if w.heads is None or len(w.heads) == probs.shape[1] else w.heads
                self.attention[(w.seq.seq_id, layer, False)] = (
                    [w.first], halves[i, heads, None, :w.end], means[i, None, :w.end])
        for w in watching:
            if w.end - w.first > 1:
                blocks = self._blocks_of(w, q.device)
                probs = attention_weights(q[w.rows], gather_context(keys, blocks, w.end), w.positions, module.scale)
                kept = HostCopy((probs if w.heads is None or len(w.heads) == probs.shape[0] else probs[w.heads]).half())
                mean = HostCopy(probs.mean(0).half())
                for rows, positions, context, recomputed in w.parts():   # the recomputed rows, the step's
                    self.attention[(w.seq.seq_id, layer, recomputed)] = (
                        positions, kept[:, rows, :context], mean[rows, :context])

    def _blocks_of(self, w: WatchedRows, device) -> torch.Tensor:
        if w.seq.seq_id not in self._blocks:
            self._blocks[w.seq.seq_id] = torch.tensor(w.view.block_table[:cdiv(w.end, self.block_size)],
                                                      dtype=torch.long, device=device)
        return self._blocks[w.seq.seq_id]

    def _decode_tables(self, decodes: list[WatchedRows], device) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode rows' block tables, padded to the widest (block 0: read, then masked), and their context lengths."""
        key = tuple(w.seq.seq_id for w in decodes)
        if key not in self._tables:
            width = max(cdiv(w.end, self.block_size) for w in decodes)
            rows = [w.view.block_table[:cdiv(w.end, self.block_size)] for w in decodes]
            self._tables[key] = (torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device),
                                 torch.tensor([w.end for w in decodes], device=device))
        return self._tables[key]


@torch.inference_mode()
def side_pass(model: torch.nn.Module, runner, watched: list[WatchedRows], buffers: StepBuffers) -> SideCapture:
    """Run the watched rows again, after the step, as far as the deepest watched layer."""
    layers = model.model.layers
    out = SchedulerOutput(step=-1, entries=[w.entry() for w in watched])
    row = 0
    by_seq = {id(w.view): w for w in watched}
    for e in batch_order(out.entries):   # where prepare_inputs puts each sequence's rows
        by_seq[id(e.seq)].row_start = row
        row += e.num_new_tokens
    inputs = prepare_inputs(out, runner.block_size, buffers, runner.routes.eager)
    capture = SideCapture(watched, runner.block_size).install(layers)
    try:
        run_layers(model, inputs, runner.scratch_slot, max(w.depth(len(layers)) for w in watched))
    finally:
        capture.remove()
    return capture


def run_layers(model: torch.nn.Module, inputs, scratch_slot: int, depth: int) -> None:
    """The decoder's first `depth` layers over a step's inputs, writing K/V to the scratch
    slot (the one place that knows how a step hands its metadata to the attention layers)."""
    md = replace(inputs.metadata, slot_mapping=torch.full_like(inputs.metadata.slot_mapping, scratch_slot))
    decoder = model.model
    with step_metadata(model, md):   # the decoder's forward, stopped after `depth` layers
        x = decoder.embed_tokens(inputs.input_ids)
        rope = decoder.rotary.cos_sin(inputs.positions, x.dtype)
        for layer in decoder.layers[:depth]:
            x = layer(rope, x)
