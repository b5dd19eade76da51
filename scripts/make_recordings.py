"""Record the sessions committed in frontend/recordings/ (replayed by the pages when no
backend runs, and used by the tests as fixtures): a real server with the embedded model,
driven over its own WebSocket with the instructor's record_start/record_stop.

The serving scenarios (batching, paging, chunked prefill, the step plan) pause the engine
and advance it with the instructor's single step, so requests join at chosen steps and every
recording is the same each time it is made (seeded sampling, ignore_eos); replay is paced by steps, so
tens of steps make an episode a learner can follow: every recording runs at least
MIN_STEPS engine steps, each request whole (arrival, prefill, decode, finish, its blocks
freed), and every prompt a widget labels is tokenized first, so a replay shows its text.

    python scripts/make_recordings.py [--out frontend/recordings] [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "recording"
GREEDY = {"temperature": 0, "ignore_eos": True}
MIN_STEPS = 30   # at the replay's default 4 steps a second, 8 s or more to follow an episode
SYSTEM = ("You are a friendly storyteller. You write short, happy stories for children about animals "
          "who live by the sea, and you always end with a kind sentence.")


class Driver:
    """An instructor connection: send commands, wait for events."""

    def __init__(self, url: str):
        from websockets.sync.client import connect
        self.ws = connect(f"{url}?token={TOKEN}", max_size=None, compression=None).__enter__()
        self.seen: list[dict] = []
        self.ref = 0
        self.call("subscribe", families=["request"])   # to see injected requests finish

    def _next(self, timeout: float) -> list[dict]:
        frame = json.loads(self.ws.recv(timeout=timeout))
        events = frame if isinstance(frame, list) else [frame]
        self.seen += events
        return events

    def until(self, predicate, timeout: float = 60.0) -> dict:
        for event in self.seen:
            if predicate(event):
                return event
        deadline = time.monotonic() + timeout
        while True:
            for event in self._next(max(0.01, deadline - time.monotonic())):
                if predicate(event):
                    return event

    def call(self, kind: str, **fields) -> dict:
        self.ref += 1
        ref = self.ref
        self.ws.send(json.dumps({"type": kind, "ref": ref, **fields}))
        reply = self.until(lambda e: e.get("ref") == ref)
        if reply["type"] == "error":
            raise RuntimeError(f"{kind}: {reply['message']}")
        return reply

    def steps(self, n: int | None = None) -> int:
        """Single-step the paused engine n times (None: until no request can advance)."""
        done = 0
        while n is None or done < n:
            if self.call("step")["step"] is None:
                break
            done += 1
        return done

    def next_tokens(self, rid: str, n: int) -> None:
        """Draw the next n tokens of a held request, one step each, waiting for each."""
        start = sum(1 for e in self.seen if e["type"] == "request.token" and e["request_id"] == rid)
        for i in range(start, start + n):
            self.call("next", request_id=rid)
            self.until(lambda e, i=i: e["type"] == "request.token" and e["request_id"] == rid and e["index"] == i)
            self.settle(0.1)

    def inject(self, max_tokens: list[int], prompt_tokens: int) -> list[str]:
        return [self.call("inject", n=1, max_tokens=m, prompt_tokens=prompt_tokens)["request_ids"][0]
                for m in max_tokens]

    def submit(self, **fields) -> str:
        return self.call("submit", **fields)["request_id"]

    def finished(self, *rids: str) -> None:
        for rid in rids:
            self.until(lambda e: e["type"] == "request.finished" and e["request_id"] == rid)

    def settle(self, seconds: float = 0.3) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                self._next(max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                return


# -- scenarios -----------------------------------------------------------------------------
def default(d: Driver) -> None:
    """A small class: three prompts of different lengths batched together (none watched: the
    pages that replay it draw steps and requests, and attention would triple its size)."""
    d.call("tokenize", text="Once upon a time, a little fox found a shiny stone.")
    d.call("tokenize", text="The old lighthouse keeper")
    d.call("tokenize", text="Tell me about a cat.", chat=True)
    a = d.submit(prompt="Once upon a time, a little fox found a shiny stone.", params={**GREEDY, "max_tokens": 32})
    b = d.submit(prompt="The old lighthouse keeper", params={"temperature": 0.8, "seed": 1, "max_tokens": 36})
    c = d.submit(messages=[{"role": "user", "content": "Tell me about a cat."}], params={**GREEDY, "max_tokens": 30})
    d.finished(a, b, c)


def attention(d: Driver) -> None:
    """One watched prompt: attention for every layer and head, and each draw, for its first
    tokens; then it runs on unwatched to its end (the file stays small)."""
    text = "The cat sat on the mat because it was tired."
    d.call("tokenize", text=text)
    rid = d.submit(prompt=text, params={"temperature": 0.8, "top_k": 40, "top_p": 0.9, "seed": 7, "max_tokens": MIN_STEPS},
                   watch={}, hold=True)
    d.next_tokens(rid, 8)
    d.call("unwatch", request_id=rid)
    d.call("release", request_id=rid)
    d.finished(rid)


def step_by_step(d: Driver) -> None:
    """A held request stepped one token at a time (the KV cache filling per step)."""
    text = "Mia wanted to bake a cake"
    d.call("tokenize", text=text)
    rid = d.submit(prompt=text, params={**GREEDY, "max_tokens": MIN_STEPS}, hold=True,
                   watch={"layers": [0], "sampling": True})
    d.next_tokens(rid, MIN_STEPS)
    d.finished(rid)
    # chapter 12's <kv-quant-cache> (same page, same recording): each 8-bit cache against the
    # unquantized one, on its default prompt
    for dtype in ("fp8_e4m3", "fp8_e5m2", "int8_per_token_head"):
        d.call("kv_quant", prompt="Once upon a time, a little fox found a shiny stone by the river.",
               kv_cache_dtype=dtype, max_tokens=16)


def batching(d: Driver) -> None:
    """Continuous batching with room for four: three requests, two more join mid-flight
    (one waits for a place), two more later; they leave at different steps."""
    d.call("set_knobs", max_num_seqs=4)
    d.call("pause")
    d.inject([10, 24, 16], prompt_tokens=12)
    d.steps(5)
    d.inject([12, 20], prompt_tokens=20)
    d.steps(8)
    d.inject([14, 8], prompt_tokens=8)
    d.steps()
    d.call("resume")
    d.call("set_knobs", max_num_seqs=64)


def prefix_cache(d: Driver) -> None:
    """Two chats that share a system prompt, as chapter 16's demo sends them: the first is
    prefilled and held, the second reuses its full blocks (ref count 2) and computes only the
    rest; then both finish and the shared blocks stay cached."""
    held = []
    for animal in ("crab", "seal"):
        rid = d.submit(messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"A story about a {animal}."}],
                       params={**GREEDY, "max_tokens": MIN_STEPS}, hold=True)
        d.call("next", request_id=rid)
        d.until(lambda e, rid=rid: e["type"] == "request.token" and e["request_id"] == rid)
        d.settle(0.3)
        held.append(rid)
    for rid in held:
        d.call("release", request_id=rid)
    d.finished(*held)
    whole_blocks_and_salts(d)


# as chapter 16's "Whole blocks, and cache salts" panel sends them (frontend/js/widgets/lib/prefix-lessons.js)
TUTOR = ("You are a patient tutor. You explain how computers work in short, plain sentences, one idea at a time, "
         "and you always finish with a small example the student can check by hand. If a question is unclear, you "
         "ask one short question back before answering. Now answer the student's question.")
ENDINGS = (" What is a byte, and how many different numbers can one byte hold? Explain it with a small example I can "
           "check by hand.", " Tell me why the sky looks blue at noon but red at sunset, in three short sentences, "
           "with one experiment I can try at home.")
SALT_ENDING = " How does a bicycle stay up when it moves, and why does it fall over when it stops?"


def whole_blocks_and_salts(d: Driver) -> None:
    """Pairs sharing less than a block (nothing cached) and more (whole blocks cached), one
    after the other; then one prompt as tenant A, tenant B and A again (only A's second hits)."""
    ids = lambda text: d.call("tokenize", text=text)["ids"]   # noqa: E731
    tutor, endings, salt_ending = ids(TUTOR), [ids(e) for e in ENDINGS], ids(SALT_ENDING)
    block_size = d.until(lambda e: e["type"] == "hello")["engine"]["block_size"]

    def run(prompts: list[list[int]], salts: list[str]) -> None:
        for prompt, salt in zip(prompts, salts):
            rid = d.submit(prompt_token_ids=prompt, params={**GREEDY, "max_tokens": 1}, cache_salt=salt)
            d.finished(rid)
            d.settle(0.3)
    for n in (block_size * 3 // 4, 2 * block_size + block_size // 2):
        run([tutor[:n] + e for e in endings], [f"pair-{n}"] * 2)
    run([tutor + salt_ending] * 3, ["tenant-A", "tenant-B", "tenant-A"])
    eviction_order(d)


def eviction_order(d: Driver) -> None:
    """The panel's eviction steps (EvictionDemo's STEPS) in the sandbox: two sequences share a
    prefix and finish; C and D then need more blocks than were never used."""
    d.call("sandbox", op="reset", num_blocks=8, block_size=4)
    d.call("sandbox", op="allocate", seq="A", tokens=12)
    d.call("sandbox", op="allocate", seq="B", tokens=12, prefix_of="A", prefix_tokens=8)
    d.call("sandbox", op="free", seq="A")
    d.call("sandbox", op="free", seq="B")
    d.call("sandbox", op="allocate", seq="C", tokens=24)
    d.call("sandbox", op="allocate", seq="D", tokens=8)


LONG_PROMPT = " ".join(["The little fox ran along the river to find the shiny stone."] * 8)


def long_prompt_amid_decodes(d: Driver) -> None:
    d.call("pause")
    runners = [d.submit(prompt=p, params={**GREEDY, "max_tokens": MIN_STEPS}) for p in ("The robot woke up", "Tom looked out")]
    d.steps(4)
    d.submit(prompt=LONG_PROMPT, params={**GREEDY, "max_tokens": 4})
    d.steps()
    d.call("resume")
    d.finished(*runners)


def chunked_prefill(d: Driver) -> None:
    """A long prompt arrives amid decodes and is cut into chunks of 16 tokens."""
    d.call("set_knobs", prefill_chunk_size=16, max_num_batched_tokens=24)
    long_prompt_amid_decodes(d)
    d.call("set_knobs", prefill_chunk_size=None, max_num_batched_tokens=256)


def chunked_prefill_off(d: Driver) -> None:
    """The same arrivals without chunked prefill: the whole prompt in one step, decodes stall."""
    d.call("set_knobs", enable_chunked_prefill=False, max_num_batched_tokens=1024)
    long_prompt_amid_decodes(d)
    d.call("set_knobs", enable_chunked_prefill=True, max_num_batched_tokens=256)


def step_plan(d: Driver) -> None:
    """vLLM V1's plan, step by step, under a budget of 32 tokens: three requests decode (they
    run, so they go first), a long prompt takes what the budget leaves and is spread over
    several steps, and a short prompt behind it waits until the long one's last chunk. The
    pool (SERVER_OPTIONS) then runs out as the decodes grow: the newest request is preempted,
    waits, and comes back recomputing its prompt and what it had drawn."""
    d.call("set_knobs", max_num_batched_tokens=32)
    d.call("pause")
    runners = [d.submit(prompt=p, params={**GREEDY, "max_tokens": MIN_STEPS})
               for p in ("The robot woke up", "Tom looked out", "Mia wanted a cake")]
    d.steps(3)
    d.submit(prompt=LONG_PROMPT, params={**GREEDY, "max_tokens": 6})
    d.submit(prompt="The old lighthouse keeper", params={**GREEDY, "max_tokens": 8})
    d.steps()
    d.call("resume")
    d.finished(*runners)
    d.call("set_knobs", max_num_batched_tokens=256)


def paging(d: Driver) -> None:
    """The page allocator: the pool fills as requests of different lengths arrive and grow,
    then drains block by block as they finish; then the sandbox poked by hand."""
    d.call("pause")
    d.inject([40, 64, 24], prompt_tokens=100)
    d.steps(6)
    d.inject([48, 32, 56], prompt_tokens=140)
    d.steps()
    d.call("resume")
    d.call("sandbox", op="reset", num_blocks=16, block_size=4, max_model_len=32)
    d.call("sandbox", op="allocate", seq="A", tokens=10)
    d.call("sandbox", op="fork", seq="A", new_seq="B")
    d.call("sandbox", op="allocate", seq="C", tokens=9, prefix_of="A", prefix_tokens=8)
    d.call("sandbox", op="append", seq="B", tokens=3)
    d.call("sandbox", op="free", seq="A")


def internals(d: Driver) -> None:
    """One prompt watched whole: attention, every draw with its raw logits, and the model's
    internals (embeddings, RoPE, residual stream, MLP, logit lens) for chapters 3 and 5-10."""
    text = "The little cat sat on the mat"
    d.call("tokenize", text=text)
    rid = d.submit(prompt=text, params={**GREEDY, "max_tokens": MIN_STEPS}, watch={"internals": True}, hold=True)
    d.next_tokens(rid, 3)
    d.call("unwatch", request_id=rid)   # the rest unwatched: every draw's logits would be megabytes
    d.call("release", request_id=rid)
    d.finished(rid)


SAMPLING_PROMPT = "One day, Lily went to the"   # chapter 10: next tokens from 8 % to 100 % likely


def sampling(d: Driver) -> None:
    """Chapter 10's prompt drawn greedily, its first draws with the raw logits (the sliders
    reshape them in the page), then the rest unwatched."""
    d.call("tokenize", text=SAMPLING_PROMPT)
    rid = d.submit(prompt=SAMPLING_PROMPT, params={**GREEDY, "max_tokens": MIN_STEPS}, hold=True,
                   watch={"internals": True, "layers": [], "sampling": True})
    d.next_tokens(rid, 4)
    d.call("unwatch", request_id=rid)
    d.call("release", request_id=rid)
    d.finished(rid)


def run_sweep(d: Driver, levels: list[int], max_tokens: int) -> None:
    ack = d.call("sweep", levels=levels, max_tokens=max_tokens)
    done = sum(1 for e in d.seen if e["type"] == "request.finished") + sum(ack["requests"])
    d.until(lambda e: sum(1 for x in d.seen if x["type"] == "request.finished") >= done, timeout=600)


def throughput(d: Driver) -> None:
    """Chapter 20's sweep: the server's own `sweep` job from 1 to 32 requests in flight, in real
    time (no stepping), so each level's throughput, TTFT and inter-token latency are measured ones."""
    run_sweep(d, [1, 2, 4, 8, 16, 32], 16)


RETOLD = ("Once upon a time, a little fox found a shiny stone near the river. She was kind, and she loved telling "
          "jokes. One sunny morning, Omar and Oscar went to the river to play with her new paint box.\n\n"
          "Once upon a time, a little fox found a shiny stone near the river. She")


def speculation(d: Driver) -> None:
    """Prompt-lookup drafting (k = 3): a story told twice, greedy, then a fresh one sampled."""
    first = d.submit(prompt=RETOLD, params={**GREEDY, "max_tokens": 32})
    d.finished(first)
    second = d.submit(prompt="The old lighthouse keeper looked at the sea and",
                      params={"temperature": 0.8, "seed": 1, "max_tokens": 16})
    d.finished(second)


# run before the recording starts: a first request's one-off costs are not the lesson's figures
WARM_UP = {"throughput": lambda d: run_sweep(d, [1, 4], 8)}
# recordings kept to the events their widget reads (the sweep's steps would be megabytes)
KEEP_ONLY = {"throughput": {"recording", "hello", "request.added", "request.finished"}}


def spec_sampling(d: Driver) -> None:
    """Chapter 18's exact sampling rule: a story told twice, sampled (so drafts are accepted
    with probability min(1, p/q)), watched so each pass's `spec` event carries p and q."""
    rid = d.submit(prompt=RETOLD, params={"temperature": 0.8, "seed": 3, "max_tokens": 48, "ignore_eos": True},
                   watch={"layers": [], "sampling": False})   # the spec events' p and q; no sampling events
    d.finished(rid)


def ring(d: Driver) -> None:
    """Chapter 19's <kv-ring-allreduce>: two ranks (SERVER_OPTIONS), a short and a longer
    prompt decoding side by side, so each step's `allreduce_bytes` follows its token count."""
    a = d.submit(prompt="The robot woke up", params={**GREEDY, "max_tokens": MIN_STEPS})
    b = d.submit(prompt=LONG_PROMPT, params={**GREEDY, "max_tokens": 12})
    d.finished(a, b)


ROOFLINE_BATCHES = (1, 2, 4, 8, 16)


def roofline(d: Driver) -> None:
    """Chapter 13's <kv-roofline>: the same short requests run 1, 2, 4, 8 and 16 at a time,
    so each batch size has its own decode steps (FLOPs, bytes, time) to plot."""
    for batch in ROOFLINE_BATCHES:   # one level each, as the widget's live button runs them
        run_sweep(d, [batch], 10)
        d.settle(0.3)


REPEATING = ("The cat sat on the mat. The cat sat on the mat. The cat sat on the",
             "One, two, three. One, two, three. One, two,", "Mia ran home. Mia ran home. Mia ran")


def catch_up(d: Driver) -> None:
    """Chapter 14's <kv-catch-up>: one budget of 32 tokens covering all four kinds of row.
    Three repeating prompts decode with prompt-lookup drafts (verify rows), a long prompt is
    cut into chunks by what they leave, and the small pool (SERVER_OPTIONS) runs out, so a
    request is preempted and later recomputed."""
    d.call("set_knobs", max_num_batched_tokens=32)
    d.call("pause")
    runners = [d.submit(prompt=p, params={**GREEDY, "max_tokens": MIN_STEPS}) for p in REPEATING]
    d.steps(3)
    d.submit(prompt=LONG_PROMPT, params={**GREEDY, "max_tokens": 6})
    d.steps()
    d.call("resume")
    d.finished(*runners)
    d.call("set_knobs", max_num_batched_tokens=256)


# chapter 16's <kv-hash-chain>: one prompt cut to a block less one token, a whole number of
# blocks and a block plus one, each sent twice under one salt (the second reuses what the
# first left cached), then the longest under another salt (nothing shared)
CHAIN_PROMPT = ("A lighthouse stood at the end of a long stone pier. Every night its keeper climbed the "
                "winding stairs, wiped the salt from the glass, and lit the lamp for the boats coming home.")
CHAIN_SALTS = ("tenant-A", "tenant-B")   # frontend/js/widgets/kv-hash-chain.js names them in this order


def hash_chain(d: Driver) -> None:
    """Chapter 16's hash chain: which blocks of a 31-, 32- and 33-token prompt (blocks of 16)
    a second, identical request finds in the cache, and that a new salt finds none."""
    ids = d.call("tokenize", text=CHAIN_PROMPT)["ids"]
    block_size = d.until(lambda e: e["type"] == "hello")["engine"]["block_size"]
    lengths = (2 * block_size - 1, 2 * block_size, 2 * block_size + 1)
    runs = [(n, CHAIN_SALTS[0]) for n in lengths] + [(lengths[-1], CHAIN_SALTS[1])]
    for n, salt in runs:
        for _ in range(2):
            rid = d.submit(prompt_token_ids=ids[:n], params={**GREEDY, "max_tokens": 4}, cache_salt=salt)   # 4 steps each: 32 in all
            d.finished(rid)
            d.settle(0.2)


# scenarios that need the server started with more options
NGRAM = ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']
SERVER_OPTIONS = {"speculation": NGRAM, "spec-sampling": NGRAM, "ring": ["--tensor-parallel-size", "2"],
                  # prompt lookup on a pool of 11 blocks: drafts verified, and a request preempted
                  "catch-up": [*NGRAM, "--num-kv-blocks", "11", "--max-model-len", "176"],
                  # a pool of 11 blocks: the decodes outgrow it while the long prompt runs, so one is preempted
                  "step-plan": ["--num-kv-blocks", "11", "--max-model-len", "176"]}
SCENARIOS = {"default": default, "attention": attention, "step-by-step": step_by_step, "batching": batching,
             "prefix-cache": prefix_cache, "chunked-prefill": chunked_prefill,
             "chunked-prefill-off": chunked_prefill_off, "step-plan": step_plan, "paging": paging, "throughput": throughput,
             "internals": internals, "sampling": sampling, "speculation": speculation, "hash-chain": hash_chain,
             "spec-sampling": spec_sampling, "ring": ring, "catch-up": catch_up,
             "roofline": roofline}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "frontend" / "recordings"))
    ap.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    opts = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    names = opts.only or list(SCENARIOS)
    plain = [n for n in names if n not in SERVER_OPTIONS]
    if plain:
        record(plain, [], opts.out)
    for name in names:
        if name in SERVER_OPTIONS:
            record([name], SERVER_OPTIONS[name], opts.out)
    return 0


