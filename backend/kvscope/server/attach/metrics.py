"""vLLM's /metrics read into the pages' figures: counters as rates, histograms as interval means."""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

GAUGES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
          "kv_usage": "vllm:kv_cache_usage_perc"}
COUNTERS = {"prefix_cache_queries": "vllm:prefix_cache_queries", "prefix_cache_hits": "vllm:prefix_cache_hits",
            "preemptions": "vllm:num_preemptions", "prompt_tokens": "vllm:prompt_tokens",
            "generation_tokens": "vllm:generation_tokens"}
HISTOGRAMS = {"ttft_s": "vllm:time_to_first_token_seconds", "itl_s": "vllm:inter_token_latency_seconds",
              "e2e_s": "vllm:e2e_request_latency_seconds"}
# With --kv-cache-metrics only (vllm/v1/metrics/loggers.py), observed when a block is evicted,
# for a sample of blocks (--kv-cache-metrics-sample, 1 % by default)
LIFETIMES = {"lifetime": "vllm:kv_block_lifetime_seconds",
             "idle_before_evict": "vllm:kv_block_idle_before_evict_seconds",
             "reuse_gap": "vllm:kv_block_reuse_gap_seconds"}


@dataclass
class Sample:
    """One scrape: gauges, counters (totals since vLLM started), histogram sums and counts."""
    values: dict[str, float]
    hist: dict[str, tuple[float, float]]
    cache_config: dict[str, str]
    lifetimes: dict[str, dict] | None = None   # None: vLLM runs without --kv-cache-metrics


def parse(text: str, engine: str | None = None) -> Sample:
    """Summed over label sets; `engine` keeps one data-parallel rank's samples (vLLM's engine="RANK")."""
    values: dict[str, float] = {}
    hist: dict[str, tuple[float, float]] = {}
    cache_config: dict[str, str] = {}
    wanted = {v: k for k, v in {**GAUGES, **COUNTERS}.items()}
    wanted_hist = {v: k for k, v in HISTOGRAMS.items()}
    wanted_life = {v: k for k, v in LIFETIMES.items()}
    lifetimes: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info":
            for s in family.samples:
                cache_config = dict(s.labels)
        elif family.name.removesuffix("_total") in wanted:   # untyped exposition keeps the suffix
            key = wanted[family.name.removesuffix("_total")]
            for s in family.samples:
                if not s.name.endswith("_created") and _ours(s, engine):
                    values[key] = values.get(key, 0.0) + s.value
        elif family.name in wanted_life:
            lifetimes[wanted_life[family.name]] = histogram(family.samples, engine)
        elif family.name in wanted_hist:
            h = histogram(family.samples, engine)
            hist[wanted_hist[family.name]] = (h["sum"], h["count"])
    return Sample(values, hist, cache_config, lifetimes or None)


def histogram(samples, engine: str | None) -> dict:
    """Counts per bucket (not cumulative), with count and sum, summed over label sets."""
    cumulative: dict[float, float] = {}
    count = total = 0.0
    for s in samples:
        if not _ours(s, engine):
            continue
        if s.name.endswith("_bucket"):
            le = float(s.labels["le"])
            cumulative[le] = cumulative.get(le, 0.0) + s.value
        elif s.name.endswith("_count"):
            count += s.value
        elif s.name.endswith("_sum"):
            total += s.value
    bounds = sorted(cumulative)
    counts = [int(cumulative[b] - (cumulative[bounds[i - 1]] if i else 0)) for i, b in enumerate(bounds)]
    return {"le": [b if b != float("inf") else None for b in bounds], "counts": counts,
            "count": int(count), "sum": round(total, 6)}


def _ours(sample, engine: str | None) -> bool:
    return engine is None or sample.labels.get("engine", engine) == engine


def figures(now: Sample, before: Sample | None, interval_s: float) -> dict:
    """`engine.vllm`'s figures: gauges, totals, rates and latency means over the interval (null if none)."""
    v = now.values
    out = {"running": int(v.get("running", 0)), "waiting": int(v.get("waiting", 0)),
           "kv_usage": round(v.get("kv_usage", 0.0), 4)}
    for key in COUNTERS:
        out[key] = int(v.get(key, 0))
    queries = v.get("prefix_cache_queries", 0.0)
    out["prefix_cache_hit_rate"] = round(v.get("prefix_cache_hits", 0.0) / queries, 4) if queries else None
    prev = before.values if before else {}
    dt = max(interval_s, 1e-6)
    out["generation_tokens_per_s"] = round(max(0.0, v.get("generation_tokens", 0) - prev.get("generation_tokens", 0)) / dt, 1) if before else None
    out["prompt_tokens_per_s"] = round(max(0.0, v.get("prompt_tokens", 0) - prev.get("prompt_tokens", 0)) / dt, 1) if before else None
    for key in HISTOGRAMS:
        total, count = now.hist.get(key, (0.0, 0.0))
        p_total, p_count = (before.hist.get(key, (0.0, 0.0)) if before else (0.0, 0.0))
        n = count - p_count
        out[key] = round((total - p_total) / n, 5) if n > 0 else None
        out[f"{key.removesuffix('_s')}_mean_s"] = round(total / count, 5) if count else None   # since vLLM started
    out["block_lifetimes"] = now.lifetimes
    return out
