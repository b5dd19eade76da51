"""The custom operators' C++ CPU kernels (layers/cpu_ops.cpp), which a compiled decode step
calls without the GIL, against their Python kernels and F.linear."""
import pytest
import torch
import torch.nn.functional as F

from kvscope.layers import cpu_ops, cpu_paged_attention, packed_linear
from test_cpu_paged_attention import random_decode_step


@pytest.fixture(autouse=True, scope="module")
def installed():
    assert cpu_ops.install() is None, "the C++ operators should build on the test machines"


def has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"kvscope::{op}", key)


def test_they_serve_both_operators_on_cpus():
    # the Python kernels are registered for every backend; only the C++ library adds a CPU one
    assert has_kernel("packed_linear", "CPU") and has_kernel("paged_decode_attention", "CPU")


@pytest.mark.skipif(not packed_linear.available(), reason="this torch build has no MKL")
@pytest.mark.parametrize("shape", [(7, 24), (2, 5, 24), (0, 24), (1, 24)])
def test_packed_linear_equals_f_linear(shape):
    g = torch.Generator().manual_seed(len(shape) + shape[0])
    weight, x = torch.randn(40, 24, generator=g), torch.randn(*shape, generator=g)
    got = torch.ops.kvscope.packed_linear(x, packed_linear.pack(weight), 40)
    assert got.shape == (*shape[:-1], 40)
    torch.testing.assert_close(got, F.linear(x, weight), atol=1e-5, rtol=1e-5)
    strided = torch.randn(24, 9, generator=g).t()          # rows not contiguous: copied first
    torch.testing.assert_close(torch.ops.kvscope.packed_linear(strided, packed_linear.pack(weight), 40),
                               F.linear(strided, weight), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not packed_linear.available(), reason="this torch build has no MKL")
def test_packed_linear_refuses_other_dtypes():
    packed = packed_linear.pack(torch.randn(8, 4))
    with pytest.raises(RuntimeError, match="takes float32"):
        torch.ops.kvscope.packed_linear(torch.randn(2, 4, dtype=torch.float64), packed, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_equals_the_python_kernel(dtype):
    q, k_cache, v_cache, md = random_decode_step(16, [1, 15, 16, 17, 250], seed=3, dtype=dtype)
    q = q.transpose(0, 1).contiguous().transpose(0, 1)      # a strided query is copied first
    got = torch.ops.kvscope.paged_decode_attention(q, k_cache, v_cache, md.block_tables, md.context_lens, 0.25)
    want = cpu_paged_attention.run(q, k_cache, v_cache, md.block_tables, md.context_lens, 0.25)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_paged_attention_refuses_layouts_the_kernel_cannot_read():
    q, k_cache, v_cache, md = random_decode_step(16, [5, 20], seed=4)
    with pytest.raises(RuntimeError, match="int32"):
        torch.ops.kvscope.paged_decode_attention(q, k_cache, v_cache, md.block_tables.long(), md.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.kvscope.paged_decode_attention(q, k_cache.transpose(2, 3), v_cache, md.block_tables,
                                                 md.context_lens, 1.0)
    with pytest.raises(RuntimeError, match="dtype"):
        torch.ops.kvscope.paged_decode_attention(q, k_cache.double(), v_cache, md.block_tables,
                                                 md.context_lens, 1.0)


def test_without_a_cpp_build_the_python_kernels_serve(monkeypatch):
    from kvscope.native_build import NativeBuildError

    def no_compiler(*_):
        raise NativeBuildError("no C++ compiler found")
    monkeypatch.setattr(cpu_ops, "load", no_compiler)
    assert "no C++ compiler" in cpu_ops.install.__wrapped__()
    for op in ("packed_linear", "paged_decode_attention"):
        assert has_kernel(op, "CompositeExplicitAutograd")
