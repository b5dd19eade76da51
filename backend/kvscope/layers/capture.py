"""Attention weights for a watched request, recomputed from its queries and the cached
keys (fast kernels never materialise the weights, so we rebuild them for the few rows a
viewer asked for). Runs only while someone watches."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvscope.layers.torch_attention import gather_context


@dataclass
class WatchedRows:
    seq_id: int
    row_start: int                # rows of this sequence in the step's flattened tokens
    positions: list[int]          # absolute positions of those rows
    context_blocks: torch.Tensor  # block ids holding positions [0, last position]


@dataclass
class AttentionCapture:
    watched: list[WatchedRows]
    layers: set[int] | None = None          # None: every layer
    heads: list[int] | None = None          # None: every head
    weights: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)  # (seq, layer) -> [H, rows, ctx]

    def record(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, scale: float) -> None:
        if self.layers is not None and layer not in self.layers:
            return
        for w in self.watched:
            rows = q[w.row_start:w.row_start + len(w.positions)].float()        # [R, H, D]
            keys = gather_context(k_cache, w.context_blocks, w.positions[-1] + 1).float()  # [C, KVH, D]
            group = rows.shape[1] // keys.shape[1]
            keys = keys.repeat_interleave(group, dim=1)                          # [C, H, D]
            scores = torch.einsum("rhd,chd->hrc", rows, keys) * scale
            pos = torch.tensor(w.positions, device=scores.device)[:, None]
            causal = torch.arange(keys.shape[0], device=scores.device)[None, :] <= pos
            scores = scores.masked_fill(~causal, float("-inf"))
            probs = scores.softmax(dim=-1)
            if self.heads is not None:
                probs = probs[self.heads]
            self.weights[(w.seq_id, layer)] = probs.cpu()
