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


def test_watched_rows_weights_read_in_place_match_pytorch():
    """capture's Triton weights (instrumentation/weights.py): ragged contexts through
    shuffled block tables, GQA groups of 1, 2 and 8, a block bigger than the tile, float32
    and bfloat16 caches, against softmax(q·k) over the gathered keys; zero past each context."""
    out = run_kernel_code("""
        import torch
        from kvscope.instrumentation.capture import attention_weights
        from kvscope.instrumentation.weights import triton_weights
        from kvscope.layers.attention import gather_context

        def case(lens, heads, kv_heads, bs, dtype, dim=16, seed=0):
            g = torch.Generator().manual_seed(seed)
            width = max(-(-n // bs) for n in lens)
            blocks = len(lens) * width + 2
            k_cache = torch.randn(blocks, bs, kv_heads, dim, generator=g).to(dtype)
            tables = torch.randperm(blocks, generator=g)[:len(lens) * width].view(len(lens), width).int().contiguous()
            q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)
            lens_t = torch.tensor(lens, dtype=torch.int32)
            got = triton_weights(*(t.to(DEVICE) for t in (q, k_cache, tables, lens_t)), 0.3, max(lens) + 3).cpu()
            for r, n in enumerate(lens):
                keys = gather_context(k_cache, tables[r].long(), n)
                want = attention_weights(q[r:r + 1], keys, [n - 1], 0.3)[:, 0]
                err = (got[r, :, :n] - want).abs().max().item()
                assert err < (1e-6 if dtype == torch.float32 else 1e-2), (lens, heads, kv_heads, bs, dtype, r, err)
                assert (got[r, :, n:] == 0).all()

        for heads, kv_heads in [(2, 2), (4, 2), (8, 1)]:
            case([1, 3, 4, 29, 70], heads, kv_heads, 4, torch.float32)
        case([5, 40, 17], 4, 2, 64, torch.float32)     # a block bigger than the tile
        case([3, 50], 4, 2, 4, torch.bfloat16, seed=1)
        print("ok")
    """)
    assert out.strip() == "ok"


def test_a_watched_request_on_the_triton_backend_matches_transformers(tmp_path):
    """The engine on the Triton backend with one request watched: its decode rows' weights
    come from the Triton weights kernel, and equal transformers' eager attention."""
    out = run_kernel_code(f"""
        import numpy as np, torch
        from pathlib import Path
        from hf_models import make_checkpoint
        from attention_frames import per_layer
        from transformers import AutoModelForCausalLM
        from kvscope import LLM, SamplingParams
        from kvscope.instrumentation import Instrumentation, WatchSpec
        from kvscope.instrumentation.encode import binary_frame, decode
        torch.set_num_threads(1)
        from kvscope.instrumentation import capture
        capture.in_place = lambda layer: False   # a GPU's: the C kernel reads CPU caches only
        calls = []
        real = capture.triton_weights
        capture.triton_weights = lambda *a: calls.append(1) or real(*a)
        ck = make_checkpoint("qwen3", Path({str(tmp_path)!r}) / "m", num_hidden_layers=2)
        llm = LLM(str(ck), device=DEVICE, dtype="float32", attention_backend="triton", block_size=8)
        events = []
        instr = Instrumentation(llm.engine, events.extend)
        seq = llm.engine.add_request(list(range(3, 22)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        instr.watch(seq.request_id, "test", WatchSpec(), seq)
        while llm.engine.has_unfinished():
            llm.engine.step()
        instr.detach()
        assert calls, "the decode rows' weights should come from the Triton kernel"
        hf = AutoModelForCausalLM.from_pretrained(ck, attn_implementation="eager", dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(torch.tensor([seq.token_ids[:-1]]), output_attentions=True).attentions
        att = per_layer([decode(binary_frame(e)) for e in events if e["type"] == "attention"])
        decode_rows = [a for a in att if a["query_positions"] == [a["context_len"] - 1] and a["context_len"] > 19]
        assert len(decode_rows) == 2 * 3, len(decode_rows)   # 3 decode steps, 2 layers
        for a in att:
            want = ref[a["layer"]][0][:, a["query_positions"], :a["context_len"]]
            assert np.allclose(a["weights"], want.numpy(), atol=1e-3), a["layer"]
        print("ok")
    """)
    assert out.strip().endswith("ok")


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
