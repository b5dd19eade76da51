"""The event and command schema (JSON Schema, draft 2020-12), written as Python so the
engine needs no extra file at run time. `python -m kvscope.instrumentation.schema`
prints it; docs/events.schema.json is that output, and a test keeps the two equal."""
from __future__ import annotations

import json

# 2: a watched request's attention travels as a binary frame, its weights in float16
# (docs/events.md, "Binary frames").
# 3: one `attention` event a watched request and step carries every layer it watches
# (`layers`, weights [layers, heads, rows, context]) instead of one event a layer.
# 4: a `sampling` event lists its candidates once (`candidates`: ids, texts) and each stage
# carries arrays parallel to them (`logits`, `probs`) instead of a list of candidate objects.
# 5: a sampling stage a request does not apply carries only its name and `applied: false`
# (no `kept`, `logits`, `probs`: they are those of the last applied stage before it), and an
# attention event's `token_ids` are the context's positions new since the request's last one.
# Recordings of versions 1 to 4 are converted by scripts/upgrade_recordings.py.
SCHEMA_VERSION = 5
READABLE_VERSIONS = [5]

# -- tiny builders ---------------------------------------------------------------------
INT = {"type": "integer"}
NAT = {"type": "integer", "minimum": 0}
NUM = {"type": "number"}
NNUM = {"type": "number", "minimum": 0}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
NULL_STR = {"type": ["string", "null"]}
NULL_NUM = {"type": ["number", "null"]}
NULL_NAT = {"type": ["integer", "null"], "minimum": 0}
REF = {"type": ["string", "integer", "null"]}


def arr(items, **kw) -> dict:
    return {"type": "array", "items": items, **kw}


def obj(required: dict, optional: dict | None = None, extra: bool = False) -> dict:
    props = {**required, **(optional or {})}
    return {"type": "object", "properties": props, "required": sorted(required),
            "additionalProperties": extra}


def event(type_name: str | list[str], fields: dict, optional: dict | None = None) -> dict:
    const = {"const": type_name} if isinstance(type_name, str) else {"enum": type_name}
    return obj({"type": const, "ts": NNUM, **fields}, {"ref": REF, **(optional or {})})


KV_DTYPES = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head"]   # layers/attention.py

# -- events ----------------------------------------------------------------------------
MODEL = obj({k: v for k, v in {
    "name": STR, "architecture": STR, "num_layers": NAT, "hidden_size": NAT, "num_heads": NAT,
    "num_kv_heads": NAT, "head_dim": NAT, "intermediate_size": NAT, "vocab_size": NAT,
    "max_position_embeddings": NAT, "rope_theta": NUM, "num_params": NAT, "dtype": STR,
    "dtype_bytes": NAT, "weight_bytes": NAT, "kv_bytes_per_token": NAT,
    "tie_word_embeddings": BOOL}.items()}, {"dtype_reason": STR})
DEVICE = obj({"type": {"enum": ["cpu", "cuda"]}, "name": STR, "total_memory_bytes": NAT,
              "peak_bandwidth_bytes_per_s": NNUM, "peak_flops": NNUM})
SPEC_CONFIG = obj({"method": {"enum": ["ngram", "draft_model"]}, "num_speculative_tokens": NAT,
                   "model": NULL_STR, "prompt_lookup_max": NAT, "prompt_lookup_min": NAT})
ENGINE = obj({"block_size": NAT, "num_blocks": NAT, "kv_cache_bytes": NAT,
              "max_num_batched_tokens": NAT, "max_num_seqs": NAT, "max_model_len": NAT,
              "enable_prefix_caching": BOOL, "attention_backend": STR},
             {"speculative": {"oneOf": [{"type": "null"}, SPEC_CONFIG]}, "tensor_parallel_size": NAT,
              "rank_weight_bytes": NAT, "decode": STR, "kv_cache": STR,
              "prefill_attention": STR, "decode_attention": STR,
              "kv_cache_dtype": {"enum": KV_DTYPES}})
