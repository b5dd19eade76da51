"""Decode steps captured as CUDA graphs: one graph per batch size bucket replays the
whole forward pass with a single launch, removing the per-kernel CPU overhead that
dominates small decode batches. Inputs are copied into fixed buffers before each replay;
rows beyond the real batch write to a scratch block and attend to nothing."""
from __future__ import annotations

import torch

from kvscope.layers.context import AttentionMetadata, step_metadata
from kvscope.paging import cdiv


class DecodeGraphs:
    def __init__(self, runner, max_batch: int):
        self.runner = runner
        self.buckets = [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))
        if self.buckets[-1] < max_batch:
            self.buckets.append(max_batch)
        max_b = self.buckets[-1]
        dev = runner.device
        width = cdiv(runner.max_model_len, runner.block_size)
        self.input_ids = torch.zeros(max_b, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_b, dtype=torch.long, device=dev)
        self.slot_mapping = torch.full((max_b,), runner.scratch_slot, dtype=torch.long, device=dev)
        self.block_tables = torch.zeros(max_b, width, dtype=torch.int32, device=dev)
        self.context_lens = torch.zeros(max_b, dtype=torch.int32, device=dev)
        self.hidden = torch.zeros(max_b, runner.model.config.hidden_size, dtype=runner.dtype, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._capture()

    def fits(self, batch: int) -> bool:
        return batch <= self.buckets[-1]

    def _metadata(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:b], block_tables=self.block_tables[:b],
                                 context_lens=self.context_lens[:b])

    @torch.inference_mode()
    def _capture(self) -> None:
        pool = None
        model = self.runner.model
        for b in reversed(self.buckets):
            with step_metadata(self._metadata(b)):
                self.hidden[:b] = model(self.input_ids[:b], self.positions[:b])   # warm-up
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool):
                    self.hidden[:b] = model(self.input_ids[:b], self.positions[:b])
            pool = pool or graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize()

    def run(self, ids: torch.Tensor, positions: torch.Tensor, md: AttentionMetadata) -> torch.Tensor:
        n = ids.shape[0]
        b = next(x for x in self.buckets if x >= n)
        self.input_ids[:n] = ids
        self.positions[:n] = positions
        self.slot_mapping[:b].fill_(self.runner.scratch_slot)
        self.slot_mapping[:n] = md.slot_mapping
        self.context_lens[:b].zero_()
        self.context_lens[:n] = md.context_lens
        width = md.block_tables.shape[1]
        self.block_tables[:n, :width] = md.block_tables
        self.graphs[b].replay()
        return self.hidden[:n]
