"""Weights packed once for MKL, so a CPU matmul does not repack them on every call.

MKL's sgemm copies the weight matrix into its own blocked layout on every call. With a
decode step's few rows that copy costs half as much as the arithmetic (perf on the
embedded model's throughput run: 13 % of all time in the copy, 27 % in the kernels).
MKL can pack a matrix once (cblas_sgemm_pack) and multiply any number of rows by the
packed copy (cblas_sgemm_compute); PyTorch's CPU build carries both, but its own
`mkl_linear` uses them only at the one batch size it packed for.

Only float32 weights on a CPU, one rank, and only where libtorch exports the routines (x86
builds with MKL); elsewhere every layer keeps F.linear. The packed copies sit beside the
weights (the embedding and the reference baselines still read those), so a model whose
copies would pass MAX_PACKED_BYTES keeps F.linear too: doubling a large model's memory is
too high a price, and there the weights' own traffic, not the copy, bounds a step. Weights
are packed once, after loading; nothing in the engine changes them later. Products agree
with F.linear's to float32 rounding (MKL sums a few rows in another order), as F.linear at
two batch sizes does with itself."""
from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch
import torch.nn.functional as F

log = logging.getLogger("kvscope.engine")

ROW_MAJOR, NO_TRANS, TRANS, PACKED, B_MATRIX = 101, 111, 112, 151, 162
PACK_ROWS = 64   # the row count MKL is told to expect; any count multiplies correctly
MAX_PACKED_BYTES = 512 * 2**20


@functools.cache
def _mkl():
    """libtorch_cpu's packed-sgemm routines, or None where this build has none."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        get_size, pack, compute = lib.cblas_sgemm_pack_get_size, lib.cblas_sgemm_pack, lib.cblas_sgemm_compute
    except (OSError, AttributeError):
        return None
    get_size.argtypes, get_size.restype = [ctypes.c_int] * 4, ctypes.c_size_t
    pack.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    pack.restype = None
    compute.argtypes = ([ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                              ctypes.c_float, ctypes.c_void_p, ctypes.c_int])
    compute.restype = None
    return get_size, pack, compute


def available() -> bool:
    return _mkl() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight: [out, in] float32 on the CPU → MKL's packed copy of its transpose, in a byte
    tensor that must stay where it is (the packed layout holds its own address)."""
    get_size, pack_fn, _ = _mkl()
    n, k = weight.shape
    weight = weight.detach().contiguous()
    packed = torch.empty(get_size(B_MATRIX, PACK_ROWS, n, k), dtype=torch.uint8)
    pack_fn(ROW_MAJOR, B_MATRIX, TRANS, PACK_ROWS, n, k, 1.0, weight.data_ptr(), k, packed.data_ptr())
    _COMPUTE[0] = _mkl()[2]
    return packed


_COMPUTE = [None]   # cblas_sgemm_compute, bound by the first pack


def _run(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    # on every matmul of a decode step: kept to the fewest Python operations
    k = x.shape[-1]
    rows = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, k).contiguous()
    m = rows.shape[0]
    out = torch.empty(m, out_features, dtype=x.dtype)
    if m:
        _COMPUTE[0](ROW_MAJOR, NO_TRANS, PACKED, m, out_features, k, rows.data_ptr(), k,
                    packed.data_ptr(), out_features, 0.0, out.data_ptr(), out_features)
    return out if rows is x else out.view(*x.shape[:-1], out_features)


# under torch.compile an operator opaque to inductor, as the attention kernel is; this
# Python kernel serves every backend until cpu_ops.py loads the C++ CPU kernel
_ops = torch.library.Library("kvscope", "FRAGMENT")
_ops.define("packed_linear(Tensor x, Tensor packed, int out_features) -> Tensor")
_ops.impl("packed_linear", _run, "CompositeExplicitAutograd")


@torch.library.register_fake("kvscope::packed_linear")
def _(x, packed, out_features):
    return x.new_empty(*x.shape[:-1], out_features)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the packed copy when the layer has one."""
    compiling = torch.compiler.is_compiling()
    # A compiled graph calls aten's matmul directly, while the operator goes through the
    # dispatcher's boxed path (a few µs more a call, and more again in its Python kernel):
    # for one row that costs more than the repacking saves (batch 1, embedded model: 1.48
    # against 1.21 ms a token with the Python kernel), and a single row is multiplied
    # without a repack anyway. The batch-1 graph is compiled on its own, so this adds no
    # guard to the others.
    if packed is None or (compiling and x.dim() == 2 and x.shape[0] == 1):
        return F.linear(x, weight, bias)
    out = (torch.ops.kvscope.packed_linear(x, packed, weight.shape[0]) if compiling
           else _run(x, packed, weight.shape[0]))
    return out if bias is None else out + bias


def pack_model(model: torch.nn.Module) -> int:
    """Give every linear layer of `model` that can use one a packed copy of its weight (the
    attribute `packed_weight`, None otherwise); returns how many were packed."""
    layers = [m for m in model.modules() if hasattr(m, "packed_weight")
              and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    if not layers or not available():
        return 0
    get_size = _mkl()[0]
    total = sum(get_size(B_MATRIX, PACK_ROWS, *m.weight.shape) for m in layers)
    if total > MAX_PACKED_BYTES:
        log.info("packed weights: %d MiB of copies would pass the %d MiB cap; matmuls repack per call",
                 total >> 20, MAX_PACKED_BYTES >> 20)
        return 0
    for module in layers:
        module.packed_weight = pack(module.weight)
    return len(layers)
