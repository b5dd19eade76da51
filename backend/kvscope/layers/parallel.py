"""Tensor-parallel layers (Megatron-style, as in vLLM): each rank holds a slice of every weight
matrix and one all-reduce per row-parallel layer puts the pieces back together.

- Column-parallel (qkv_proj, gate_up_proj): output features split; each rank computes its heads /
  its part of the MLP's hidden width. No communication.
- Row-parallel (o_proj, down_proj): input features split; the partial products are all-reduced.
- Vocab-parallel embedding and LM head: each rank owns a range of token ids; embeddings are summed
  (the owner contributes, the others add zero) and logits gathered.

With one rank these are plain layers and no collective is called. Each layer's `load` copies its
own slice out of a checkpoint tensor opened lazily (safetensors' get_slice reads only the rows or
columns indexed), so no rank materialises a whole matrix it does not keep."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CommCounter:
    """Bytes one rank of one group sent through collectives since the last `take`
    (all-reduce payloads counted once; a ring all-reduce moves about 2 (N-1)/N of that
    over the wire). Each group counts its own, so two engines in a process never mix."""
    def __init__(self):
        self.nbytes = 0

    def add(self, x: torch.Tensor, times: int = 1) -> None:
        self.nbytes += x.numel() * x.element_size() * times

    def take(self) -> int:
        n, self.nbytes = self.nbytes, 0
        return n


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    comm: CommCounter = field(default_factory=CommCounter, compare=False, repr=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.comm.add(x)
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        self.comm.add(x, self.size - 1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def split(n: int, tp: TPGroup, what: str) -> int:
    if n % tp.size:
        raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size {tp.size}")
    return n // tp.size


def input_major(out_features: int, in_features: int) -> nn.Parameter:
    """A weight of shape [out, in], as checkpoints lay it out, stored input-major (its
    transpose is contiguous): `F.linear` then hands BLAS an untransposed [in, out] matrix,
    which a CPU's sgemm reads faster at decode batch sizes (the embedded model's 17 matmuls
    at 24 rows, one core: 4.0 ms with [out, in] storage, 3.0 ms with this)."""
    return nn.Parameter(torch.empty(in_features, out_features).t())


class ColumnParallelLinear(nn.Module):
    """out_sizes: the packed matrices' full output sizes (e.g. q, k, v); each is cut into
    tp.size equal row ranges and the rank keeps its own range of each."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, tp: TPGroup, what: str):
        super().__init__()
        self.tp = tp
        self.local_sizes = [split(n, tp, what) for n in out_sizes]
        self.weight = input_major(sum(self.local_sizes), in_features)
        self.bias = nn.Parameter(torch.empty(sum(self.local_sizes))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def load(self, param: nn.Parameter, full, shard: int) -> None:
        n = self.local_sizes[shard]
        param.data.narrow(0, sum(self.local_sizes[:shard]), n).copy_(full[self.tp.rank * n:(self.tp.rank + 1) * n])


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, tp: TPGroup, what: str):
        super().__init__()
        self.tp = tp
        self.local_in = split(in_features, tp, what)
        self.weight = input_major(out_features, self.local_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(F.linear(x, self.weight))

    def load(self, param: nn.Parameter, full, shard: int) -> None:
        param.data.copy_(full[:, self.tp.rank * self.local_in:(self.tp.rank + 1) * self.local_in])


class VocabParallelEmbedding(nn.Module):
    """Rows [rank * per_rank, (rank + 1) * per_rank) of the vocabulary (the last rank's range
    is padded when the vocabulary does not divide evenly)."""
    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup):
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.per_rank = -(-vocab_size // tp.size)   # rounded up
        self.start = tp.rank * self.per_rank
        # input-major too: looking up a few rows reads them strided, which costs little,
        # and a tied LM head (this very matrix) multiplies at the faster layout
        self.weight = input_major(self.per_rank, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mine = (local >= 0) & (local < self.per_rank)
        return self.tp.all_reduce(F.embedding(local.clamp(0, self.per_rank - 1), self.weight) * mine.unsqueeze(-1))

    def load(self, param: nn.Parameter, full, shard: int) -> None:
        n = max(0, min(self.per_rank, self.vocab_size - self.start))   # real rows, the padding left at zero
        param.data.zero_()
        if n:
            param.data[:n].copy_(full[self.start:self.start + n])


class ParallelLMHead(VocabParallelEmbedding):
    """Called on hidden states, it returns the logits over the whole vocabulary."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(F.linear(hidden, self.weight))[..., :self.vocab_size]
