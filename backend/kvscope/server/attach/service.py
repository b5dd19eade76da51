"""The attached server as ws.py and commands.py see it: the same surface as EngineService
(hub, hello, policy, tokenize, submit, cancel, engine_state), backed by a vLLM server.
Commands that need kvscope's own engine are refused with a sentence saying so."""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from kvscope import __version__
from kvscope.instrumentation.facts import backend_facts, h100_reference
from kvscope.instrumentation.observer import Clock, RequestLabel
from kvscope.instrumentation.schema import SCHEMA_VERSION
from kvscope.server.attach.kv_pool import AttachedPool
from kvscope.server.attach.kv_subscriber import KVSubscriber
from kvscope.server.attach.metrics import figures, parse
from kvscope.server.attach.probe import AttachError, VllmServer, local_model_facts, probe
from kvscope.sampling_params import SamplingParams
from kvscope.server.attach.requests import run_request
from kvscope.server.attach.vllm_client import VllmClient, completion_params
from kvscope.server.api.commands import HANDLERS
from kvscope.server.config import ServerConfig
from kvscope.server.classroom.hub import Hub
from kvscope.server.classroom.sweeps import Sweep, SweepAccounts
from kvscope.server.service.metrics import Metrics
from kvscope.server.classroom.policy import Policy
from kvscope.server.service.engine_service import SYNTHETIC_PROMPTS, Submitted
from kvscope.server.errors import CommandError

log = logging.getLogger("kvscope.attach")
POLL_S = 1.0
SCRAPE_TIMEOUT_S = 5.0
DOWN_AFTER = 2   # failed scrapes in a row before the pages say "disconnected"
KV_EVENTS_HINT = ("vLLM was started without KV events: start it with --kv-events-config "
                  "'{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", "
                  "\"replay_endpoint\": \"tcp://*:5558\"}' to see its blocks here")
NEEDS_ENGINE = ("watch", "unwatch", "hold", "next", "release", "pace", "pause", "resume", "step", "reset",
                "slow_motion", "set_knobs", "inject", "record_start", "record_stop", "kv_quant")