H100 = obj({"name": STR, "memory_bytes": NAT, "bandwidth_bytes_per_s": NNUM, "l2_bytes": NAT,
            "num_sms": NAT, "smem_per_sm_bytes": NAT, "peak_flops_bf16": NNUM,
            "pcie_bytes_per_s": NNUM, "nvlink_bytes_per_s": NNUM})
# What a server can show (hello.backend.capabilities); a widget names the ones it needs.
CAPABILITIES = ("requests", "tokenize", "kv", "steps", "step_rows", "memory", "attention", "sampling",
                "internals", "sandbox", "kv_quant", "speculation", "tensor_parallel", "instructor")
BACKEND = obj({"engine": {"enum": ["kvscope", "vllm"]}, "version": STR, "attached_url": NULL_STR,
               "capabilities": arr({"enum": list(CAPABILITIES)}, uniqueItems=True)},
              # serve --attach: hello keys the attached server does not report (stand-ins kept the shape)
              {"unreported": arr(STR, uniqueItems=True)})
# serve --attach URL [URL ...]: the servers, each data-parallel rank's pool (numbered as `kv.pool`)
DEPLOYMENT = obj({"model": STR, "block_size": NAT, "num_servers": NAT, "num_pools": NAT,
                  "servers": arr(obj({"server": NAT, "url": STR, "version": STR, "model": STR, "block_size": NAT,
                                      "num_blocks": NAT, "data_parallel_size": NAT, "pools": arr(NAT)})),
                  "pools": arr(obj({"pool": NAT, "name": STR, "server": NAT, "rank": NAT, "url": STR,
                                    "num_blocks": NAT, "block_size": NAT, "kv_events": NULL_STR})),
                  "policies": arr({"enum": ["round_robin", "least_loaded", "prefix"]})})
HELLO = event("hello", {"schema_version": {"enum": READABLE_VERSIONS}, "server": STR,
                        "started_at": STR, "backend": BACKEND, "model": MODEL, "device": DEVICE,
                        "engine": ENGINE, "h100": H100}, {"deployment": DEPLOYMENT})

FAMILIES = ["hello", "engine", "tokens", "request", "step", "kv", "attention", "sampling", "internals",
            "memory", "spec", "sandbox", "kv_quant", "viewers", "route", "ack", "error"]
SUBSCRIBABLE = ["request", "step", "kv", "attention", "sampling", "internals", "memory", "spec"]
FILTER = obj({}, {"request_id": {"oneOf": [STR, arr(STR, maxItems=64)]},
                  "layer": {"oneOf": [NAT, arr(NAT, maxItems=256)]},
                  "head": {"oneOf": [NAT, arr(NAT, maxItems=256)]}})
LIMITS = obj({"max_prompt_tokens": NAT, "max_prompt_chars": NAT, "max_tokens": NAT,
              "submits_per_minute": NNUM, "messages_per_second": NNUM, "max_frame_bytes": NAT,
              "max_active_requests": NAT, "max_watched_layers_x_heads": NAT},
             {"max_learner_requests": NAT, "hold_timeout_s": NNUM, "max_watched_prompt_tokens": NAT,
              "max_watches": NAT, "max_sweep_in_flight": NAT})
SESSION = event("session", {"client_id": STR, "role": {"enum": ["learner", "instructor"]},
                            "subscriptions": {"type": "object", "additionalProperties": FILTER},
                            "limits": LIMITS}, {"replay": BOOL})
KNOBS = obj({"max_num_batched_tokens": NAT, "max_num_seqs": NAT,
             "prefill_chunk_size": NULL_NAT, "enable_chunked_prefill": BOOL})
