"""Checkpoints that cannot be used fail with one clear line naming the file or tensor."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_models import make_checkpoint
from kvscope.models.loader import ModelConfigError, ModelLoadError
from kvscope import LLM, SamplingParams


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("ok"))


def copy_of(checkpoint, tmp_path):
    dest = tmp_path / "ck"
    shutil.copytree(checkpoint, dest)
    return dest


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        LLM(str(tmp_path))


def test_missing_path_that_is_not_a_hub_id(tmp_path):
    with pytest.raises(ModelLoadError, match="no checkpoint directory"):
        LLM(str(tmp_path / "nope" / "deeper"))


def test_hub_id_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        LLM("kvscope-test/does-not-exist")
    assert "kvscope-test/does-not-exist" in str(err.value) and "\n" not in str(err.value)


def test_unsupported_architecture(checkpoint, tmp_path):
    ck = copy_of(checkpoint, tmp_path)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="GPT2LMHeadModel"):
        LLM(str(ck))


def test_missing_shard_is_named(checkpoint, tmp_path):
    ck = copy_of(checkpoint, tmp_path)
    tensors = load_file(ck / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    save_file({n: tensors[n] for n in names[:half]}, ck / "model-00001-of-00002.safetensors")
    save_file({n: tensors[n] for n in names[half:]}, ck / "model-00002-of-00002.safetensors")
    (ck / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {n: f"model-0000{1 + (i >= half)}-of-00002.safetensors"
                                            for i, n in enumerate(names)}}
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    # the sharded checkpoint loads and generates like the single file
    ref = LLM(str(checkpoint)).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=5))[0]
    out = LLM(str(ck)).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=5))[0]
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    (ck / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors"):
        LLM(str(ck))


def test_mismatched_shape_names_the_tensor(checkpoint, tmp_path):
    ck = copy_of(checkpoint, tmp_path)
    tensors = load_file(ck / "model.safetensors")
    tensors["model.layers.1.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, ck / "model.safetensors")
    with pytest.raises(ModelLoadError, match="model.layers.1.mlp.down_proj.weight"):
        LLM(str(ck))


def test_missing_tensor_is_named(checkpoint, tmp_path):
    ck = copy_of(checkpoint, tmp_path)
    tensors = load_file(ck / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, ck / "model.safetensors")
    with pytest.raises(ModelLoadError, match="model.norm.weight"):
        LLM(str(ck))


def test_dummy_weights_need_only_config(checkpoint, tmp_path):
    ck = tmp_path / "cfg"
    ck.mkdir()
    shutil.copy(checkpoint / "config.json", ck / "config.json")
    llm = LLM(str(ck), load_format="dummy")
    assert llm.tokenizer is None
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 4
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate(["text needs a tokenizer"])


def test_prompt_longer_than_the_model_fails_with_a_reason(checkpoint):
    llm = LLM(str(checkpoint), max_model_len=64)
    out = llm.generate([[1] * 100, [1, 2]], SamplingParams(temperature=0, max_tokens=4))
    assert out[0].outputs[0].finish_reason == "error" and "max_model_len" in out[0].error
    assert out[1].outputs[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matrices_keep_the_checkpoints_values_in_the_layout_their_kernels_read_fastest(checkpoint, dtype):
    """Every linear weight keeps the checkpoint's [out, in] shape and values; in float32 it is
    stored transposed (sgemm reads an untransposed [in, out] matrix faster at decode batch
    sizes), in bfloat16 row-major as the checkpoint has it (oneDNN's matmul and torch.mv)."""
    from kvscope.layers.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    with LLM(str(checkpoint), device="cpu", dtype=dtype) as llm:
        model = llm.engine.model
        layers = [m for m in model.modules()
                  if isinstance(m, (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding))]
        assert len(layers) >= 4 * model.config.num_layers
        for layer in layers:
            assert layer.weight.dtype == getattr(torch, dtype)
            assert layer.weight.is_contiguous() == (dtype == "bfloat16") != layer.weight.t().is_contiguous()
        saved = load_file(str(checkpoint / "model.safetensors"))
        down = model.model.layers[0].mlp.down_proj.weight
        assert torch.equal(down, saved["model.layers.0.mlp.down_proj.weight"].to(down.dtype))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_of_16_bit_weights_matches_float32_on_one_row_and_on_several(bias):
    from kvscope.layers.parallel import linear
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=gen).bfloat16()
    b = torch.randn(48, generator=gen).bfloat16() if bias else None
    for rows in (1, 3):
        x = torch.randn(rows, 64, generator=gen).bfloat16()
        got, want = linear(x, weight, b), torch.nn.functional.linear(x.float(), weight.float(), None if b is None else b.float())
        assert got.shape == (rows, 48) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
