"""C++ implementations of kvscope's custom operators on CPUs (cpu_ops.cpp), loaded for
compiled decode steps so that a step runs in C++ from end to end, without the GIL.

The operators (kvscope::packed_linear, kvscope::paged_decode_attention) are defined in
packed_linear.py and cpu_paged_attention.py, each with a Python implementation registered
for every backend. The C++ library registers CPU kernels, which take precedence once it is
loaded; where it cannot be built (no C++ compiler, PyTorch without its headers), the
Python implementations serve, a few microseconds slower a call and holding the GIL."""
from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from kvscope.layers import cpu_paged_attention, packed_linear
from kvscope.native_build import NativeBuildError, load

log = logging.getLogger("kvscope.engine")

SOURCE = Path(__file__).with_suffix(".cpp")


def _flag_sets() -> tuple[tuple[str, ...], ...]:
    root = Path(torch.__file__).parent
    # the version in the flags puts each PyTorch's build under its own name in the cache
    return (("-O2", "-std=c++17", f"-DKVSCOPE_TORCH_VERSION=\"{torch.__version__}\"", f"-I{root / 'include'}",
             f"-L{root / 'lib'}", f"-Wl,-rpath,{root / 'lib'}", "-ltorch_cpu"),)


@functools.cache
def install() -> str | None:
    """Load the C++ kernels (building them once per machine); returns why they could not be
    loaded, or None when they now serve the operators."""
    if not (Path(torch.__file__).parent / "include" / "torch" / "csrc" / "stable" / "library.h").exists():
        return "this PyTorch has no stable-ABI headers"
    try:
        lib = load(SOURCE, _flag_sets())
    except NativeBuildError as exc:
        log.warning("compiled decode: custom operators stay in Python: %s", exc)
        return str(exc)
    lib.kvscope_bind.argtypes, lib.kvscope_bind.restype = [ctypes.c_void_p] * 3, None
    mkl = packed_linear._mkl()
    kernels = cpu_paged_attention._kernels()
    attention = kernels if isinstance(kernels, dict) else {}
    lib.kvscope_bind(_address(mkl[2] if mkl else None), _address(attention.get(torch.float32)),
                     _address(attention.get(torch.bfloat16)))
    return None


def _address(fn) -> int | None:
    return ctypes.cast(fn, ctypes.c_void_p).value if fn is not None else None
