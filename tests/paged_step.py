"""One layer's paged attention over a scheduled step, built as the engine builds it: shared by
the tests that compare attention routes on the same step."""
from __future__ import annotations

import torch

from kvscope import SamplingParams
from kvscope.engine.block_manager import cdiv
from kvscope.engine.scheduler import ScheduledSeq, SchedulerOutput
from kvscope.engine.sequence import Sequence
from kvscope.engine.step_inputs import StepBuffers, prepare_inputs
from kvscope.layers.attention import PagedAttention, step_metadata


def attend_step(specs, block_size, route, seed=3, dtype=torch.float32):
    """One layer's attention over a scheduled step of (start, tokens) entries, with random
    caches and queries in `dtype` (the same for every route with the same seed): the rows and
    the metadata the engine would use."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(cdiv(start + n, block_size) for start, n in specs) + 4
    free = torch.randperm(num_blocks, generator=g).tolist()
    out = SchedulerOutput(step=0)
    for start, n in specs:
        seq = Sequence(list(range(start + n)), SamplingParams())
        seq.block_table = [free.pop() for _ in range(cdiv(start + n, block_size))]
        seq.num_computed_tokens = start
        out.entries.append(ScheduledSeq.row(seq, n))
    rows = sum(n for _, n in specs)
    layer = PagedAttention(8, 2, 16, 0)
    layer.k_cache = torch.randn(num_blocks, block_size, 2, 16, generator=g).to(dtype)
    layer.v_cache = torch.randn(num_blocks, block_size, 2, 16, generator=g).to(dtype)
    q, k, v = (torch.randn(rows, heads, 16, generator=g).to(dtype) for heads in (8, 2, 2))
    inputs = prepare_inputs(out, block_size, StepBuffers(torch.device("cpu")), route)
    with step_metadata(layer, inputs.metadata):
        return layer(q, k, v), inputs.metadata