ENGINE_STATE = event("engine", {
    "reason": {"enum": ["connect", "pause", "resume", "step", "reset", "knobs", "inject", "recording",
                        "slow_motion"]},
    "paused": BOOL, "step": NAT, "knobs": KNOBS, "num_running": NAT, "num_waiting": NAT,
    "num_viewers": NAT,
    "recording": {"oneOf": [{"type": "null"}, obj({"name": STR, "events": NAT})]}},
    {"slow_motion_s": NNUM,
     # serve --attach: the vLLM server drawn, whether it answers, and its /metrics figures
     "vllm": obj({"url": STR, "version": STR, "model": STR, "connected": BOOL, "kv_events": STR,
                  "metrics": {"type": "object"}},
                 {"retry_s": NNUM, "kv_cache_report_mode": {"enum": ["full", "incremental"]},
                  "servers": arr(obj({"server": NAT, "url": STR, "connected": BOOL})),
                  "pools": arr(obj({"pool": NAT, "name": STR, "connected": BOOL,
                                    "events": {"enum": ["off", "waiting", "live", "silent"]}, "events_note": STR,
                                    "metrics": {"type": "object"}})),
                  "router": obj({"policy": {"enum": ["round_robin", "least_loaded", "prefix"]},
                                 "totals": {"type": "object", "additionalProperties": obj({
                                     "requests": NAT, "prefix_cache_hits": NAT, "prefix_cache_queries": NAT,
                                     "hit_rate": NULL_NUM, "ttft_s": NULL_NUM})}})})})

TOKEN = obj({"id": NAT, "piece": STR, "text": STR, "start": NAT, "end": NAT, "special": BOOL,
             "complete": BOOL})
TOKENS = event("tokens", {"text": STR, "num_bytes": NAT, "num_chars": NAT, "ids": arr(NAT),
                          "tokens": arr(TOKEN)})

PARAMS = obj({"temperature": NNUM, "top_k": INT, "top_p": NNUM, "min_p": NNUM,
              "seed": {"type": ["integer", "null"]}, "max_tokens": NAT, "stop": arr(STR),
              "stop_token_ids": arr(NAT), "ignore_eos": BOOL, "logprobs": NULL_NAT})
SOURCE = {"enum": ["ws", "generate", "openai", "synthetic", "api"]}
REQUEST_ADDED = event("request.added", {
    "request_id": STR, "source": SOURCE, "owner": NULL_STR, "prompt": NULL_STR,
    "prompt_token_ids": arr(NAT), "num_prompt_tokens": NAT, "params": PARAMS,
    "watched": BOOL, "held": BOOL})
TOP = arr(obj({"id": NAT, "logprob": NUM}))
REQUEST_TOKEN = event("request.token", {"request_id": STR, "index": NAT, "token_id": NAT,
                                        "text": STR, "step": NAT},
                      {"logprob": NUM, "top": TOP, "allowed_tokens": NAT})
REQUEST_FINISHED = event("request.finished", {
    "request_id": STR, "reason": {"enum": ["stop", "length", "abort", "error"]},
    "error": NULL_STR, "text": STR, "num_prompt_tokens": NAT, "num_output_tokens": NAT,
    "num_cached_tokens": NAT, "num_preemptions": NAT, "ttft_s": NULL_NUM, "e2e_s": NNUM,
    "itl_s": arr(NNUM)}, {"pool": NAT})
REQUEST_SNAPSHOT = event("request.snapshot", {"requests": arr(obj({
    "request_id": STR, "source": SOURCE, "owner": NULL_STR,
    "status": {"enum": ["waiting", "running", "held"]}, "num_prompt_tokens": NAT,
    "num_output_tokens": NAT, "num_computed_tokens": NAT, "held": BOOL, "watched": BOOL}))})

STEP_SEQ = obj({"request_id": STR, "kind": {"enum": ["prefill", "decode"]}, "start": NAT,
                "num_tokens": NAT, "context_len": NAT, "cached_tokens": NAT, "samples": BOOL},
               {"num_drafts": NAT, "last_block_recomputed": BOOL, "reason": {"enum": [
                   "new request", "resumed after preemption", "decode", "prefill chunk", "verify drafts"]}})
H100_COST = obj({"dtype": STR, "bytes": NAT, "flops": NAT, "memory_time_s": NNUM,
                 "compute_time_s": NNUM, "time_s": NNUM, "bound": {"enum": ["memory", "compute"]}})
