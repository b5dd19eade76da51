"""EngineService's surface backed by vLLM servers; what needs our engine is refused with a sentence."""
from __future__ import annotations

import asyncio
import logging
import time

from kvscope import __version__
from kvscope.instrumentation.facts import backend_facts, h100_reference
from kvscope.instrumentation.observer import RequestLabel
from kvscope.instrumentation.schema import SCHEMA_VERSION
from kvscope.server.attach.kv_pool import AttachedPool
from kvscope.server.attach.kv_subscriber import KVSubscriber
from kvscope.server.attach.metrics import Sample, figures, parse
from kvscope.server.attach.replica import RankPool, Replica
from kvscope.server.attach.router import POLICIES, Candidate, Router
from kvscope.server.attach.probe import AttachError, VllmServer, local_model_facts, probe
from kvscope.sampling_params import SamplingParams
from kvscope.server.attach.requests import run_request
from kvscope.server.attach.vllm_client import VllmClient, completion_params
from kvscope.server.api.commands import HANDLERS
from kvscope.server.config import ServerConfig
from kvscope.server.classroom.sweeps import SYNTHETIC_PROMPTS
from kvscope.server.service.engine_service import ClassService, Submitted
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


class AttachService(ClassService):
    def __init__(self, servers: VllmServer | list[VllmServer], config: ServerConfig,
                 kv_events_override: str | None = None):
        super().__init__(config)
        servers = [servers] if isinstance(servers, VllmServer) else list(servers)
        self.kv_events_override = kv_events_override
        self.replicas: list[Replica] = []
        for server in servers:
            self.replicas.append(Replica(len(self.replicas), server, len(self.pools)))
        self.block_size = self.server.block_size
        self.model_name = self.server.model
        self.router = Router()
        self.policy_totals = {p: dict(POLICY_ZERO) for p in POLICIES}
        self.in_flight: dict[int, int] = {}      # pool -> requests kvscope sent and has not heard back about
        self.tasks: dict[str, asyncio.Task] = {}   # learners' requests, until vLLM finishes them
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synthetic_ids: list[list[int]] | None = None
        self.hello = self._hello()
        self.handlers = {**HANDLERS, **{kind: self._refuse for kind in NEEDS_ENGINE},
                         "route_policy": self._route_policy}

    @property
    def pools(self) -> list[RankPool]:
        return [p for r in self.replicas for p in r.pools]

    @property
    def server(self) -> VllmServer:
        """The first server: the one the pages' single-server text names."""
        return self.replicas[0].server

    @property
    def vllm(self) -> VllmClient:
        return self.replicas[0].client

    @property
    def connected(self) -> bool:
        return all(r.connected for r in self.replicas)

    @property
    def figures(self) -> dict:
        """The whole deployment's figures: every server's /metrics summed."""
        return sum_figures([p.figures for p in self.pools])

    def _hello(self) -> dict:
        s = self.server
        local = local_model_facts(s.model, s.block_size)
        model = local or unknown_model(s.model, s.max_model_len)
        # "kv" even without KV events: the allocator then says which vLLM flag turns them on
        capabilities = ["requests", "kv", "sandbox"]
        sched = s.scheduler
        device = s.device if s.device in ("cpu", "cuda") else "cpu"
        where = s.url if len(self.replicas) == 1 else f"{len(self.replicas)} vLLM servers ({', '.join(r.server.url for r in self.replicas)})"
        return {"type": "hello", "ts": 0.0, "schema_version": SCHEMA_VERSION,
                "server": f"kvscope {__version__} attached to vLLM {s.version}",
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at)),
                "backend": {**backend_facts("vllm", s.version, capabilities, attached_url=s.url),
                            "unreported": unreported(s, local is not None)},
                "model": model,
                "device": {"type": device, "name": f"the vLLM server at {where}" + (f" ({s.device})" if s.device else ""),
                           "total_memory_bytes": 0, "peak_bandwidth_bytes_per_s": 0.0, "peak_flops": 0.0},
                "engine": {"block_size": s.block_size, "num_blocks": s.num_blocks, "kv_cache_bytes": s.kv_cache_bytes,
                           "max_num_batched_tokens": sched.get("max_num_batched_tokens", 0),
                           "max_num_seqs": sched.get("max_num_seqs", 0), "max_model_len": s.max_model_len,
                           "enable_prefix_caching": s.enable_prefix_caching, "attention_backend": "vllm",
                           "decode": f"vLLM {s.version}", "speculative": None, "tensor_parallel_size": 1},
                "deployment": self.deployment(),
                "h100": h100_reference()}

    def deployment(self) -> dict:
        """The shape a page draws: servers, their ranks' pools, the one model and block size."""
        pools = self.pools
        return {"model": self.server.model, "block_size": self.server.block_size,
                "num_servers": len(self.replicas), "num_pools": len(pools),
                "servers": [r.describe() for r in self.replicas], "pools": [p.describe() for p in pools],
                "policies": list(POLICIES)}

    def engine_state(self, reason: str) -> dict:
        s = self.server
        fig = self.figures
        return {"type": "engine", "ts": self.clock(), "reason": reason, "paused": False,
                "step": max((p.mirror.step for p in self.pools if p.mirror), default=0), "slow_motion_s": 0.0,
                "knobs": {"max_num_batched_tokens": s.scheduler.get("max_num_batched_tokens", 0),
                          "max_num_seqs": s.scheduler.get("max_num_seqs", 0), "prefill_chunk_size": None,
                          "enable_chunked_prefill": True},
                "num_running": fig.get("running", 0), "num_waiting": fig.get("waiting", 0),
                "num_viewers": len(self.hub.viewers), "recording": None,
                "vllm": {"url": s.url, "version": s.version, "model": s.model, "connected": self.connected,
                         "retry_s": POLL_S, "kv_events": self.kv_events_note(),
                         "kv_cache_report_mode": "full" if s.supports_full_kv_report else "incremental",
                         "metrics": fig,
                         "servers": [{"server": r.index, "url": r.server.url, "connected": r.connected}
                                     for r in self.replicas],
                         "pools": [p.state(KV_EVENTS_HINT) for p in self.pools],
                         "router": {"policy": self.router.policy, "totals": self.policy_figures()}}}

    def health(self) -> dict:
        s = self.server
        return {"status": "ok" if self.connected else "disconnected", "attached": s.url,
                "vllm_version": s.version, "model": s.model, "viewers": len(self.hub.viewers),
                "kv_events": self.kv_events_note(), **self.figures}

    def kv_events_note(self) -> str:
        return "; ".join(f"{p.name}: {p.events_note(KV_EVENTS_HINT)}" if len(self.pools) > 1 else p.events_note(KV_EVENTS_HINT)
                         for p in self.pools)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.hub.loop = self._loop
        for replica in self.replicas:
            for pool in replica.pools:
                self._start_pool(pool)
            self.spawn(self._poll(replica))

    def stop(self) -> None:
        super().stop()
        for task in self.tasks.values():
            task.cancel()
        for pool in self.pools:
            pool.stop()

    def _start_pool(self, pool: RankPool) -> None:
        """A fresh pool (a new or restarted vLLM), filled from the publisher's replay."""
        pool.stop()
        s = pool.replica.server
        pool.mirror = AttachedPool(s.num_blocks, s.block_size)
        self.hub.dispatch([{**pool.mirror.snapshot(self.clock()), "pool": pool.index}])   # a restarted vLLM's cache is empty
        if pool.source is None:
            pool.mirror, pool.events = None, "off"   # nothing to draw: the panel says which flag turns events on
            return
        pool.events = "waiting"
        loop = self._loop
        pool.subscriber = KVSubscriber(pool.source, lambda batch: loop.call_soon_threadsafe(self._on_batch, pool, batch),
                                       on_state=lambda state: loop.call_soon_threadsafe(self._on_events_state, pool, state))
        pool.subscriber.start()

    def _on_events_state(self, pool: RankPool, state: str) -> None:
        if pool.events != state and pool.source is not None:
            pool.events = state
            if state == "silent":
                log.warning("kvscope: %s: %s", pool.name, pool.events_note(KV_EVENTS_HINT))
            self.hub.broadcast(self.engine_state("step"))

    def _on_batch(self, pool: RankPool, batch) -> None:
        mirror = pool.mirror
        if mirror is None:
            return
        for h, tokens in mirror.apply(batch):
            self._loop.create_task(self._label(pool, mirror, h, tokens))
        self.publish([], pool)

    async def _label(self, pool: RankPool, mirror: AttachedPool, h, tokens) -> None:
        try:
            mirror.label(h, await pool.replica.client.detokenize(list(tokens)))
        except CommandError:
            return
        self.publish([], pool)

    def publish(self, events: list[dict], pool: RankPool | None = None) -> None:
        """Request events, then the pool's delta (if anything changed)."""
        mirror = pool.mirror if pool is not None else None
        delta = mirror.delta(self.clock()) if mirror is not None else None
        self.hub.dispatch(events + ([{**delta, "pool": pool.index}] if delta else []))

    async def _scrape(self, replica: Replica) -> dict | None:
        """Each rank's Sample from one /metrics scrape; None when the server does not answer."""
        try:
            r = await replica.client.http.get("/metrics", timeout=SCRAPE_TIMEOUT_S)
            r.raise_for_status()
        except Exception:
            return None
        dp = replica.server.data_parallel_size > 1
        return {p.rank: parse(r.text, engine=str(p.rank) if dp else None) for p in replica.pools}

    async def _poll(self, replica: Replica) -> None:
        """Scrape one server's /metrics every POLL_S; DOWN_AFTER misses in a row mean it went away."""
        failures = 0
        while True:
            await asyncio.sleep(POLL_S)
            samples = await self._scrape(replica)
            if samples is None:
                failures += 1
                if replica.connected and failures >= DOWN_AFTER:
                    replica.connected = False
                    log.warning("kvscope: lost the vLLM server at %s; retrying every %.0f s", replica.server.url, POLL_S)
                    self.hub.broadcast(self.engine_state("step"))
                continue
            failures = 0
            if not replica.connected and not await self._reconnect(replica, samples):
                continue
            if self._take_samples(replica, samples):
                self.hub.broadcast(self.engine_state("step"))

    def _take_samples(self, replica: Replica, samples: dict) -> bool:
        """The ranks' figures and the policy's deltas from a scrape; True when a page would change."""
        now = time.perf_counter()
        before = replica.sample or {}
        changed = False
        totals = self.policy_totals[self.router.policy]
        for pool in replica.pools:
            sample, prev = samples[pool.rank], before.get(pool.rank)
            new = figures(sample, prev, now - replica.sample_t)
            if prev is not None:
                for key, delta in policy_deltas(sample, prev).items():
                    totals[key] += delta
                    changed = changed or delta != 0
            if new != pool.figures:
                pool.figures, changed = new, True
        replica.sample, replica.sample_t = samples, now
        return changed

    async def _reconnect(self, replica: Replica, samples: dict) -> bool:
        """The server is back: after a blip its pools stay; restarted (counters went back, events moved), empty."""
        try:
            override = self.kv_events_override if replica.index == 0 else None
            server = await self.off_loop(probe, replica.server.url, override)
        except AttachError:
            return False
        before = sum(s.values.get("prompt_tokens", 0) for s in (replica.sample or {}).values())
        now = sum(s.values.get("prompt_tokens", 0) for s in samples.values())
        restarted = now < before or server.kv_events != replica.server.kv_events
        replica.server, replica.connected = server, True
        log.warning("kvscope: the vLLM server at %s is back%s", server.url, " (restarted)" if restarted else "")
        if restarted:
            replica.sample = None
            for pool, source in zip(replica.pools, server.kv_events or [None] * len(replica.pools)):
                pool.source = source
                self._start_pool(pool)
        self.hub.broadcast(self.engine_state("reset" if restarted else "step"))
        return True

    def route(self, ids: list[int]) -> tuple[RankPool | None, dict]:
        """The pool for a prompt under the policy, and the `route` event (each pool's prefix and load)."""
        candidates = []
        for pool in self.pools:
            matched = len(pool.mirror.walk(ids)) if pool.mirror is not None else 0
            load = pool.figures.get("running", 0) + pool.figures.get("waiting", 0)
            candidates.append(Candidate(pool.index, matched, max(load, self.in_flight.get(pool.index, 0)),
                                        pool.replica.connected))
        choice = self.router.choose(candidates)
        event = {"type": "route", "ts": self.clock(), "request_id": None, "policy": self.router.policy,
                 "num_prompt_tokens": len(ids), "block_size": self.block_size, "choice": choice,
                 "candidates": [{"pool": c.pool, "matched_blocks": c.matched_blocks,
                                 "matched_tokens": c.matched_blocks * self.block_size, "load": c.load, "up": c.up}
                                for c in candidates]}
        return (self.pools[choice] if choice is not None else None), event

    async def _route_policy(self, session, msg: dict) -> None:
        """The instructor's router policy; the last scrape under the old one counts for the old one."""
        policy = msg.get("policy")
        if policy not in POLICIES:
            raise CommandError("invalid_field", f"policy: one of {', '.join(POLICIES)}")
        for replica in self.replicas:
            samples = await self._scrape(replica)
            if samples is not None:
                self._take_samples(replica, samples)
        self.router.policy = policy
        session.ack(msg, announce="knobs", policy=policy)

    def policy_figures(self) -> dict:
        """Per policy: what the servers reported while it routed (hit rate, mean TTFT)."""
        return {policy: {"requests": int(t["requests"]), "prefix_cache_hits": int(t["hits"]),
                         "prefix_cache_queries": int(t["queries"]),
                         "hit_rate": round(t["hits"] / t["queries"], 4) if t["queries"] else None,
                         "ttft_s": round(t["ttft_sum"] / t["requests"], 5) if t["requests"] else None}
                for policy, t in self.policy_totals.items()}

    async def _refuse(self, session, msg: dict) -> None:
        raise self._needs_engine(repr(msg["type"]))

    def _needs_engine(self, what: str) -> CommandError:
        return CommandError("attach", f"{what} needs kvscope's own engine; this server is attached to vLLM at "
                                      f"{self.server.url}, which schedules its requests itself")

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

    def completion_params(self, params) -> dict:
        """vLLM's fields for our SamplingParams, asking (where it can) for reused blocks to be published."""
        extra = {"vllm_xargs": {"kv_cache_report_mode": "full"}} if self.server.supports_full_kv_report else {}
        return {**completion_params(params), **extra}

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
        """EngineService.submit's arguments: the cache salt goes to vLLM, what steers our scheduler is refused."""
        if label.held or pace_s or watch or prefill_chunk_tokens or any(x is not None for x in engine_only):
            return Submitted(rid, len(ids), "holding, pacing, watching or chunking a request needs kvscope's own "
                                            "engine; attached to vLLM a prompt runs as vLLM schedules it")
        target, decision = self.route(ids)
        if target is None:
            where = ", ".join(r.server.url for r in self.replicas)
            return Submitted(rid, len(ids), f"no vLLM server is answering ({where})")
        extra = {"cache_salt": cache_salt} if cache_salt else {}
        if len(self.pools) > 1:
            self.hub.broadcast({**decision, "request_id": rid})
        task = asyncio.get_running_loop().create_task(
            run_request(self, target, rid, ids, params, source, label, extra))
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

    async def sweep_prompt_ids(self) -> list[list[int]]:
        """The story prompts tokenized by vLLM's tokenizer, once."""
        if self._synthetic_ids is None:
            try:
                self._synthetic_ids = [await self.vllm.tokenize(p) for p in SYNTHETIC_PROMPTS]
            except CommandError:
                self._synthetic_ids = [[] for _ in SYNTHETIC_PROMPTS]   # each request then fails with vLLM's own line
        return self._synthetic_ids

    async def run_sweep_request(self, rid: str, ids: list[int], params: SamplingParams, label: RequestLabel) -> None:
        """One sweep request, routed as a learner's; it always ends in request.finished, so the sweep completes."""
        target, _decision = self.route(ids)
        if target is None:
            target = self.pools[0]   # the request then ends with the server's own error line
        await run_request(self, target, rid, ids, params, "ws", label, {})


