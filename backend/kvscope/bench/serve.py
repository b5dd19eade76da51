"""`kvscope bench serve`: N WebSocket viewers watching the engine while M clients stream
completions through the OpenAI API, all on loopback. Prints throughput, TTFT and
inter-token latency percentiles, what the viewers received, the display events the
server dropped for them, and lost requests (which must be 0).

As a soak (`--duration 600 --stalled 20 --tokenize-flood 45`) it also runs viewers that
never read and a learner flooding `tokenize`, and reports the server's RSS at start and
end, blocks still in use once every request has finished (leaked, must be 0) and the
largest gap between two frames that a reading viewer saw.

Without --url it starts its own server in a child process (so the server's event loop
and engine are measured apart from this load generator)."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from kvscope.server.cli_args import add_cpu_compile_argument

PROMPTS = [
    "Once upon a time, a little fox found a shiny stone by the river.",
    "The old lighthouse keeper climbed the stairs every evening and",
    "Mia wanted to bake a cake for her grandmother, so she",
    "In a small village by the sea, there lived a curious cat named",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--token", default=None, help="its instructor token (lifts the learner rate limits)")
    p.add_argument("--model", default=None, help="model for the server this starts")
    p.add_argument("--viewers", type=int, default=200, help="WebSocket viewers (N)")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent streaming requests (M)")
    p.add_argument("--requests", type=int, default=None, help="requests in all (default 3 × M)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--families", default="step,kv,request,memory", help="what each viewer subscribes to")
    p.add_argument("--stalled", type=int, default=0, help="extra viewers that never read")
    p.add_argument("--threads", type=int, default=1, help="engine threads of the server this starts")
    add_cpu_compile_argument(p)
    p.add_argument("--duration", type=float, default=None,
                   help="soak: keep M requests in flight for this many seconds (instead of --requests)")
    p.add_argument("--tokenize-flood", type=float, default=0,
                   help="one learner socket sending this many 8,000-character tokenize messages a second")
    p.add_argument("--timeout", type=float, default=600)


@dataclass
class Tally:
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    ok: int = 0
    lost: list[str] = field(default_factory=list)
    frames: int = 0
    bytes: int = 0
    elapsed: float = 0.0
    dropped: float = 0.0
    steps: float = 0.0
    viewers_seen: int = 0
    total: int = 0
    max_gap: float = 0.0
    rss_start_mib: float | None = None
    rss_end_mib: float | None = None
    leaked_blocks: int | None = None
    flood_sent: int = 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str, str]:
    port, token = free_port(), secrets.token_urlsafe(8)
    cmd = [sys.executable, "-m", "kvscope.server.main", "--port", str(port), "--instructor-token", token,
           "--threads", str(args.threads), "--log-level", "warning",
           "--cpu-compile" if args.cpu_compile else "--no-cpu-compile"]
    if args.model:
        cmd += ["--model", args.model]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}", token


async def wait_ready(client, url: str, proc, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}")
        try:
            if (await client.get(f"{url}/healthz")).status_code == 200:
                return
        except Exception:
            pass
        await asyncio.sleep(0.3)
    raise RuntimeError("the server did not come up")


def rss_mib(pid: int | None) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration, TypeError):
        return None


async def viewer(ws_url: str, families: str, tally: Tally, stop: asyncio.Event, read: bool = True,
                 measuring: asyncio.Event | None = None) -> None:
    import websockets
    async with websockets.connect(f"{ws_url}?subscribe={families}", max_size=None, max_queue=4 if not read else 64) as ws:
        if not read:
            await stop.wait()
            return
        last = None
        while not stop.is_set():
            try:
                frame = await asyncio.wait_for(ws.recv(decode=False), timeout=0.5)
            except asyncio.TimeoutError:
                continue
            now = time.perf_counter()
            if measuring is not None and measuring.is_set() and last is not None:
                tally.max_gap = max(tally.max_gap, now - last)
            last = now
            tally.frames += 1
            tally.bytes += len(frame)


async def tokenize_flood(ws_url: str, rate: float, tally: Tally, stop: asyncio.Event) -> None:
    """A learner sending long multi-byte tokenize requests and never reading the replies."""
    import websockets
    text = json.dumps({"type": "tokenize", "text": "é€𝄞" * 2666})
    try:
        async with websockets.connect(ws_url, max_size=None, max_queue=1) as ws:
            while not stop.is_set():
                await ws.send(text)
                tally.flood_sent += 1
                await asyncio.sleep(1 / rate)
    except Exception:   # closed by the server for not reading: that is the point
        pass


async def one_request(client, url: str, token: str, i: int, max_tokens: int, tally: Tally) -> None:
    body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": max_tokens, "temperature": 0.8, "seed": i,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    start, last, finished, usage, stage = time.perf_counter(), None, False, None, "before the response"
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body,
                                 headers={"Authorization": f"Bearer {token}"}) as resp:
            if resp.status_code != 200:
                tally.lost.append(f"#{i}: HTTP {resp.status_code}")
                return
            stage = "after the headers"
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    tally.lost.append(f"#{i}: {chunk['error']['message']}")
                    return
                usage = chunk.get("usage") or usage
                stage = "mid-stream"
                for choice in chunk["choices"]:
                    now = time.perf_counter()
                    if choice["text"]:
                        if last is None:
                            tally.ttft.append(now - start)
                        else:
                            tally.itl.append(now - last)
                        last = now
                    finished |= choice["finish_reason"] is not None
    except Exception as exc:
        tally.lost.append(f"#{i}: {type(exc).__name__} {stage}: {exc}")
        return
    if finished and usage:
        tally.ok += 1
        tally.tokens += usage["completion_tokens"]
    else:
        tally.lost.append(f"#{i}: stream ended without a finish")


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def load(args, url: str, token: str, proc) -> Tally:
    import httpx
    tally, viewers_tally = Tally(), Tally()
    limits = httpx.Limits(max_connections=args.concurrency + 8)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        await wait_ready(client, url, proc)
        ws_url = url.replace("http", "ws", 1) + "/ws"
        stop, measuring = asyncio.Event(), asyncio.Event()
        tally.rss_start_mib = rss_mib(proc.pid if proc is not None else None)
        watchers = [asyncio.create_task(viewer(ws_url, args.families, viewers_tally, stop, measuring=measuring))
                    for _ in range(args.viewers)]
        watchers += [asyncio.create_task(viewer(ws_url, args.families, viewers_tally, stop, read=False))
                     for _ in range(args.stalled)]
        while True:   # every viewer connected before the load starts
            health = (await client.get(f"{url}/healthz")).json()
            if health["viewers"] >= args.viewers + args.stalled or any(w.done() for w in watchers):
                break
            await asyncio.sleep(0.2)
        if args.tokenize_flood > 0:
            watchers.append(asyncio.create_task(tokenize_flood(ws_url, args.tokenize_flood, tally, stop)))
        before = (await client.get(f"{url}/metrics")).text
        total = args.requests or 3 * args.concurrency
        counter = iter(range(10**9))
        start = time.perf_counter()
        measuring.set()

        def more() -> bool:
            if args.duration is not None:
                return time.perf_counter() - start < args.duration
            return tally.total < total

        async def worker():
            while more():
                tally.total += 1
                await one_request(client, url, token, next(counter), args.max_tokens, tally)
        tally.total = 0
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        tally.elapsed = time.perf_counter() - start
        measuring.clear()
        after = (await client.get(f"{url}/metrics")).text
        health = await idle_health(client, url)
        stop.set()
        await asyncio.gather(*watchers, return_exceptions=True)
    tally.rss_end_mib = rss_mib(proc.pid if proc is not None else None)
    tally.leaked_blocks = health["num_blocks"] - health["free_blocks"]
    tally.frames, tally.bytes, tally.max_gap = viewers_tally.frames, viewers_tally.bytes, viewers_tally.max_gap
    tally.dropped = metric(after, "kvscope_dropped_display_events_total") - \
        metric(before, "kvscope_dropped_display_events_total")
    tally.steps = metric(after, "kvscope_engine_steps_total") - metric(before, "kvscope_engine_steps_total")
    tally.viewers_seen = health["viewers"]
    return tally


async def idle_health(client, url: str, limit: float = 30) -> dict:
    """/healthz once nothing runs or waits (blocks still in use then are leaked)."""
    deadline = time.monotonic() + limit
    while True:
        health = (await client.get(f"{url}/healthz")).json()
        if (health["running"] == 0 and health["waiting"] == 0) or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.2)


def report(args, t: Tally) -> None:
    ms = 1000
    print(f"load: {args.viewers} viewers (+{args.stalled} stalled) subscribed to {args.families}; "
          f"{t.total} streaming requests, {args.concurrency} at a time, {args.max_tokens} tokens each")
    print(f"throughput: {t.tokens} output tokens in {t.elapsed:.2f} s = {t.tokens / t.elapsed:,.1f} tok/s "
          f"({t.steps:.0f} engine steps)")
    print(f"TTFT ms: p50 {pct(t.ttft, .5) * ms:.0f}  p90 {pct(t.ttft, .9) * ms:.0f}  p99 {pct(t.ttft, .99) * ms:.0f}")
    print(f"ITL  ms: p50 {pct(t.itl, .5) * ms:.1f}  p90 {pct(t.itl, .9) * ms:.1f}  p99 {pct(t.itl, .99) * ms:.1f}")
    print(f"viewers: {t.frames:,} frames, {t.bytes / 2**20:.1f} MiB received; "
          f"display events dropped for slow viewers: {t.dropped:.0f}")
    print(f"largest gap between two frames a reading viewer saw: {t.max_gap * ms:.0f} ms")
    rss = (f"{t.rss_start_mib:.0f} MiB at start, {t.rss_end_mib:.0f} MiB at end" if t.rss_start_mib and t.rss_end_mib
           else "n/a (a server this did not start)")
    print(f"server RSS: {rss}; blocks in use after the load (leaked): {t.leaked_blocks}")
    if args.tokenize_flood:
        print(f"tokenize flood: {t.flood_sent} messages sent before the server closed the socket or the run ended")
    print(f"requests: {t.ok} finished, lost: {len(t.lost)}")
    for line in t.lost[:10]:
        print(f"  lost {line}")


def run(args) -> int:
    proc = None
    url, token = args.url, args.token or ""
    if url is None:
        proc, url, token = start_server(args)
    try:
        tally = asyncio.run(load(args, url.rstrip("/"), token, proc))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    report(args, tally)
    return 0 if not tally.lost and not tally.leaked_blocks else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvscope bench serve")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
