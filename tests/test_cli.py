"""The command line, run as a user would: a real subprocess on the embedded model."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys


def kvscope(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvscope.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))


def test_generate_with_stats_on_the_default_model():
    proc = kvscope("generate", "--prompt", "Once upon a time", "--max-new-tokens", "24",
                   "--device", "cpu", "--show-stats")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("Once upon a time") and len(lines[0]) > len("Once upon a time") + 10
    stats = dict(kv.split("=", 1) for kv in shlex.split(lines[-1]))
    assert set(stats) == {"prompt_tokens", "generated_tokens", "elapsed_seconds", "tokens_per_second",
                          "device", "dtype", "dtype_reason", "decode"}
    assert stats["dtype_reason"].startswith("auto: ")   # why float32: a tiny model, or no native bf16
    assert stats["decode"] == "eager"    # one-off generation is not worth compiling for
    assert int(stats["generated_tokens"]) <= 24 and float(stats["tokens_per_second"]) > 0
    assert stats["device"] == "cpu" and stats["dtype"] == "float32"


def test_seeded_sampling_is_reproducible_from_the_cli():
    args = ("generate", "--prompt", "Mia went to the", "--max-new-tokens", "16", "--temperature", "0.9",
            "--top-k", "40", "--top-p", "0.95", "--seed", "7", "--device", "cpu")
    a, b = kvscope(*args), kvscope(*args)
    assert a.returncode == 0 and a.stdout == b.stdout


def test_bad_model_is_one_clear_line():
    proc = kvscope("generate", "--model", "/nonexistent/dir/x", "--prompt", "hi")
    assert proc.returncode == 2
    assert re.fullmatch(r"kvscope: error: .+\n", proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_sampling_value_is_one_clear_line():
    proc = kvscope("generate", "--prompt", "hi", "--top-p", "3", "--device", "cpu")
    assert proc.returncode == 2 and "top_p" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_throughput_prints_both_engines_and_the_roofline():
    proc = kvscope("bench", "throughput", "--num-requests", "6", "--input-len", "8", "32",
                   "--output-len", "4", "16", "--device", "cpu", timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"kvscope: \d+ output tokens in [\d.]+ s = [\d,]+ tok/s", out), out
    assert re.search(r"transformers generate .*= [\d,]+ tok/s", out), out
    assert re.search(r"speed-up: [\d.]+x", out) and "bandwidth roofline" in out
    assert "decode compiled (torch.compile" in out, out     # bench measures what serve runs
    assert "attention cpu_paged" in out and " 0 prefix-cache blocks reused" in out, out   # every run starts cold


def test_bench_throughput_instrument_watch_prints_off_listen_and_each_watch_n():
    proc = kvscope("bench", "throughput", "--num-requests", "4", "--input-len", "8", "16", "--output-len", "4", "8",
                   "--device", "cpu", "--no-hf", "--no-cpu-compile", "--instrument", "watch", "--watchers", "1", "2",
                   "--clock", "cpu", timeout=600)
    assert proc.returncode == 0, proc.stderr
    line = re.search(r"instrumentation \(same run, alternated, medians of 1, cpu clock\): off ([\d,]+) tok/s \(100%\), "
                     r"listen [\d,]+ tok/s \(\d+%\), watch-1 [\d,]+ tok/s \(\d+%\), watch-2 [\d,]+ tok/s \(\d+%\)",
                     proc.stdout)
    assert line and int(line.group(1).replace(",", "")) > 0, proc.stdout


def test_bench_attention_compares_the_kernel_with_the_reference():
    proc = kvscope("bench", "attention", "--batch", "1", "8", "--repeats", "1", "--context-len", "64", "128",
                   "--dtype", "float32", timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(r"batch +(\d+) +(\w+): +[\d,.]+ µs, K/V read +[\d,.]+ MiB at +[\d,.]+ GB/s = +[\d.]+% of the "
                      r"device's \(max difference from the reference ([\d.e+-]+)\)", proc.stdout)
    assert [(b, n) for b, n, _ in rows] == [("1", "cpu_paged"), ("1", "torch"), ("8", "cpu_paged"), ("8", "torch")], \
        proc.stdout
    assert all(float(err) < 1e-5 for _, _, err in rows), proc.stdout


def test_bench_throughput_runs_several_models_in_one_run():
    from kvscope.default_model import default_model_path
    proc = kvscope("bench", "throughput", "--model", default_model_path(), "--model", "shape:m30",
                   "--num-requests", "2", "--input-len", "8", "8", "--output-len", "2", "2", "--device", "cpu",
                   "--no-hf", "--no-cpu-compile", timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = proc.stdout.split("summary")[1].strip().splitlines()[1:]
    assert [line.split()[1] for line in summary] == [default_model_path(), "shape:m30"], proc.stdout
    assert all(re.search(r"kvscope [\d,]+ tok/s .*% of the matmul ceiling", line) for line in summary)
    assert "33.6M parameters" in proc.stdout


def test_unknown_bench_shape_is_one_clear_line():
    proc = kvscope("bench", "latency", "--model", "shape:nope", "--device", "cpu")
    assert proc.returncode != 0 and "unknown benchmark shape 'nope'; known: m30, qwen3-0.6b" in proc.stderr
    assert "Traceback" not in proc.stderr