def keep_only(path: Path, types: set[str]) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(line for line in lines if json.loads(line)["type"] in types))


def record(names: list[str], server_options: list[str], out: str) -> None:
    import uvicorn

    from kvscope.server.cli_args import add_serve_arguments
    from kvscope.server.app import WS_MAX_FRAME
    from kvscope.server.main import build_app
    port = free_port()
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--port", str(port), "--instructor-token", TOKEN, "--threads", "1",
                              "--num-kv-blocks", "96", "--max-num-batched-tokens", "256",
                              "--recordings-dir", out, *server_options])
    app, service = build_app(args)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           ws_max_size=WS_MAX_FRAME, ws_per_message_deflate=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        for name in names:
            d = Driver(f"ws://127.0.0.1:{port}/ws")
            d.call("reset")
            if name in WARM_UP:
                WARM_UP[name](d)
            d.settle(0.2)
            d.call("record_start", name=name)
            SCENARIOS[name](d)
            d.settle(0.5)   # the last memory/kv events
            stop = d.call("record_stop")
            if name in KEEP_ONLY:
                keep_only(Path(stop["path"]), KEEP_ONLY[name])
            size = Path(stop["path"]).stat().st_size
            print(f"{name}: {stop['events']} events, {size / 1024:.0f} KiB -> {stop['path']}")
            d.ws.close()
    finally:
        server.should_exit = True
        thread.join(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