POLICY_ZERO = {"hits": 0.0, "queries": 0.0, "ttft_sum": 0.0, "requests": 0.0}


def policy_deltas(now: Sample, before: Sample) -> dict[str, float]:
    """One rank's prefix-cache hits and queries, TTFT sum and count between two scrapes."""
    ttft, p_ttft = now.hist.get("ttft_s", (0.0, 0.0)), before.hist.get("ttft_s", (0.0, 0.0))
    return {"hits": max(0.0, now.values.get("prefix_cache_hits", 0) - before.values.get("prefix_cache_hits", 0)),
            "queries": max(0.0, now.values.get("prefix_cache_queries", 0) - before.values.get("prefix_cache_queries", 0)),
            "ttft_sum": max(0.0, ttft[0] - p_ttft[0]), "requests": max(0.0, ttft[1] - p_ttft[1])}


def sum_figures(per_pool: list[dict]) -> dict:
    """The deployment's figures: counts add, the hit rate from the summed counters, latencies the mean."""
    per_pool = [f for f in per_pool if f]
    if not per_pool:
        return {}
    if len(per_pool) == 1:
        return dict(per_pool[0])
    out: dict = {}
    for key in per_pool[0]:
        values = [f.get(key) for f in per_pool if f.get(key) is not None]
        if key in ("ttft_s", "itl_s", "e2e_s", "ttft_mean_s", "itl_mean_s", "e2e_mean_s"):
            out[key] = round(sum(values) / len(values), 5) if values else None
        elif key == "kv_usage":
            out[key] = round(sum(values) / len(values), 4) if values else 0.0
        elif key in ("prefix_cache_hit_rate", "block_lifetimes"):   # per pool only
            continue
        else:
            out[key] = (round(sum(values), 1) if any(isinstance(v, float) for v in values) else sum(values)) if values else None
    queries = out.get("prefix_cache_queries") or 0
    out["prefix_cache_hit_rate"] = round(out.get("prefix_cache_hits", 0) / queries, 4) if queries else None
    return out


MODEL_FIELDS = ("architecture", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size", "rope_theta", "num_params", "dtype", "dtype_bytes",
                "weight_bytes", "kv_bytes_per_token")


def unreported(server: VllmServer, model_known: bool) -> list[str]:
    """hello keys vLLM does not report (a stand-in keeps the shape; the page says 'not reported')."""
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
    return {"name": name, **dict.fromkeys(MODEL_FIELDS, 0), "architecture": "unknown (served by vLLM)",
            "max_position_embeddings": max_model_len, "rope_theta": 0.0, "dtype": "unknown",
            "dtype_reason": "the checkpoint is not on this machine", "tie_word_embeddings": False}
