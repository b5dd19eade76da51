"""RMSNorm, q/k norm with RoPE, and SwiGLU's gate, each in one pass, for eager float32
passes on a CPU (cpu_fused.c, built and loaded as the attention kernel is).

A prefill step runs eagerly: at its thousands of rows, PyTorch's separate elementwise
operations (a norm alone is five) each stream the activations through memory once, and
together took a fifth of a prefill step on the embedded model. Compiled decode steps
leave these to inductor, which fuses them itself: under torch.compile `applies` is False.
The model keeps its PyTorch expressions for every other case (bfloat16, GPUs, no C
compiler) and as the reference the tests hold these functions to."""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from kvscope.native_build import NativeBuildError, load

log = logging.getLogger("kvscope.engine")

SOURCE = Path(__file__).with_suffix(".c")
MAX_HEAD_DIM = 512   # as in the C source
_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "rms_norm_f32": [_P, _L, _L, _I, _I, _P, _I, _F, _P, _I],
    "qk_norm_rope_f32": [_P, _L, _I, _I, _I, _I, _P, _P, _F, _P, _P, _P, _P, _I],
    "silu_mul_f32": [_P, _L, _I, _I, _P, _I],
}


@functools.cache
def _lib():
    """The built library, or None where it cannot be built (the PyTorch expressions run)."""
    try:
        lib = load(SOURCE)
    except NativeBuildError as exc:
        log.warning("fused CPU elementwise kernels unavailable, using PyTorch's: %s", exc)
        return None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib


def applies(x: torch.Tensor) -> bool:
    """Whether `x`'s step takes the fused kernels: float32 on a CPU, outside torch.compile."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and not torch.compiler.is_compiling()
            and _lib() is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x: [..., dim], e.g. [tokens, heads, dim] viewing a packed qkv matrix (read in place)
    → weight * x / sqrt(mean(x²) + eps), contiguous, x's shape."""
    shape, dim = x.shape, x.shape[-1]
    if x.stride(-1) != 1 or x.dim() not in (2, 3):
        x = x.reshape(-1, dim).contiguous()
    groups, group_stride = x.shape[0], x.stride(0)
    per_group, row_stride = (x.shape[1], x.stride(1)) if x.dim() == 3 else (1, dim)
    out = torch.empty(shape, dtype=x.dtype)
    _lib().rms_norm_f32(x.data_ptr(), group_stride, row_stride, groups, per_group, weight.data_ptr(), dim,
                        eps, out.data_ptr(), torch.get_num_threads())
    return out


def qk_norm_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                 cos: torch.Tensor, signed_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv: [tokens, (H + 2 * KVH) * D], rows contiguous; cos, signed_sin: [tokens, 1, D]
    (rotary.cos_sin) → q [tokens, H, D] and k [tokens, KVH, D], each head normalised by its
    weight when given (both or neither) and then rotated."""
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} is over the fused kernel's {MAX_HEAD_DIM}")
    tokens = qkv.shape[0]
    cos, signed_sin = cos.contiguous(), signed_sin.contiguous()
    q = torch.empty(tokens, num_heads, head_dim, dtype=qkv.dtype)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=qkv.dtype)
    normed = q_weight is not None
    _lib().qk_norm_rope_f32(qkv.data_ptr(), qkv.stride(0), tokens, num_heads, num_kv_heads, head_dim,
                            q_weight.data_ptr() if normed else None, k_weight.data_ptr() if normed else None,
                            eps, cos.data_ptr(), signed_sin.data_ptr(), q.data_ptr(), k.data_ptr(),
                            torch.get_num_threads())
    return q, k


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [rows, 2 * inter], rows contiguous, gate then up → silu(gate) * up [rows, inter]."""
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype)
    _lib().silu_mul_f32(gate_up.data_ptr(), gate_up.stride(0), rows, inter, out.data_ptr(), torch.get_num_threads())
    return out
