"""The Triton paged-decode kernel, run by Triton's interpreter on CPU (TRITON_INTERPRET=1),
checked against the PyTorch reference and inside the whole engine against transformers."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
BACKEND = Path(__file__).resolve().parents[1] / "backend"


def run_interpreted(code: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{BACKEND}:{Path(__file__).parent}")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_kernel_matches_reference_on_ragged_contexts():
    out = run_interpreted("""
        import torch
        from kvscope.layers.kernels import triton_decode_attention as paged_decode_attention
        from kvscope.layers.attention import gather_context
        torch.manual_seed(0)
        for heads, kv_heads, dim, bs in [(4, 2, 16, 4), (6, 2, 32, 8), (4, 4, 16, 16)]:
            k_cache, v_cache = torch.randn(2, 24, bs, kv_heads, dim).unbind(0)
            lens = torch.tensor([1, bs, bs + 1, 3 * bs - 1], dtype=torch.int32)
            tables = torch.stack([torch.randperm(24)[:4] for _ in lens]).int()
            q = torch.randn(len(lens), heads, dim)
            out = paged_decode_attention(q, k_cache, v_cache, tables, lens, dim ** -0.5)
            for b, n in enumerate(lens.tolist()):
                k = gather_context(k_cache, tables[b].long(), n).repeat_interleave(heads // kv_heads, 1)
                v = gather_context(v_cache, tables[b].long(), n).repeat_interleave(heads // kv_heads, 1)
                w = torch.einsum("hd,chd->hc", q[b], k).mul(dim ** -0.5).softmax(-1)
                ref = torch.einsum("hc,chd->hd", w, v)
                assert (out[b] - ref).abs().max() < 1e-5, (heads, kv_heads, dim, bs, b)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_engine_with_triton_backend_matches_transformers(tmp_path):
    out = run_interpreted(f"""
        import torch
        from pathlib import Path
        from hf_models import make_checkpoint, hf_greedy
        from kvscope import LLM, SamplingParams
        torch.set_num_threads(1)
        ck = make_checkpoint("qwen3", Path({str(tmp_path)!r}) / "m")
        prompts = [[1, 2, 3], list(range(5, 40)), [7] * 20]
        ref = hf_greedy(ck, prompts, 6)
        llm = LLM(str(ck), device="cpu", attention_backend="triton", block_size=8)
        assert llm.engine.plan.attention_backend == "triton"
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        got = [o.outputs[0].token_ids for o in outs]
        assert got == ref, (got, ref)
        print("ok")
    """)
    assert out.strip().endswith("ok")