COST = obj({"weight_bytes": NAT, "kv_read_bytes": NAT, "kv_write_bytes": NAT, "bytes": NAT,
            "flops": NAT, "achieved_bytes_per_s": NNUM, "achieved_flops_per_s": NNUM,
            "arithmetic_intensity": NNUM, "h100": H100_COST})
STEP = event("step", {
    "step": NAT, "seqs": arr(STEP_SEQ), "num_batched_tokens": NAT, "token_budget": NAT,
    "max_num_seqs": NAT, "preempted": arr(STR), "finished": arr(STR),
    "queues": obj({"waiting": NAT, "running": NAT}), "duration_s": NNUM, "schedule_s": NNUM,
    "model_s": NNUM, "cost": COST}, {"allreduce_bytes": NAT})

# `text` (the block's tokens as text) and `hits` (prefix-cache reuses) come from an attached vLLM
BLOCK = obj({"id": NAT, "ref": NAT, "filled": NAT, "hash": NULL_STR, "owners": arr(STR)},
            {"text": NULL_STR, "hits": NAT})
KV_TOTALS = {"num_free": NAT, "num_cached": NAT, "prefix_hits": NAT, "evictions": NAT}
KV_SNAPSHOT = obj({"type": {"const": "kv"}, "ts": NNUM, "kind": {"const": "snapshot"}, "step": NAT,
                   "block_size": NAT, "num_blocks": NAT, "blocks": arr(BLOCK),
                   "tables": {"type": "object", "additionalProperties": arr(NAT)}, **KV_TOTALS},
                  {"ref": REF, "pool": NAT})
KV_DELTA = obj({"type": {"const": "kv"}, "ts": NNUM, "kind": {"const": "delta"}, "step": NAT,
                "blocks": arr(BLOCK), "tables": {"type": "object", "additionalProperties": arr(NAT)},
                "removed_tables": arr(STR),
                "events": arr(obj({"op": {"enum": ["alloc", "free", "hit", "evict", "share", "cow"]}, "block": NAT,
                                   "request_id": NULL_STR})), **KV_TOTALS},
               {"ref": REF, "pool": NAT})
# serve --attach with several pools: where a prompt went and why (server/attach/router.py)
ROUTE = event("route", {"request_id": STR, "policy": {"enum": ["round_robin", "least_loaded", "prefix"]},
                        "num_prompt_tokens": NAT, "block_size": NAT, "choice": NAT,
                        "candidates": arr(obj({"pool": NAT, "matched_blocks": NAT, "matched_tokens": NAT,
                                               "load": NAT, "up": BOOL}))})

PROB = {"type": "number", "minimum": 0, "maximum": 1.0001}
# The weights travel as arrays after the header (`tensors` says their names, dtypes and
# shapes; a recording adds the bytes in base64 as `payload`); recordings converted from
# version 1 hold them as lists.
TENSOR = obj({"name": {"enum": ["weights", "mean"]}, "dtype": {"const": "float16"}, "shape": arr(NAT)})
ATTENTION = event("attention", {
    "request_id": STR, "step": NAT, "layers": arr(NAT, minItems=1), "heads": arr(NAT), "kv_heads": arr(NAT),
    # token_ids: the ids at the context's last len(token_ids) positions (those new since the last event)
    "num_heads": NAT, "query_positions": arr(NAT, minItems=1), "context_len": NAT, "token_ids": arr(NAT)},
    {"recomputed": BOOL, "tensors": arr(TENSOR, minItems=2, maxItems=2),
     "payload": {"type": "string", "contentEncoding": "base64"},
     "weights": arr(arr(arr(arr(PROB)))), "mean": arr(arr(arr(PROB)))})
ATTENTION["oneOf"] = [{"required": ["tensors"], "not": {"anyOf": [{"required": ["weights"]}, {"required": ["mean"]}]}},
                      {"required": ["weights", "mean"], "not": {"anyOf": [{"required": ["tensors"]},
                                                                         {"required": ["payload"]}]}}]