class AttachService(SweepAccounts):
    def __init__(self, server: VllmServer, config: ServerConfig, kv_events_override: str | None = None):
        super().__init__()
        self.server, self.config = server, config
        self.kv_events_override = kv_events_override
        self.clock = Clock()
        self.started_at = time.time()
        self.metrics = Metrics()
        self.policy = Policy(config)
        self.hub = Hub(self.clock, self.metrics)
        self.vllm = VllmClient(server.url, server.model)
        self.block_size = server.block_size
        self.model_name = server.model
        self.connected = True
        self.figures: dict = {}
        self.pool: AttachedPool | None = None
        self.subscriber: KVSubscriber | None = None
        self.tasks: dict[str, asyncio.Task] = {}
        self._ids = itertools.count(1)
        self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvscope-attach")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.Task | None = None
        self._sample = None
        self._sample_t = 0.0
        self._runs: set[asyncio.Task] = set()   # sweeps (commands.sweep), until done
        self._synthetic_ids: list[list[int]] | None = None
        self.hello = self._hello()
        self.handlers = {**HANDLERS, **{kind: self._refuse for kind in NEEDS_ENGINE}}

    # -- facts ---------------------------------------------------------------------------
    def _hello(self) -> dict:
        s = self.server
        local = local_model_facts(s.model, s.block_size)
        model = local or unknown_model(s.model, s.max_model_len)
        # "kv" even without KV events: the allocator then says which vLLM flag turns them on
        capabilities = ["requests", "kv", "sandbox"]
        sched = s.scheduler
        device = s.device if s.device in ("cpu", "cuda") else "cpu"
        return {"type": "hello", "ts": 0.0, "schema_version": SCHEMA_VERSION,
                "server": f"kvscope {__version__} attached to vLLM {s.version}",
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
                "backend": {**backend_facts("vllm", s.version, capabilities, attached_url=s.url),
                            "unreported": unreported(s, local is not None)},
                "model": model,
                "device": {"type": device, "name": f"the vLLM server at {s.url}" + (f" ({s.device})" if s.device else ""),
                           "total_memory_bytes": 0, "peak_bandwidth_bytes_per_s": 0.0, "peak_flops": 0.0},
                "engine": {"block_size": s.block_size, "num_blocks": s.num_blocks, "kv_cache_bytes": s.kv_cache_bytes,
                           "max_num_batched_tokens": sched.get("max_num_batched_tokens", 0),
                           "max_num_seqs": sched.get("max_num_seqs", 0), "max_model_len": s.max_model_len,
                           "enable_prefix_caching": s.enable_prefix_caching, "attention_backend": "vllm",
                           "decode": f"vLLM {s.version}", "speculative": None, "tensor_parallel_size": 1},
                "h100": h100_reference()}

    def engine_state(self, reason: str) -> dict:
        s = self.server
        return {"type": "engine", "ts": self.clock(), "reason": reason, "paused": False,
                "step": self.pool.step if self.pool else 0, "slow_motion_s": 0.0,
                "knobs": {"max_num_batched_tokens": s.scheduler.get("max_num_batched_tokens", 0),
                          "max_num_seqs": s.scheduler.get("max_num_seqs", 0), "prefill_chunk_size": None,
                          "enable_chunked_prefill": True},
                "num_running": self.figures.get("running", 0), "num_waiting": self.figures.get("waiting", 0),
                "num_viewers": len(self.hub.viewers), "recording": None,
                "vllm": {"url": s.url, "version": s.version, "model": s.model, "connected": self.connected,
                         "retry_s": POLL_S, "kv_events": self.kv_events_note(),
                         "kv_cache_report_mode": "full" if s.supports_full_kv_report else "incremental",
                         "metrics": self.figures}}

    def kv_events_note(self) -> str:
        source = self.server.kv_events
        if source is None:
            return KV_EVENTS_HINT
        return f"subscribed to {source.endpoint}" + (f" (replay {source.replay_endpoint})" if source.replay_endpoint else "")

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.hub.bind(self._loop)
        self._start_pool()
        self._poller = self._loop.create_task(self._poll())

    def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for task in [*self.tasks.values(), *self._runs]:
            task.cancel()
        if self.subscriber is not None:
            self.subscriber.stop()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _start_pool(self) -> None:
        """A fresh pool (a new or restarted vLLM), filled from the publisher's replay."""
        if self.subscriber is not None:
            self.subscriber.stop()
            self.subscriber = None
        self.pool = AttachedPool(self.server.num_blocks, self.server.block_size)
        self.hub.dispatch([self.pool.snapshot(self.clock())])   # a restarted vLLM's cache is empty
        if self.server.kv_events is None:
            self.pool = None   # nothing to draw: the panel says which flag turns events on
            return
        self.subscriber = KVSubscriber(self.server.kv_events,
                                       lambda batch: self._loop.call_soon_threadsafe(self._on_batch, batch))
        self.subscriber.start()

    def _on_batch(self, batch) -> None:
        pool = self.pool
        if pool is None:
            return
        for h, tokens in pool.apply(batch):
            self._loop.create_task(self._label(pool, h, tokens))
        self.publish([])

    async def _label(self, pool: AttachedPool, h, tokens) -> None:
        try:
            pool.label(h, await self.vllm.detokenize(list(tokens)))
        except CommandError:
            return
        self.publish([])

    def publish(self, events: list[dict]) -> None:
        """Request events, then the pool's delta (if anything changed)."""
        delta = self.pool.delta(self.clock()) if self.pool is not None else None
        self.hub.dispatch(events + ([delta] if delta else []))

    async def _poll(self) -> None:
        """Scrape /metrics once a second; notice vLLM going away (DOWN_AFTER failed scrapes
        in a row, so one slow answer on a busy server is not a disconnect) and coming back."""
        failures = 0
        while True:
            await asyncio.sleep(POLL_S)
            try:
                r = await self.vllm.http.get("/metrics", timeout=SCRAPE_TIMEOUT_S)
                r.raise_for_status()
                sample = parse(r.text)
            except Exception:
                failures += 1
                if self.connected and failures >= DOWN_AFTER:
                    self.connected = False
                    log.warning("kvscope: lost the vLLM server at %s; retrying every %.0f s", self.server.url, POLL_S)
                    self.hub.broadcast(self.engine_state("step"))
                continue
            failures = 0
            if not self.connected and not await self._reconnect(sample):
                continue
            now = time.perf_counter()
            new = figures(sample, self._sample, now - self._sample_t)
            self._sample, self._sample_t = sample, now
            if new != self.figures:
                self.figures = new
                self.hub.broadcast(self.engine_state("step"))

    async def _reconnect(self, sample) -> bool:
        """The server answers again: the same process after a blip keeps the pool (the
        subscriber fetches what it missed); a restarted one (its counters went back, or
        its KV events moved) starts from an empty pool."""
        try:
            server = await asyncio.get_running_loop().run_in_executor(
                self._threads, probe, self.server.url, self.kv_events_override)
        except AttachError:
            return False
        before = self._sample.values.get("prompt_tokens", 0) if self._sample else 0
        restarted = sample.values.get("prompt_tokens", 0) < before or server.kv_events != self.server.kv_events
        self.server, self.connected = server, True
        log.warning("kvscope: the vLLM server at %s is back%s", server.url, " (restarted)" if restarted else "")
        if restarted:
            self._sample = None
            self._start_pool()
        self.hub.broadcast(self.engine_state("reset" if restarted else "step"))
        return True

    # -- what commands.py calls ----------------------------------------------------------
    async def _refuse(self, session, msg: dict) -> None:
        raise CommandError("attach", f"{msg['type']!r} needs kvscope's own engine; this server is attached to "
                                     f"vLLM at {self.server.url}, which shows its requests, blocks and metrics only")

    def _needs_engine(self, what: str) -> CommandError:
        return CommandError("attach", f"{what} needs kvscope's own engine; this server is attached to vLLM at "
                                      f"{self.server.url}, which runs a prompt as vLLM schedules it")

    # What commands.py reads of kvscope's engine for a submit's options (watching, its own
    # chunk size, a grammar): attached, each is refused with a sentence, never an AttributeError.
    @property
    def engine(self):
        raise self._needs_engine("this option of a submit (its own prefill chunk size)")

    @property
    def instr(self):
        raise self._needs_engine("watching a request's attention and sampling")

    async def compile_grammar(self, constraint) -> None:
        raise self._needs_engine("structured outputs from these pages")

    def touch_hold(self, rid: str, held: bool) -> None:
        raise self._needs_engine("holding a request")

    @property
    def learner_share(self) -> int:
        limit = self.config.limits.max_learner_requests
        return limit if limit is not None else 16

    def new_request_id(self) -> str:
        return f"r{next(self._ids)}"

    def completion_params(self, params) -> dict:
        """vLLM's fields for kvscope's SamplingParams; where the server can, it is asked to
        publish the prefix blocks each request reused (so the pool draws their hits)."""
        extra = {"vllm_xargs": {"kv_cache_report_mode": "full"}} if self.server.supports_full_kv_report else {}
        return {**completion_params(params), **extra}

    async def off_loop(self, fn, *args):
        result = fn(*args)
        return await result if asyncio.iscoroutine(result) else result

    def tokenize(self, text: str, chat: bool = False):
        raise CommandError("attach", "the token view needs kvscope's tokenizer; attached to vLLM it shows its recording")

    async def checked_prompt(self, body: dict, instructor: bool) -> tuple[list[int], str | None]:
        if "prompt_token_ids" in body:
            ids, text = list(body["prompt_token_ids"]), None
        elif body.get("prompt"):
            self.policy.check_prompt_text(body["prompt"], instructor)
            text = body["prompt"]
            ids = await self.vllm.tokenize(text)
        else:
            raise CommandError("invalid_field", "attached to vLLM, send a prompt or prompt_token_ids")
        self.policy.check_prompt_tokens(ids, instructor)
        return ids, text

    async def submit(self, rid, ids, params, source, label, watch=None, pace_s=0.0,
                     prefill_chunk_tokens=None, cache_salt=None, *engine_only) -> Submitted:
        """EngineService.submit's arguments; vLLM takes the cache salt too, the rest of what
        steers kvscope's scheduler (`engine_only`: options added there later) is refused."""
        if not self.connected:
            return Submitted(rid, len(ids), f"the vLLM server at {self.server.url} is not answering")
        if label.held or pace_s or watch or prefill_chunk_tokens or any(x is not None for x in engine_only):
            return Submitted(rid, len(ids), "holding, pacing, watching or chunking a request needs kvscope's own "
                                            "engine; attached to vLLM a prompt runs as vLLM schedules it")
        extra = {"cache_salt": cache_salt} if cache_salt else {}
        task = asyncio.get_running_loop().create_task(run_request(self, rid, ids, params, source, label, extra))
        self.tasks[rid] = task
        task.add_done_callback(lambda _t: self.tasks.pop(rid, None))
        await asyncio.sleep(0)   # request.added reaches the hub before the ack
        return Submitted(rid, len(ids))

    async def cancel(self, rid: str) -> bool:
        task = self.tasks.get(rid)
        if task is None:
            return False
        task.cancel()
        return True

    async def drop_viewer(self, viewer_id: str, request_ids: list[str]) -> None:
        for rid in request_ids:
            await self.cancel(rid)

    @property
    def num_watched(self) -> int:
        return 0

    def spawn(self, coro) -> None:
        """Run `coro` on the event loop, kept alive until it ends (or the server stops)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    async def measure(self, sweep: Sweep, concurrency: int, total: int, max_tokens: int) -> None:
        """EngineService.measure against vLLM: the same story prompts (tokenized by vLLM's
        tokenizer), the same sampling, `concurrency` requests in flight and the next one sent
        the moment one finishes. Every request ends in one request.finished, an error
        included, so the page's run always completes."""
        if self._synthetic_ids is None:
            try:
                self._synthetic_ids = [await self.vllm.tokenize(p) for p in SYNTHETIC_PROMPTS]
            except CommandError:
                self._synthetic_ids = [[] for _ in SYNTHETIC_PROMPTS]   # each request then fails with vLLM's own line
        numbers = iter(range(total))

        async def worker():
            for i in numbers:   # one iterator shared by the workers: each number is taken once
                if sweep.owner not in self.hub.viewers:
                    return
                prompt = SYNTHETIC_PROMPTS[i % len(SYNTHETIC_PROMPTS)]
                params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, seed=i, ignore_eos=True)
                rid = self.new_request_id()
                sweep.request_ids.add(rid)
                await run_request(self, rid, self._synthetic_ids[i % len(SYNTHETIC_PROMPTS)], params, "ws",
                                  RequestLabel(owner=sweep.owner, prompt=prompt), {})
        await asyncio.gather(*(worker() for _ in range(concurrency)))


