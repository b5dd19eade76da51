"""A learner's prompt sent to vLLM, told back as our `request.*` events, timed at the client side."""
from __future__ import annotations

import asyncio
import time

from kvscope.server.errors import CommandError

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}


async def run_request(service, target, rid: str, ids: list[int], params, source: str, label, extra: dict) -> None:
    """Stream one completion to `target`; every outcome, a dead server's too, ends in one request.finished."""
    clock, pool, replica, p = service.clock, target.mirror, target.replica, params
    service.publish([{"type": "request.added", "ts": clock(), "request_id": rid, "source": source,
                      "owner": label.owner, "prompt": label.prompt[:300] if label.prompt is not None else None,
                      "prompt_token_ids": list(ids), "num_prompt_tokens": len(ids),
                      "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                                 "seed": p.seed, "max_tokens": p.max_tokens, "stop": list(p.stop),
                                 "stop_token_ids": list(p.stop_token_ids), "ignore_eos": p.ignore_eos,
                                 "logprobs": None},
                      "watched": False, "held": False}], target)
    if pool is not None:
        pool.track(rid, ids)
    service.in_flight[target.index] = service.in_flight.get(target.index, 0) + 1
    rank = {"X-data-parallel-rank": str(target.rank)} if replica.server.data_parallel_size > 1 else {}
    start, last, index = time.perf_counter(), None, 0
    text, itl, ttft, reason, error, cached = [], [], None, "abort", None, None
    try:
        async for chunk in replica.client.stream(ids, {**service.completion_params(p), **extra}, rid, rank):
            for choice in chunk.get("choices") or []:
                new = list(choice.get("token_ids") or [])
                now = time.perf_counter()
                events = []
                for k, token in enumerate(new):
                    piece = choice.get("text", "") if k == len(new) - 1 else ""
                    events.append({"type": "request.token", "ts": clock(), "request_id": rid, "index": index,
                                   "token_id": token, "text": piece, "step": pool.step if pool is not None else 0})
                    index += 1
                if new:
                    if ttft is None:
                        ttft = now - start
                    elif last is not None:
                        itl.append(round(now - last, 6))
                    last = now
                text.append(choice.get("text", ""))
                if pool is not None and new:
                    pool.extend(rid, new)
                service.publish(events, target)
                if choice.get("finish_reason"):
                    reason = FINISH_REASONS.get(choice["finish_reason"], "stop")
            usage = chunk.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    except asyncio.CancelledError:
        reason = "abort"
    except CommandError as exc:
        reason, error = "error", exc.message
    except Exception as exc:   # the server went away mid-stream
        reason, error = "error", f"the vLLM server at {replica.server.url} stopped answering: {type(exc).__name__}"
    finally:
        service.in_flight[target.index] -= 1
        hits = pool.hit(rid, cached) if pool is not None else 0
        if pool is not None:
            pool.finish(rid)
        num_cached = cached if cached is not None else hits * service.block_size
        service.publish([{"type": "request.finished", "ts": clock(), "request_id": rid, "reason": reason,
                          "error": error, "text": "".join(text), "num_prompt_tokens": len(ids),
                          "num_output_tokens": index, "num_cached_tokens": num_cached, "num_preemptions": 0,
                          "ttft_s": None if ttft is None else round(ttft, 6),
                          "e2e_s": round(time.perf_counter() - start, 6), "itl_s": itl,
                          **({"pool": target.index} if len(service.pools) > 1 else {})}], target)
