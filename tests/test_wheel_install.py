"""kvscope as a user installs it: the wheel is built, installed into a fresh virtual
environment (reusing this environment's torch), and a CPU generation runs there with the
C paged-attention kernel, built from the source the wheel ships."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH_CPU = "2.13.0"   # the README's pin; its CPU wheel is the one pip finds on this machine

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
    # --ignore-installed: an editable kvscope in the system site-packages must not stand in for the wheel
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", str(wheel)])
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONPATH": ""}
    done = run([str(python), "-c", SCRIPT], cwd=tmp_path, env=env)
    assert "generated" in done.stdout
    assert list((tmp_path / "cache" / "kvscope" / "native").glob("cpu_paged_attention-*.so"))


# The README's install: `pip install -e ".[server]"` in a checkout, nothing else. Each mode
# starts from a virtual environment that has only what [server] pulls in (no system packages,
# so a module the server imports from another extra, such as httpx from [test], fails here as
# it would for a user). The checkout is a copy, so the editable install writes nothing into
# this one. torch comes from the CPU wheel on this machine's disk (pip's find-links): pinning
# the version keeps pip from reaching for a CUDA build.
SERVER_CHECK = """
import importlib
for name in ("kvscope.server.main", "kvscope.server.attach.main", "kvscope.server.attach.service",
             "kvscope.server.app", "kvscope.server.attach.probe"):
    importlib.import_module(name)
import torch
assert torch.version.cuda is None, torch.version.cuda
print("imported")
"""
NOT_SOURCE = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", ".pytest_cache", ".benchmarks",
                                    "node_modules", "*.so")


def wait_for(url: str, process: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-4000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s:\n{log.read_text()[-4000:]}")


@pytest.fixture
def own_folder():
    """A folder of this test's own: pytest prunes its numbered tmp folders when other runs
    start, which would take the virtual environment away mid-test."""
    folder = Path(tempfile.mkdtemp(prefix="kvscope-server-extra-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_readme_install_starts_every_mode(own_folder):
    from server_harness import free_port
    checkout = own_folder / "kvscope"
    shutil.copytree(REPO, checkout, ignore=NOT_SOURCE)
    venv = own_folder / "venv"
    run([sys.executable, "-m", "venv", str(venv)])   # no --system-site-packages: [server] alone
    python, kvscope = venv / "bin" / "python", venv / "bin" / "kvscope"
    run([str(python), "-m", "pip", "install", "-q", f"torch=={TORCH_CPU}"])
    run([str(python), "-m", "pip", "install", "-q", "-e", f"{checkout}[server]"])
    listed = run([str(python), "-m", "pip", "list", "--format=freeze"]).stdout
    assert "httpx==" in listed and not [n for n in listed.splitlines() if n.startswith("nvidia-")], listed
    env = {**os.environ, "XDG_CACHE_HOME": str(own_folder / "cache"), "PYTHONPATH": ""}
    assert "imported" in run([str(python), "-c", SERVER_CHECK], cwd=own_folder, env=env).stdout

    site = own_folder / "site"
    run([str(kvscope), "export-site", str(site)], cwd=own_folder, env=env)
    assert (site / "index.html").is_file() and list(site.glob("chapters/*"))

    port = free_port()
    log = own_folder / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([str(kvscope), "serve", "--port", str(port), "--enforce-eager", "--device", "cpu"],
                                  cwd=own_folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/healthz", server, log)
        # --attach against a server that answers but is not vLLM (kvscope's own): the probe's
        # HTTP calls run, and the answer is its one line and exit code 2, not an import error
        attach = subprocess.run([str(kvscope), "serve", "--attach", url, "--port", str(free_port())],
                                cwd=own_folder, env=env, capture_output=True, text=True, timeout=120)
        assert attach.returncode == 2, attach.stderr
        assert attach.stderr.strip().count("\n") == 0 and "is not a vLLM server" in attach.stderr, attach.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
