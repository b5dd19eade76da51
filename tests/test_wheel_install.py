"""kvscope as a user installs it: the wheel is built, installed into a fresh virtual
environment (reusing this environment's torch), and a CPU generation runs there with the
C paged-attention kernel, built from the source the wheel ships."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

SCRIPT = """
from kvscope import LLM, SamplingParams
import kvscope, pathlib
assert "site-packages" in kvscope.__file__, kvscope.__file__
llm = LLM(None, device="cpu", enforce_eager=True)
assert llm.engine.plan.attention_backend == "cpu_paged", llm.engine.plan.attention_backend
out = llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
assert len(out[0].outputs[0].token_ids) == 8
llm.close() if hasattr(llm, "close") else llm.engine.shutdown()
print("generated", out[0].outputs[0].token_ids)
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def test_the_wheel_installs_and_generates_on_a_cpu(tmp_path):
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(REPO)])
    wheel = next(tmp_path.glob("kvscope-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvscope/layers/cpu_paged_attention.c" in names
    assert not [n for n in names if n.endswith((".cpp", ".so"))], "only the one C source ships"
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)])
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": ""}
    done = run([str(python), "-c", SCRIPT], cwd=tmp_path, env=env)
    assert "generated" in done.stdout
    assert list((tmp_path / "cache" / "kvscope" / "native").glob("cpu_paged_attention-*.so"))
