"""The flash_attn routes (FlashAttention's varlen prefill, flash_attn_with_kvcache decode) with
the metadata step_inputs.py builds for them, checked against the PyTorch reference route. flash-attn
cannot be installed here, so its two functions come from tests/flash_attn_contract, written from
their documented contract; a GPU machine runs the real ones (scripts/gpu_check.sh)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")
TESTS = Path(__file__).resolve().parent


def run(code: str) -> str:
    path = os.pathsep.join([str(TESTS.parent / "backend"), str(TESTS), str(TESTS / "flash_attn_contract")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_flash_routes_equal_the_reference_on_a_mixed_step():
    out = run("""
        import torch
        from kvscope.layers import attention
        from kvscope.layers.attention import Route, pick_routes
        from paged_step import attend_step
        assert attention.HAS_FLASH_ATTN

        BS = 256
        # a fresh prompt, a chunk over cached context crossing a page, a short span, three decode rows
        SPECS = [(0, 5), (250, 20), (37, 3), (20, 1), (300, 1), (511, 1)]

        def attend(route, dtype):
            return attend_step(SPECS, BS, route, seed=0, dtype=dtype)[0].float()

        for dtype in (torch.float32, torch.bfloat16):
            expected = attend(Route.REFERENCE, dtype)
            for route in (Route.FLASH_ATTN, Route.FLASH_PREFILL_TRITON):
                err = (attend(route, dtype) - expected).abs().max().item()
                assert err < (1e-5 if dtype == torch.float32 else 2e-2), (route, dtype, err)
        # the plan's choice: FlashAttention takes the spans where its pages fit and the dtype is half
        assert pick_routes("triton", "cuda graphs", torch.bfloat16, 256).eager is Route.FLASH_PREFILL_TRITON
        assert pick_routes("triton", None, torch.bfloat16, 16).eager is Route.TRITON
        assert pick_routes("triton", None, torch.float32, 256).eager is Route.TRITON
        routes = pick_routes("flash_attn", "cuda graphs", torch.float16, 256)
        assert routes.eager is routes.graph is Route.FLASH_ATTN
        print("ok")
    """)
    assert out.strip() == "ok"