STAGE_NAME = {"enum": ["logits", "temperature", "top_k", "top_p", "min_p"]}
SAMPLING = event("sampling", {
    "request_id": STR, "step": NAT, "index": NAT,
    "params": obj({"temperature": NNUM, "top_k": INT, "top_p": NNUM, "min_p": NNUM}),
    "candidates": obj({"ids": arr(NAT, minItems=1), "texts": arr(STR, minItems=1)}),
    # an applied stage's arrays are parallel to `candidates`: a null logit is a token the stage
    # removed; a stage not applied has no numbers (those of the last applied stage stand)
    "stages": arr({"oneOf": [obj({"name": STAGE_NAME, "applied": {"const": True}, "kept": NAT,
                                  "logits": arr(NULL_NUM, minItems=1), "probs": arr(PROB, minItems=1)}),
                             obj({"name": STAGE_NAME, "applied": {"const": False}})]}, minItems=5, maxItems=5),
    "draw": obj({"method": {"enum": ["greedy", "sample"]}, "rank": NAT, "cdf_low": PROB,
                 "cdf_high": PROB}),
    "chosen": obj({"id": NAT, "text": STR, "prob": PROB, "logprob": NUM})},
    {"distribution": obj({"complete": BOOL, "logits": arr(NUM)}, {"ids": arr(NAT)}), "allowed_tokens": NAT})
# internals of a watched request (see kvscope/instrumentation/internals.py)
def internals_event(kind: str, fields: dict) -> dict:
    return event(f"internals.{kind}", {"request_id": STR, "step": NAT, "positions": arr(NAT), **fields})


FLOATS = arr(NUM)
NEAR = obj({"id": NAT, "text": STR, "cosine": NUM})
INTERNALS_EMBEDDINGS = internals_event("embeddings", {
    "token_ids": arr(NAT), "texts": arr(STR), "hidden_size": NAT, "rows": arr(FLOATS), "norms": FLOATS,
    "neighbours": arr(arr(NEAR)), "pca": arr(arr(NUM, minItems=2, maxItems=2))})
INTERNALS_EMBEDDINGS["properties"]["vocab"] = obj({"ids": arr(NAT), "texts": arr(STR),
                                                   "points": arr(arr(NUM, minItems=2, maxItems=2)),
                                                   "explained": FLOATS})
INTERNALS_ROPE = internals_event("rope", {"rope_theta": NUM, "head_dim": NAT, "rope_type": STR,
                                          "inv_freq": FLOATS})
INTERNALS_RESIDUAL = internals_event("residual", {
    "layers": arr(obj({"layer": NAT, "input_norm": FLOATS, "attention_norm": FLOATS,
                       "after_attention_norm": FLOATS, "mlp_norm": FLOATS, "output_norm": FLOATS})),
    "rmsnorm": obj({"position": NAT, "layer": NAT, "eps": NUM, "rms": NUM, "input": FLOATS,
                    "weight": FLOATS, "output": FLOATS})})
HISTOGRAM = obj({"edges": FLOATS, "counts": arr(arr(NAT))})
INTERNALS_MLP = internals_event("mlp", {"intermediate_size": NAT, "layers": arr(obj({
    "layer": NAT, "gate": HISTOGRAM, "activation": HISTOGRAM, "up": HISTOGRAM, "product": HISTOGRAM,
    "active_share": FLOATS, "top": arr(arr(obj({"neuron": NAT, "gate": NUM, "up": NUM, "product": NUM}))),
    "down_norm": FLOATS, "stream_norm": FLOATS}))})
INTERNALS_LENS = internals_event("logit_lens", {"layers": arr(obj({
    "layer": NAT, "top": arr(arr(obj({"id": NAT, "text": STR, "prob": PROB})))}))})

MEMORY = event("memory", {
    "device_total_bytes": NAT, "device_free_bytes": NAT, "weights_bytes": NAT,
    "kv_cache_bytes": NAT, "kv_used_bytes": NAT, "kv_used_blocks": NAT, "num_blocks": NAT,
    "block_bytes": NAT, "activations_bytes": NAT, "activations_peak_bytes": NAT,
    "process_bytes": NAT}, {"kv_cache_dtype": STR})
