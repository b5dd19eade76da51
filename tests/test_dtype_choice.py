"""dtype="auto" on CPU: bfloat16 only for a 16-bit checkpoint of a non-tiny model on a CPU
with native bf16, float32 otherwise, each with its reason; and the bfloat16 CPU path
against transformers run in bfloat16."""
from __future__ import annotations

import pytest
import torch

from kvscope.models.loader import ModelConfig, choose_dtype

CPU = torch.device("cpu")


def config(hidden: int, layers: int, stored: str | None, vocab: int = 151936) -> ModelConfig:
    return ModelConfig.from_dict({"architectures": ["Qwen3ForCausalLM"], "vocab_size": vocab,
                                  "hidden_size": hidden, "intermediate_size": 3 * hidden,
                                  "num_hidden_layers": layers, "num_attention_heads": 16,
                                  "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": stored})


QWEN_0_6B = config(1024, 28, "bfloat16")


def test_native_bf16_cpu_and_16_bit_checkpoint_pick_bfloat16():
    dtype, reason = choose_dtype("auto", CPU, QWEN_0_6B, native_bf16=["avx512_bf16"])
    assert dtype == torch.bfloat16 and "avx512_bf16" in reason


@pytest.mark.parametrize("flags, cfg, why", [
    ([], QWEN_0_6B, "no native bfloat16"),
    (["amx_bf16"], config(1024, 28, "float32"), "stored in float32"),
    (["amx_bf16"], config(64, 2, "bfloat16", vocab=512), "tiny model"),
])
def test_float32_otherwise_with_the_reason(flags, cfg, why):
    dtype, reason = choose_dtype("auto", CPU, cfg, native_bf16=flags)
    assert dtype == torch.float32 and why in reason


def test_an_explicit_dtype_is_kept():
    assert choose_dtype("bfloat16", CPU, QWEN_0_6B, native_bf16=[])[0] == torch.bfloat16
    with pytest.raises(ValueError):
        choose_dtype("int4", CPU, QWEN_0_6B)


def test_bfloat16_cpu_path_against_transformers_in_bfloat16(tmp_path):
    """Greedy tokens equal transformers' in bf16 as long as the two agree on the prefix; at
    a step where transformers' top two logits are within bf16 rounding (a near tie), the
    paths may pick differently, so the comparison stops there."""
    from transformers import AutoModelForCausalLM

    from hf_models import make_checkpoint
    from kvscope import LLM, SamplingParams
    path = make_checkpoint("qwen3", tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    llm = LLM(str(path), device="cpu", dtype="bfloat16", block_size=16)
    prompts = [[5, 17, 42, 99, 7, 300, 12], list(range(40, 73))]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    compared = 0
    for prompt, out in zip(prompts, outs):
        ids = torch.tensor([prompt])
        for token in out.outputs[0].token_ids:
            with torch.no_grad():
                logits = hf(ids).logits[0, -1].float()
            top2 = logits.topk(2).values
            if token != int(logits.argmax()):
                assert top2[0] - top2[1] <= 0.0625 * top2[0].abs().clamp_min(1), "not a near tie"
                break
            compared += 1
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    print(f'{compared} of 32 tokens equal before any near tie')
    assert compared >= 16     # most of the 32 tokens were checked exactly
