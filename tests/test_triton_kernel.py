"""The Triton paged-decode kernel, run by Triton's interpreter on CPU (TRITON_INTERPRET=1),
checked against the PyTorch reference and inside the whole engine against transformers. With
KVSCOPE_TRITON_ON_GPU=1 (scripts/gpu_check.sh) the same code runs compiled, on a CUDA GPU."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
BACKEND = Path(__file__).resolve().parents[1] / "backend"
ON_GPU = os.environ.get("KVSCOPE_TRITON_ON_GPU") == "1"


def run_kernel_code(code: str) -> str:
    """Run `code` in a fresh interpreter (Triton reads TRITON_INTERPRET once), with DEVICE set."""
    env = dict(os.environ, PYTHONPATH=f"{BACKEND}:{Path(__file__).parent}")
    if ON_GPU:
        env.pop("TRITON_INTERPRET", None)
    else:
        env["TRITON_INTERPRET"] = "1"
    code = f"DEVICE = {'cuda' if ON_GPU else 'cpu'!r}\n" + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_kernel_matches_reference_over_batches_contexts_groups_and_dtypes():
    """Every case against a float32 PyTorch reference read through the same shuffled block
    tables: batch 1 and many; contexts shorter than a block, exactly k blocks and long (cut
    into several slices); GQA groups of 1, 2 and 8; one slice, forced slices and the chosen
    number; float32, float16, bfloat16 (tiny heads and blocks keep the interpreter quick)."""
    out = run_kernel_code("""
        import torch
        from kvscope.layers.kernels import decode_splits, triton_decode_attention
        from kvscope.layers.attention import gather_context

        def reference(q, k_cache, v_cache, tables, lens, scale):
            heads, kv_heads = q.shape[1], k_cache.shape[2]
            out = []
            for b, n in enumerate(lens.tolist()):
                k = gather_context(k_cache.float(), tables[b].long(), n).repeat_interleave(heads // kv_heads, 1)
                v = gather_context(v_cache.float(), tables[b].long(), n).repeat_interleave(heads // kv_heads, 1)
                w = torch.einsum("hd,chd->hc", q[b].float(), k).mul(scale).softmax(-1)
                out.append(torch.einsum("hc,chd->hd", w, v))
            return torch.stack(out)

        def case(lens, heads, kv_heads, bs, dtype, splits, dim=16, seed=0):
            g = torch.Generator().manual_seed(seed)
            width = max(-(-n // bs) for n in lens) + 1          # a spare column, as graph buffers have
            blocks = len(lens) * width + 3
            k_cache, v_cache = torch.randn(2, blocks, bs, kv_heads, dim, generator=g).to(dtype).unbind(0)
            order = torch.randperm(blocks, generator=g)          # each sequence's blocks in random order
            tables = order[:len(lens) * width].view(len(lens), width).int().contiguous()
            lens_t = torch.tensor(lens, dtype=torch.int32)
            q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
            got = triton_decode_attention(*(t.to(DEVICE) for t in (q, k_cache, v_cache, tables, lens_t)),
                                          dim ** -0.5, num_splits=splits).cpu()
            err = (got.float() - reference(q, k_cache, v_cache, tables, lens_t, dim ** -0.5)).abs().max().item()
            limit = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
            assert got.dtype == dtype and err < limit, (lens, heads, kv_heads, bs, dtype, splits, err)

        bs = 4
        shapes = {"batch 1, under a block": [3], "batch 1, exactly 3 blocks": [12], "batch 1, long": [150],
                  "many": [1, 3, 4, 8, 12, 29, 64, 150, 5, 2]}
        for name, lens in shapes.items():
            for heads, kv_heads in [(2, 2), (4, 2), (8, 1)]:         # GQA groups 1, 2, 8
                for splits in (1, 3, None):                          # one, forced, chosen
                    case(lens, heads, kv_heads, bs, torch.float32, splits)
        for dtype in (torch.float16, torch.bfloat16):
            case([3, 12, 150], 4, 2, bs, dtype, None, seed=1)
            case([150], 8, 1, bs, dtype, 5, seed=2)
        case([1, 40, 17], 4, 2, 32, torch.float32, 4)               # a block bigger than the tile
        case([7, 9], 4, 2, 8, torch.float32, 16)                    # more slices than tiles: empty slices
        # the splits chosen: a batch that fills the card takes one, a single sequence many
        cpu = torch.device("cpu")
        assert decode_splits(256, 8, 4096, cpu) == 1
        assert decode_splits(1, 8, 4096, cpu) == 33
        assert decode_splits(1, 8, 40, cpu) == 2
        print("ok")
    """)
    assert out.strip() == "ok"


def test_padded_rows_of_a_graph_batch_give_zeros_not_nan():
    out = run_kernel_code("""
        import torch
        from kvscope.layers.kernels import triton_decode_attention
        k_cache, v_cache = torch.randn(2, 6, 4, 2, 16, device=DEVICE).unbind(0)
        tables = torch.zeros(3, 4, dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([5, 0, 0], dtype=torch.int32, device=DEVICE)   # rows 1, 2: padding, no context
        for splits in (1, 4):
            got = triton_decode_attention(torch.randn(3, 4, 16, device=DEVICE), k_cache, v_cache, tables, lens,
                                          0.25, num_splits=splits).cpu()
            assert torch.isfinite(got).all() and (got[1:] == 0).all(), splits
        print("ok")
    """)
    assert out.strip() == "ok"


def test_engine_with_triton_backend_matches_transformers(tmp_path):
    out = run_kernel_code(f"""
        import torch
        from pathlib import Path
        from hf_models import make_checkpoint, hf_greedy
        from kvscope import LLM, SamplingParams
        torch.set_num_threads(1)
        ck = make_checkpoint("qwen3", Path({str(tmp_path)!r}) / "m")
        prompts = [[1, 2, 3], list(range(5, 40)), [7] * 20]
        ref = hf_greedy(ck, prompts, 6)
        llm = LLM(str(ck), device=DEVICE, dtype="float32", attention_backend="triton", block_size=8)
        assert llm.engine.plan.attention_backend == "triton"
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        got = [o.outputs[0].token_ids for o in outs]
        assert got == ref, (got, ref)
        print("ok")
    """)
    assert out.strip().endswith("ok")