PROB01 = {"type": "number", "minimum": 0, "maximum": 1}
SPEC = event("spec", {
    "step": NAT, "request_id": STR, "method": {"enum": ["ngram", "draft_model"]}, "greedy": BOOL,
    "proposed": arr(NAT), "proposed_text": arr(STR), "accepted": NAT, "token_ids": arr(NAT),
    "token_text": arr(STR), "bonus": BOOL, "rejected_slots": NAT,
    "checks": arr(obj({"token_id": NAT, "p": PROB01, "q": PROB01, "u": NULL_NUM, "accepted": BOOL})),
    "running": obj({"proposed": NAT, "accepted": NAT, "acceptance_rate": PROB01, "target_passes": NAT,
                    "tokens_per_pass": NNUM})},
    {"distribution": obj({"check": NAT, "ids": arr(NAT), "text": arr(STR), "p": arr(PROB01), "q": arr(PROB01),
                          "p_rest": PROB01, "q_rest": PROB01})})

SANDBOX_SEQ = obj({"name": STR, "num_tokens": NAT, "block_table": arr(NAT), "cached_tokens": NAT})
SANDBOX = event("sandbox", {
    "op": STR, "block_size": NAT, "num_blocks": NAT, "max_model_len": NAT, "blocks": arr(BLOCK),
    "seqs": arr(SANDBOX_SEQ), "num_free": NAT, "num_cached": NAT,
    "last": {"type": ["object", "null"]},
    "fragmentation": obj({
        "paged": obj({"reserved_slots": NAT, "used_slots": NAT, "shared_slots_saved": NAT,
                      "internal_waste_slots": NAT, "waste_fraction": NNUM}),
        "contiguous": obj({"reserved_slots": NAT, "used_slots": NAT, "waste_slots": NAT,
                           "waste_fraction": NNUM})})})
VIEWERS = event("viewers", {"viewers": arr(obj({
    "client_id": STR, "role": STR, "peer": STR, "connected_s": NNUM, "families": arr(STR),
    "pending": NAT, "dropped": NAT, "active_requests": NAT}))})
CACHE_FIT = obj({"kv_cache_dtype": {"enum": KV_DTYPES}, "bytes_per_token": NAT, "bytes_per_block": NAT,
                 "num_blocks": NAT})
KV_QUANT = event("kv_quant", {
    "kv_cache_dtype": {"enum": KV_DTYPES}, "model_dtype": STR, "block_size": NAT, "budget_bytes": NAT,
    "auto": CACHE_FIT, "quantized": CACHE_FIT, "blocks_gained": NNUM, "num_prompt_tokens": NAT,
    "ref_token_ids": arr(NAT), "token_ids": arr(NAT), "greedy_agree": NAT, "greedy_total": NAT,
    "max_abs_logit_error": NNUM, "mean_abs_logit_error": NNUM, "max_kl": NNUM, "step_errors": arr(NNUM),
    "step_kl": arr(NNUM), "elapsed_s": NNUM}, {"prompt": NULL_STR})
ACK = {"type": "object", "properties": {"type": {"const": "ack"}, "ts": NNUM, "ref": REF, "cmd": STR},
       "required": ["type", "ts", "cmd"], "additionalProperties": True}
ERROR = event("error", {"code": STR, "message": STR}, {"cmd": NULL_STR, "request_id": STR})
RECORDING_HEADER = obj({"type": {"const": "recording"}, "format": {"const": "kvscope-recording"},
                        "schema_version": {"enum": READABLE_VERSIONS}, "name": STR, "created": STR,
                        "description": STR, "model": STR})

