"""Prometheus metrics, fed from the same events the viewers see."""
from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

disable_created_metrics()   # the *_created series only add noise to a scrape

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        latency = partial(Histogram, buckets=LATENCY_BUCKETS, registry=r)   # seconds, from 5 ms to 30 s
        self._num_blocks = 0
        self.requests = Counter("kvscope_requests", "Finished requests", ["source", "reason"], registry=r)
        self.prompt_tokens = Counter("kvscope_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("kvscope_generation_tokens", "Generated tokens", registry=r)
        self.ttft = latency("kvscope_time_to_first_token_seconds", "Time to first token")
        self.itl = latency("kvscope_inter_token_latency_seconds", "Time between output tokens")
        self.e2e = latency("kvscope_request_latency_seconds", "Arrival to last token")
        self.steps = Counter("kvscope_engine_steps", "Engine steps", registry=r)
        self.step_seconds = latency("kvscope_step_seconds", "Duration of one engine step")
        self.batched_tokens = Counter("kvscope_batched_tokens", "Tokens computed by the engine", registry=r)
        self.running = Gauge("kvscope_requests_running", "Requests in the running queue", registry=r)
        self.waiting = Gauge("kvscope_requests_waiting", "Requests in the waiting queue", registry=r)
        self.kv_used = Gauge("kvscope_kv_blocks_used", "KV blocks holding a live sequence", registry=r)
        self.kv_total = Gauge("kvscope_kv_blocks_total", "KV blocks in the pool", registry=r)
        self.kv_usage = Gauge("kvscope_kv_cache_usage_ratio", "Fraction of KV blocks in use", registry=r)
        self.prefix_hits = Gauge("kvscope_prefix_cache_hit_blocks", "Blocks reused from the prefix cache", registry=r)
        self.viewers = Gauge("kvscope_viewers", "Connected WebSocket viewers", registry=r)
        self.dropped = Counter("kvscope_dropped_display_events", "Display events dropped for slow viewers",
                               registry=r)

    def observe(self, e: dict, source: str) -> None:
        kind = e["type"]
        if kind == "step":
            self.steps.inc()
            self.step_seconds.observe(e["duration_s"])
            self.batched_tokens.inc(e["num_batched_tokens"])
            self.running.set(e["queues"]["running"])
            self.waiting.set(e["queues"]["waiting"])
        elif kind == "kv":
            if e["kind"] == "snapshot":
                self._num_blocks = e["num_blocks"]
                self.kv_total.set(self._num_blocks)
            total = self._num_blocks or 1
            used = total - e["num_free"]
            self.kv_used.set(used)
            self.kv_usage.set(used / total)
            self.prefix_hits.set(e["prefix_hits"])
        elif kind == "request.finished":
            self.requests.labels(source, e["reason"]).inc()
            self.prompt_tokens.inc(e["num_prompt_tokens"])
            self.generation_tokens.inc(e["num_output_tokens"])
            if e["ttft_s"] is not None:
                self.ttft.observe(e["ttft_s"])
            for x in e["itl_s"]:
                self.itl.observe(x)
            self.e2e.observe(e["e2e_s"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
