"""Tensor-parallel layers (Megatron-style, as in vLLM): column-parallel splits outputs, row-parallel
splits inputs and all-reduces, the vocabulary is split by token ids; each layer's `load` reads only
its slice of a lazily opened checkpoint tensor. With one rank they are plain layers."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass
class CommCounter:
    """Bytes one rank of one group sent through collectives since the last `take` (an all-reduce's
    payload once); each group counts its own, so two engines in a process never mix."""
    nbytes: int = 0

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
            self.comm.nbytes += x.nbytes
            dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        self.comm.nbytes += x.nbytes * (self.size - 1)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)


def own(tp: TPGroup) -> TPGroup:
    """A layer's own copy of the group (the same rank, size and counter): a compiled step
    re-checks, with a Python call each, that modules sharing one object still share it;
    a copy each leaves only dynamo's cheap C++ guards."""
    return replace(tp)


def split(n: int, tp: TPGroup, what: str) -> int:
    if n % tp.size:
        raise ValueError(f"{what} ({n}) is not divisible by tensor_parallel_size {tp.size}")
    return n // tp.size


def input_major(out_features: int, in_features: int) -> nn.Parameter:
    """An [out, in] weight stored input-major: a CPU's sgemm reads that faster at decode batch sizes
    (the embedded model's 17 matmuls at 24 rows, one core: 4.0 → 3.0 ms)."""
    return nn.Parameter(torch.empty(in_features, out_features).t())


SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def store_for_cpu_kernels(model: nn.Module) -> None:
    """16-bit weights on a CPU go row-major, which oneDNN reads faster at every batch size (0.6B
    shape, 1 thread, 1 row: 27.0 → 16.9 ms, 11.4 by torch.mv; 128 rows 39.4 → 37.5)."""
    for weight in model.parameters():   # (norms and biases are contiguous already; a tied head is the embedding)
        if weight.device.type == "cpu" and weight.dtype in SIXTEEN_BIT:
            weight.data = weight.data.contiguous()


# Under torch.compile one row's product is an operator inductor does not open: it would turn
# a traced torch.mv into its own matmul, 1.3x slower here (the same 16 matmuls, 1 row: 16.1
# against 12.5 ms). A plain operator library, as kernels.py's, for its cheaper dispatch.
_ops = torch.library.Library("kvscope", "FRAGMENT")
_ops.define("gemv(Tensor weight, Tensor x) -> Tensor")
_ops.impl("gemv", torch.mv, "CompositeExplicitAutograd")


@torch.library.register_fake("kvscope::gemv")
def _(weight, x):
    return weight.new_empty(weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, but one row times a row-major 16-bit CPU weight is torch.mv, which streams each
    row once where oneDNN's matmul repacks the whole weight every call (1.5x at batch 1)."""
    if x.shape[0] == 1 and x.dim() == 2 and weight.dtype in SIXTEEN_BIT and weight.is_contiguous() \
            and weight.device.type == "cpu":
        mv = torch.ops.kvscope.gemv if torch.compiler.is_compiling() else torch.mv
        y = mv(weight, x[0]).unsqueeze(0)
        return y if bias is None else y + bias
    return F.linear(x, weight, bias)


class ColumnParallelLinear(nn.Module):
    """out_sizes: the packed matrices' full output sizes (q, k, v); the rank keeps its range of each."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, tp: TPGroup, what: str):
        super().__init__()
        self.tp = own(tp)
        self.local_sizes = [split(n, tp, what) for n in out_sizes]
        self.weight = input_major(sum(self.local_sizes), in_features)
        self.bias = nn.Parameter(torch.empty(sum(self.local_sizes))) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def load(self, param: nn.Parameter, full, shard: int) -> None:
        n = self.local_sizes[shard]
        param.data.narrow(0, sum(self.local_sizes[:shard]), n).copy_(full[self.tp.rank * n:(self.tp.rank + 1) * n])


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, tp: TPGroup, what: str):
        super().__init__()
        self.tp = own(tp)
        self.local_in = split(in_features, tp, what)
        self.weight = input_major(out_features, self.local_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(linear(x, self.weight))

    def load(self, param: nn.Parameter, full, shard: int) -> None:
        param.data.copy_(full[:, self.tp.rank * self.local_in:(self.tp.rank + 1) * self.local_in])


class VocabParallelEmbedding(nn.Module):
    """The rank's range of the vocabulary (the last one padded)."""
    def __init__(self, vocab_size: int, hidden: int, tp: TPGroup):
        super().__init__()
        self.tp, self.vocab_size = own(tp), vocab_size
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
        return self.tp.all_gather_last(linear(hidden, self.weight))[..., :self.vocab_size]