MODEL_FIELDS = ("architecture", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size", "rope_theta", "num_params", "dtype", "dtype_bytes",
                "weight_bytes", "kv_bytes_per_token")


def unreported(server: VllmServer, model_known: bool) -> list[str]:
    """hello keys the attached server does not report (filled with 0 or a stand-in to keep
    the event's shape): a page shows them as not reported instead of stating the stand-in."""
    keys = ["device.total_memory_bytes", "device.peak_bandwidth_bytes_per_s", "device.peak_flops",
            "engine.tensor_parallel_size"]
    if server.device not in ("cpu", "cuda"):
        keys.append("device.type")
    keys += [f"engine.{k}" for k in ("max_num_seqs", "max_num_batched_tokens") if k not in server.scheduler]
    if not server.kv_cache_bytes:
        keys.append("engine.kv_cache_bytes")
    if not model_known:
        keys += [f"model.{k}" for k in MODEL_FIELDS]
    return keys


def unknown_model(name: str, max_model_len: int) -> dict:
    """hello.model when the checkpoint is not on this machine: only what vLLM says."""
    return {"name": name, "architecture": "unknown (served by vLLM)", "num_layers": 0, "hidden_size": 0,
            "num_heads": 0, "num_kv_heads": 0, "head_dim": 0, "intermediate_size": 0, "vocab_size": 0,
            "max_position_embeddings": max_model_len, "rope_theta": 0.0, "num_params": 0, "dtype": "unknown",
            "dtype_reason": "the checkpoint is not on this machine", "dtype_bytes": 0, "weight_bytes": 0,
            "kv_bytes_per_token": 0, "tie_word_embeddings": False}
