"""Forward hooks that read a watched request's tensors out of the running model.

Installed on the model's modules for one step, only when a watched request is in the
batch, and removed right after it; with nobody watching the model runs without a single
hook. Fast kernels never materialise attention weights, so the attention hook rebuilds
them for the watched rows from their queries and the keys in the paged cache. A watch
that asks for the model's internals also hooks every decoder layer (its input and
output), its attention and MLP sublayers and the MLP's gate/up projection."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.engine.step_inputs import batch_order
from kvscope.engine.scheduler import SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.layers.attention import PagedAttention, PrefillSpan, gather_context, span_metadata, step_metadata
from kvscope.engine.block_manager import cdiv


@dataclass
class WatchedRows:
    """Where one watched sequence sits in a step's flattened batch."""
    seq: Sequence
    row_start: int                 # first row of the sequence among the step's tokens
    positions: list[int]           # absolute positions of its rows
    sample_row: int | None = None  # its row among the step's logits, when it samples
    layers: set[int] | None = None  # layers to capture (None: every layer)
    internals: bool = False        # also the residual stream and the MLP's activations

    @property
    def rows(self) -> slice:
        return slice(self.row_start, self.row_start + len(self.positions))

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers


def watched_rows(scheduled: SchedulerOutput, wanted: dict[int, tuple[set[int] | None, bool]]) -> list[WatchedRows]:
    """The rows of the watched sequences (seq_id -> (layers, internals)) in this step's batch."""
    found, row, sample = [], 0, 0
    for e in batch_order(scheduled.entries):
        if e.seq.seq_id in wanted:
            layers, internals = wanted[e.seq.seq_id]
            found.append(WatchedRows(e.seq, row, list(range(e.start, e.start + e.num_new_tokens)),
                                     sample if e.samples else None, layers, internals))
        row += e.num_new_tokens
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


@dataclass
class StepCapture:
    """The hooks for one forward pass and what they caught."""
    model: torch.nn.Module
    watched: list[WatchedRows]
    block_size: int
    attention: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (seq, layer) -> [H, R, C]
    logits: dict[int, torch.Tensor] = field(default_factory=dict)                 # seq -> [vocab] (cpu)
    # internals, float32 on the CPU, [rows, ...] each: (seq, layer, what) -> tensor, where
    # what is "input", "attention" (the sublayer's output), "mlp", "output", "gate", "up"
    tensors: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict)
    _handles: list = field(default_factory=list)

    def install(self) -> "StepCapture":
        for module in self.model.modules():
            if isinstance(module, PagedAttention):
                self._handles.append(module.register_forward_hook(self._on_attention))
        if any(w.internals for w in self.watched):
            for i, layer in enumerate(self.model.model.layers):
                self._handles += [
                    layer.register_forward_pre_hook(lambda m, args, i=i: self._keep(i, "input", args[1])),
                    layer.register_forward_hook(lambda m, args, out, i=i: self._keep(i, "output", out)),
                    layer.self_attn.register_forward_hook(lambda m, args, out, i=i: self._keep(i, "attention", out)),
                    layer.mlp.register_forward_hook(lambda m, args, out, i=i: self._keep(i, "mlp", out)),
                    layer.mlp.gate_up_proj.register_forward_hook(lambda m, args, out, i=i: self._keep_gate_up(i, out)),
                ]
        self._handles.append(self.model.lm_head.register_forward_hook(self._on_logits))
        return self

    def _keep(self, layer: int, what: str, t: torch.Tensor) -> None:
        for w in self.watched:
            if w.internals:
                self.tensors[(w.seq.seq_id, layer, what)] = t[w.rows].float().cpu()

    def _keep_gate_up(self, layer: int, t: torch.Tensor) -> None:
        gate, up = t.chunk(2, dim=-1)
        self._keep(layer, "gate", gate)
        self._keep(layer, "up", up)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_attention(self, module: PagedAttention, inputs, _output) -> None:
        q, k, _v = inputs
        for w in self.watched:
            if not w.wants(module.layer_idx):
                continue
            context = w.positions[-1] + 1
            blocks = torch.tensor(w.seq.block_table[:cdiv(context, self.block_size)],
                                  dtype=torch.long, device=q.device)
            keys = gather_context(module.readable_caches()[0], blocks, context)
            probs = attention_weights(q[w.rows], keys, w.positions, module.scale)
            self.attention[(w.seq.seq_id, module.layer_idx)] = probs.cpu()

    def _on_logits(self, _module, _inputs, output: torch.Tensor) -> None:
        for w in self.watched:
            if w.sample_row is not None and w.sample_row < output.shape[0]:
                self.logits[w.seq.seq_id] = output[w.sample_row].float().cpu()


@torch.inference_mode()
def recompute_rows(model: torch.nn.Module, runner, seq: Sequence, start: int, end: int,
                   layers: set[int] | None, internals: bool) -> StepCapture:
    """A side pass over positions [start, end) of a watched sequence whose keys came from
    the prefix cache, so the engine never computed these rows for it. The queries are
    recomputed; the keys are read from the cached blocks, as the real step would have.
    Its own K/V go to the runner's scratch slot: the shared cached blocks stay untouched."""
    n, bs, device = end - start, runner.block_size, runner.device
    blocks = torch.tensor(seq.block_table[:cdiv(end, bs)], dtype=torch.long, device=device)
    md = span_metadata(torch.full((n,), runner.scratch_slot, dtype=torch.long, device=device),
                       PrefillSpan(0, n, start, blocks if start else None))
    ids = torch.tensor(seq.token_ids[start:end], dtype=torch.long, device=device)
    positions = torch.arange(start, end, device=device)
    rows = WatchedRows(seq, 0, list(range(start, end)), None, layers, internals)
    capture = StepCapture(model, [rows], bs).install()
    try:
        with step_metadata(model, md):
            model(ids, positions)
    finally:
        capture.remove()
    return capture
