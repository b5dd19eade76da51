"""MKL-packed weights: a layer multiplies by a copy packed once instead of repacking its
weight on every call. The packed product must equal F.linear, eagerly and compiled."""
import pytest
import torch
import torch.nn.functional as F

from kvscope.layers import packed_linear
from kvscope.layers.parallel import ColumnParallelLinear, RowParallelLinear, TPGroup

pytestmark = pytest.mark.skipif(not packed_linear.available(), reason="this torch build has no MKL")


@pytest.mark.parametrize("rows", [1, 3, 34, 64, 257])
@pytest.mark.parametrize("out_features,in_features", [(384, 256), (2048, 256), (256, 768), (40, 24)])
def test_equals_f_linear_at_any_row_count(rows, out_features, in_features):
    g = torch.Generator().manual_seed(rows * out_features)
    weight = torch.randn(out_features, in_features, generator=g) * 0.05
    x = torch.randn(rows, in_features, generator=g)
    packed = packed_linear.pack(weight)
    got = packed_linear.linear(x, weight, packed)
    torch.testing.assert_close(got, F.linear(x, weight), atol=1e-5, rtol=1e-5)


def test_keeps_leading_dimensions_adds_the_bias_and_takes_no_rows():
    weight, bias = torch.randn(24, 16), torch.randn(24)
    packed = packed_linear.pack(weight)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(packed_linear.linear(x, weight, packed, bias), F.linear(x, weight, bias),
                               atol=1e-5, rtol=1e-5)
    assert packed_linear.linear(torch.empty(0, 16), weight, packed).shape == (0, 24)


def test_the_compiled_operator_equals_the_eager_call():
    weight = torch.randn(96, 32)
    packed = packed_linear.pack(weight)
    fn = torch.compile(lambda x: torch.relu(packed_linear.linear(x, weight, packed)), dynamic=True, fullgraph=True)
    for rows in (2, 7, 50):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(fn(x), torch.relu(F.linear(x, weight)), atol=1e-5, rtol=1e-5)


def model_of_linears(dtype=torch.float32):
    model = torch.nn.Sequential(ColumnParallelLinear(16, [8, 8], False, TPGroup(), "w"),
                                RowParallelLinear(16, 16, TPGroup(), "w")).to(dtype)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    return model


def test_pack_model_packs_float32_layers_and_their_forward_uses_the_copy():
    model = model_of_linears()
    x = torch.randn(5, 16)
    expected = model(x)
    assert packed_linear.pack_model(model) == 2
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():   # forward multiplies by the packed copy, not by the weight
        model[0].weight.zero_()
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)
    model[0].packed_weight = None
    assert model[0](x).abs().sum() == 0


def test_other_dtypes_a_missing_mkl_and_the_memory_cap_keep_f_linear(monkeypatch):
    assert packed_linear.pack_model(model_of_linears(torch.bfloat16)) == 0
    monkeypatch.setattr(packed_linear, "MAX_PACKED_BYTES", 1)
    assert packed_linear.pack_model(model_of_linears()) == 0
    monkeypatch.undo()
    monkeypatch.setattr(packed_linear, "_mkl", lambda: None)
    model = model_of_linears()
    assert packed_linear.pack_model(model) == 0 and model[0].packed_weight is None