EVENTS = {
    "hello": HELLO, "session": SESSION, "engine": ENGINE_STATE, "tokens": TOKENS,
    "request.added": REQUEST_ADDED, "request.token": REQUEST_TOKEN,
    "request.finished": REQUEST_FINISHED, "request.snapshot": REQUEST_SNAPSHOT, "step": STEP,
    "kv_snapshot": KV_SNAPSHOT, "kv_delta": KV_DELTA, "attention": ATTENTION, "sampling": SAMPLING,
    "internals.embeddings": INTERNALS_EMBEDDINGS, "internals.rope": INTERNALS_ROPE,
    "internals.residual": INTERNALS_RESIDUAL, "internals.mlp": INTERNALS_MLP, "internals.logit_lens": INTERNALS_LENS,
    "memory": MEMORY, "spec": SPEC, "sandbox": SANDBOX, "kv_quant": KV_QUANT, "viewers": VIEWERS, "route": ROUTE,
    "ack": ACK,
    "error": ERROR,
}

# -- commands (client -> server) ---------------------------------------------------------
NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,32}$"}
RID = {"type": "string", "minLength": 1, "maxLength": 64}
INTS = {"oneOf": [NAT, arr(NAT, maxItems=256)]}
SAMPLING_PARAMS = obj({}, {
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_k": {"type": "integer", "minimum": -1, "maximum": 1_000_000},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**63 - 1},
    "max_tokens": {"type": "integer", "minimum": 1},
    "stop": {"oneOf": [{"type": "string", "minLength": 1, "maxLength": 64},
                       arr({"type": "string", "minLength": 1, "maxLength": 64}, maxItems=4)]},
    "stop_token_ids": arr(NAT, maxItems=16),
    "ignore_eos": BOOL,
    "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 20},
})
WATCH = obj({}, {"layers": arr(NAT, maxItems=256), "heads": arr(NAT, maxItems=256), "sampling": BOOL,
                 "internals": BOOL})
INTERVAL = {"type": "number", "minimum": 0, "maximum": 10}   # seconds between steps (pacing.MAX_INTERVAL_S)
MESSAGE = obj({"role": {"enum": ["system", "user", "assistant"]}, "content": {"type": "string"}})
# vLLM's per-request `cache_salt`: only requests with equal salts share prefix-cache blocks
CACHE_SALT = {"type": "string", "minLength": 1, "maxLength": 256}
# vLLM's StructuredOutputsParams: exactly one of json, regex, choice, grammar, json_object
STRUCTURED_OUTPUTS = obj({}, {
    "json": {"type": ["object", "string"]}, "regex": {"type": "string", "minLength": 1, "maxLength": 1024},
    "choice": arr({"type": "string", "minLength": 1, "maxLength": 256}, minItems=1, maxItems=64),
    "grammar": {"type": "string", "minLength": 1, "maxLength": 8192}, "json_object": BOOL,
    "disable_any_whitespace": BOOL})


def command(name: str, required: dict | None = None, optional: dict | None = None) -> dict:
    return obj({"type": {"const": name}, **(required or {})}, {"ref": REF, **(optional or {})})


COMMANDS = {
    "subscribe": command("subscribe", {"families": arr({"enum": SUBSCRIBABLE}, maxItems=16)},
                         {"filters": FILTER}),
    "unsubscribe": command("unsubscribe", {"families": arr({"enum": SUBSCRIBABLE}, maxItems=16)}),
    "tokenize": command("tokenize", {"text": STR}, {"chat": BOOL}),
    "submit": command("submit", {}, {
        "prompt": {"type": "string", "minLength": 1},
        "messages": arr(MESSAGE, minItems=1, maxItems=64),
        "prompt_token_ids": arr(NAT, minItems=1),
        "params": SAMPLING_PARAMS, "watch": WATCH, "hold": BOOL, "pace_s": INTERVAL,
        "prefill_chunk_tokens": {"type": "integer", "minimum": 1, "maximum": 8192},
        "cache_salt": CACHE_SALT, "structured_outputs": STRUCTURED_OUTPUTS}),
    "cancel": command("cancel", {"request_id": RID}),
    "route_policy": command("route_policy", {"policy": {"enum": ["round_robin", "least_loaded", "prefix"]}}),
    "watch": command("watch", {"request_id": RID}, {"layers": arr(NAT, maxItems=256),
                                                    "heads": arr(NAT, maxItems=256), "sampling": BOOL}),
    "unwatch": command("unwatch", {"request_id": RID}),
    "hold": command("hold", {"request_id": RID}),
    "next": command("next", {"request_id": RID}),
    "release": command("release", {"request_id": RID}),
    "pace": command("pace", {"interval_s": INTERVAL}, {"request_id": RID, "request_ids": arr(RID, minItems=1, maxItems=16)}),
    "sweep": command("sweep", {"levels": arr({"type": "integer", "minimum": 1, "maximum": 256}, minItems=1, maxItems=10),
                               "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1024}}),
    "slow_motion": command("slow_motion", {"interval_s": INTERVAL}),
    "kv_quant": command("kv_quant", {"kv_cache_dtype": {"enum": [d for d in KV_DTYPES if d != "auto"]}}, {
        "prompt": {"type": "string", "minLength": 1}, "prompt_token_ids": arr(NAT, minItems=1),
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 32}}),
    "sandbox": command("sandbox", {"op": {"enum": ["allocate", "append", "fork", "free", "reset", "state"]}}, {
        "seq": NAME, "new_seq": NAME, "prefix_of": NAME,
        "tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "prefix_tokens": {"type": "integer", "minimum": 0, "maximum": 1024},
        "num_blocks": {"type": "integer", "minimum": 1, "maximum": 256},
        "block_size": {"type": "integer", "minimum": 1, "maximum": 64},
        "max_model_len": {"type": "integer", "minimum": 1, "maximum": 65536}}),
    "snapshot": command("snapshot", {}, {"families": arr({"enum": SUBSCRIBABLE}, maxItems=16)}),
    "auth": command("auth", {"token": {"type": "string", "maxLength": 256}}),
    "ping": command("ping"),
    "pause": command("pause"),
    "resume": command("resume"),
    "step": command("step"),
    "reset": command("reset"),
    "set_knobs": command("set_knobs", {}, {
        "max_num_batched_tokens": {"type": "integer", "minimum": 1, "maximum": 8192},
        "max_num_seqs": {"type": "integer", "minimum": 1, "maximum": 256},
        "prefill_chunk_size": {"type": ["integer", "null"], "minimum": 1, "maximum": 8192},
        "enable_chunked_prefill": BOOL}),
    "inject": command("inject", {"n": {"type": "integer", "minimum": 1, "maximum": 64}}, {
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1024},
        "prompt_tokens": {"type": "integer", "minimum": 1, "maximum": 1024}}),
    "record_start": command("record_start", {}, {"name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}}),
    "record_stop": command("record_stop"),
    "viewers": command("viewers"),
    "replay": command("replay", {"action": {"enum": ["play", "pause", "step"]}},
                      {"speed": {"type": "number", "exclusiveMinimum": 0, "maximum": 100}}),
}
INSTRUCTOR_COMMANDS = {"pause", "resume", "step", "reset", "set_knobs", "inject", "record_start",
                       "record_stop", "viewers", "slow_motion", "route_policy"}


def event_schema_key(event: dict) -> str:
    """Which schema an event follows (kv has two shapes)."""
    kind = event.get("type")
    if kind == "kv":
        return "kv_delta" if event.get("kind") == "delta" else "kv_snapshot"
    return kind


def full_schema() -> dict:
    """One document: `$defs` holds every event and command; the root accepts any event."""
    defs = {f"event.{k}": v for k, v in EVENTS.items()}
    defs.update({f"command.{k}": v for k, v in COMMANDS.items()})
    defs["recording_header"] = RECORDING_HEADER
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kvscope.dev/events.schema.json",
        "title": f"kvscope events and commands, schema version {SCHEMA_VERSION}",
        "schema_version": SCHEMA_VERSION,
        "$defs": defs,
        "oneOf": [{"$ref": f"#/$defs/event.{k}"} for k in EVENTS],
    }


if __name__ == "__main__":
    print(json.dumps(full_schema(), indent=1, sort_keys=True))
