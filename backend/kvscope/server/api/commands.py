"""What each WebSocket command does: a handler replies through the hub or raises CommandError."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from kvscope.instrumentation.observer import RequestLabel
from kvscope.instrumentation.schema import SUBSCRIBABLE
from kvscope.instrumentation.watch import WatchSpec
from kvscope.sampling_params import StructuredOutputsParams
from kvscope.server.classroom.policy import is_token, one_prompt_form
from kvscope.server.classroom.sandbox import Sandbox
from kvscope.server.service.engine_service import EngineService
from kvscope.server.classroom.sweeps import Sweep, sweep_requests
from kvscope.server.api.validation import message_ref, sampling_params
from kvscope.server.errors import CommandError
from kvscope.server.classroom.viewer import Filter, Viewer


@dataclass
class Session:
    service: EngineService
    viewer: Viewer

    @property
    def hub(self):
        return self.service.hub

    def reply(self, msg: dict, event: dict) -> None:
        if "ref" in msg:
            event["ref"] = message_ref(msg)
        self.hub.send(self.viewer, event)

    def ack(self, msg: dict, announce: str | None = None, **fields) -> None:
        """The reply to `msg`; an instructor's control also `announce`s the engine's new state to every page."""
        self.reply(msg, {"type": "ack", "ts": self.service.clock(), "cmd": msg["type"], **fields})
        if announce is not None:
            self.hub.broadcast(self.service.engine_state(announce))

    def session_event(self) -> dict:
        v = self.viewer
        return {"type": "session", "ts": self.service.clock(), "client_id": v.id, "role": v.role,
                "subscriptions": {f: flt.as_dict() for f, flt in v.families.items()},
                "limits": {**asdict(self.service.config.limits), "max_learner_requests": self.service.learner_share,
                           "max_sweep_in_flight": self.service.sweep_cap}}

    def own(self, rid: str) -> None:
        """Learners may only steer their own requests."""
        if rid not in self.viewer.active and not self.viewer.is_instructor:
            if rid in self.hub.requests:
                raise CommandError("forbidden", f"request {rid!r} is not yours")
            raise CommandError("unknown_request", f"no request {rid!r} is in flight")


async def subscribe(s: Session, msg: dict) -> None:
    families = list(dict.fromkeys(msg["families"]))
    s.viewer.subscribe(families, Filter.parse(msg.get("filters")))
    s.ack(msg, families=sorted(s.viewer.families))
    for event in s.hub.snapshots(families):
        s.hub.send(s.viewer, dict(event))


async def unsubscribe(s: Session, msg: dict) -> None:
    s.viewer.unsubscribe(msg["families"])
    s.ack(msg, families=sorted(s.viewer.families))


async def snapshot(s: Session, msg: dict) -> None:
    families = msg.get("families") or list(s.viewer.families) or SUBSCRIBABLE
    for event in s.hub.snapshots(families):
        s.reply(msg, dict(event))


async def tokenize(s: Session, msg: dict) -> None:
    s.service.policy.check_prompt_text(msg["text"], s.viewer.is_instructor, "text")
    s.reply(msg, await s.service.off_loop(s.service.tokenize, msg["text"], msg.get("chat", False)))


def watch_spec(s: Session, raw: dict, num_prompt_tokens: int) -> WatchSpec:
    """A watch's output grows with the prompt's square and costs everyone engine time."""
    limits = s.service.config.limits
    if not s.viewer.is_instructor and num_prompt_tokens > limits.max_watched_prompt_tokens:
        raise CommandError("invalid_field", f"watch: the prompt has {num_prompt_tokens} tokens; learners may watch "
                                            f"prompts of at most {limits.max_watched_prompt_tokens} "
                                            f"(kvscope serve --max-watched-prompt-tokens)")
    mine = sum(1 for rid in s.viewer.active if s.hub.watches.spec(rid, s.viewer.id) is not None)
    if not s.viewer.is_instructor and mine >= limits.max_watches:
        raise CommandError("too_many_requests", f"you watch {mine} requests already; the limit is {limits.max_watches}")
    facts = s.service.instr.facts
    layers, heads = raw.get("layers"), raw.get("heads")
    for name, values, n in (("layers", layers, facts.num_layers), ("heads", heads, facts.num_heads)):
        bad = [x for x in values or [] if x >= n]
        if bad:
            raise CommandError("invalid_field", f"watch.{name}: {bad[0]} is out of range; the model has {n}")
    cells = len(layers or range(facts.num_layers)) * len(heads or range(facts.num_heads))
    if cells > limits.max_watched_layers_x_heads and not s.viewer.is_instructor:
        raise CommandError("invalid_field", f"watch: {cells} layer×head maps asked for; "
                                            f"the limit is {limits.max_watched_layers_x_heads}")
    if len(s.service.instr.watches) >= s.service.config.max_watched_requests:
        raise CommandError("too_many_requests",
                           f"{s.service.config.max_watched_requests} requests are watched already; unwatch one first")
    return WatchSpec(None if layers is None else frozenset(layers), None if heads is None else frozenset(heads),
                     raw.get("sampling", True), raw.get("internals", False))


def check_submit_allowance(s: Session, in_flight: int = 1) -> None:
    """May this learner add `in_flight` requests (a sweep counts once, kv_quant 0)? Costs one submit."""
    if s.viewer.is_instructor:
        return
    limits = s.service.config.limits
    own = s.service.own_requests(s.viewer)
    if own + min(in_flight, 1) > limits.max_active_requests:
        raise CommandError("too_many_requests",
                           f"you have {own} requests in flight (a sweep counts as one); "
                           f"the limit is {limits.max_active_requests} (kvscope serve --learner-max-active-requests)")
    share = s.service.learner_share
    if s.service.learner_requests() + in_flight > share:
        raise CommandError("too_many_requests", f"learners together have {share} requests in flight, their share of "
                                                f"the engine (kvscope serve --max-learner-requests); try again soon")
    if not s.viewer.submits.take():
        raise CommandError("rate_limited", f"learners may submit {limits.submits_per_minute:g} prompts a minute "
                                           f"(kvscope serve --learner-submits-per-minute); "
                                           f"try again in {max(1, math.ceil(s.viewer.submits.retry_after()))} s")


async def submit(s: Session, msg: dict) -> None:
    one_prompt_form(msg)
    service, viewer = s.service, s.viewer
    ids, text = await service.checked_prompt(msg, viewer.is_instructor)
    cap = None if viewer.is_instructor else service.config.limits.max_tokens
    params = sampling_params(msg.get("params"), cap)
    spec = watch_spec(s, msg["watch"], len(ids)) if "watch" in msg else None
    chunk = msg.get("prefill_chunk_tokens")
    if chunk is not None and not service.engine.config.enable_chunked_prefill:
        raise CommandError("invalid_field", "prefill_chunk_tokens: this engine runs with chunked prefill off "
                                            "(kvscope serve --no-enable-chunked-prefill), so prompts are never cut")
    if "structured_outputs" in msg:   # compiled now: a bad schema is an invalid_field reply, never a failed step
        try:
            constraint = StructuredOutputsParams(**msg["structured_outputs"])
            await service.compile_grammar(constraint)
        except ValueError as exc:
            raise CommandError("invalid_field", f"structured_outputs: {exc}") from None
        params = replace(params, structured_outputs=constraint)
    check_submit_allowance(s)   # last: a refused message costs no submit allowance
    rid = service.new_request_id()
    label = RequestLabel(owner=viewer.id, prompt=text, held=msg.get("hold", False), watched=spec is not None)
    done = await service.submit(rid, ids, params, "ws", label, (viewer.id, spec) if spec else None,
                                msg.get("pace_s", 0.0), chunk, msg.get("cache_salt"))
    if done.error:
        raise CommandError("engine", done.error, request_id=rid)
    s.ack(msg, request_id=rid, num_prompt_tokens=done.num_prompt_tokens)


async def route_policy(s: Session, msg: dict) -> None:
    raise CommandError("attach", "a router picks among several servers: start kvscope with "
                                 "`kvscope serve --attach URL URL ...` to route prompts between vLLM replicas")


async def cancel(s: Session, msg: dict) -> None:
    s.own(msg["request_id"])
    if not await s.service.cancel(msg["request_id"]):
        raise CommandError("unknown_request", f"no request {msg['request_id']!r} is in flight")
    s.ack(msg, request_id=msg["request_id"])


async def watch(s: Session, msg: dict) -> None:
    rid = msg["request_id"]
    s.own(rid)   # learners watch only their own requests
    prompt_tokens = s.hub.requests.get(rid, {}).get("num_prompt_tokens", 0)
    await s.service.watch(rid, s.viewer.id, watch_spec(s, msg, prompt_tokens))
    s.ack(msg, request_id=rid)


async def unwatch(s: Session, msg: dict) -> None:
    rid = msg["request_id"]
    await s.service.unwatch(rid, s.viewer.id)
    s.ack(msg, request_id=rid)


def steer(operation: str):
    """The handler of `hold`, `next` or `release`: the service's `operation` on the viewer's own request."""
    async def handler(s: Session, msg: dict) -> None:
        rid = msg["request_id"]
        s.own(rid)
        await getattr(s.service, operation)(rid)
        s.ack(msg, request_id=rid)
    return handler


async def pace(s: Session, msg: dict) -> None:
    """One request (`request_id`) or several at once (`request_ids`: they start together)."""
    if ("request_id" in msg) == ("request_ids" in msg):
        raise CommandError("invalid_field", "give exactly one of request_id or request_ids")
    rids = list(dict.fromkeys(msg["request_ids"])) if "request_ids" in msg else [msg["request_id"]]
    for rid in rids:
        s.own(rid)
    await s.service.pace(rids, msg["interval_s"])
    ids = {"request_ids": rids} if "request_ids" in msg else {"request_id": rids[0]}
    s.ack(msg, **ids, interval_s=msg["interval_s"])


async def sweep(s: Session, msg: dict) -> None:
    """Throughput against latency at rising levels: a learner's is one submit, its top level reserved, one at a time."""
    levels, max_tokens = msg["levels"], msg["max_tokens"]
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise CommandError("invalid_field", f"levels: {levels} must rise")
    service, viewer = s.service, s.viewer
    if viewer.id in service.sweeps:
        raise CommandError("too_many_requests", "your sweep is still running; wait for its last level")
    if not viewer.is_instructor:
        limits = service.config.limits
        if levels[-1] > service.sweep_cap:
            raise CommandError("too_many_requests", f"levels: a learner's sweep may keep at most {service.sweep_cap} "
                                                    f"requests in flight (kvscope serve --learner-max-sweep-in-flight, "
                                                    f"within --max-learner-requests); {levels[-1]} asked for")
        if max_tokens > limits.max_tokens:
            raise CommandError("invalid_field", f"max_tokens: {max_tokens} is over the limit of {limits.max_tokens} "
                                                f"(kvscope serve --learner-max-tokens)")
        if any(not service.hub.viewers[o].is_instructor for o in service.sweeps if o in service.hub.viewers):
            raise CommandError("too_many_requests", "another learner's sweep is running (one at a time, or each "
                                                    "would measure the other's load); try again in a few seconds")
    check_submit_allowance(s, levels[-1])
    job = Sweep(owner=viewer.id, top=levels[-1])
    service.sweeps[viewer.id] = job
    service.spawn(service.sweep(job, levels, max_tokens))
    s.ack(msg, levels=levels, requests=[sweep_requests(n) for n in levels], max_tokens=max_tokens)


# a learner's kv_quant: the prompt is decoded twice between two engine steps, so keep it short
MAX_KV_QUANT_PROMPT_TOKENS = 128
DEFAULT_KV_QUANT_TOKENS = 16


async def kv_quant(s: Session, msg: dict) -> None:
    """What an 8-bit KV cache buys (blocks) and costs (logit error) for one prompt, the pool untouched."""
    if ("prompt" in msg) == ("prompt_token_ids" in msg):
        raise CommandError("invalid_field", "give exactly one of prompt or prompt_token_ids")
    service = s.service
    ids, text = await service.checked_prompt(msg, s.viewer.is_instructor)
    max_tokens = msg.get("max_tokens", DEFAULT_KV_QUANT_TOKENS)
    limit = service.engine.max_model_len - max_tokens
    if not s.viewer.is_instructor:
        limit = min(limit, MAX_KV_QUANT_PROMPT_TOKENS)
    if len(ids) > limit:
        raise CommandError("prompt_too_long",
                           f"kv_quant: the prompt has {len(ids)} tokens; it may have at most {limit}")
    check_submit_allowance(s, 0)   # last: a refused message costs no submit allowance
    result = await service.measure_kv_cache_dtype(ids, msg["kv_cache_dtype"], max_tokens)
    s.reply(msg, {"type": "kv_quant", "ts": service.clock(), "prompt": text, **result})


async def sandbox(s: Session, msg: dict) -> None:
    box = s.viewer.sandbox = s.viewer.sandbox or Sandbox()   # made on first use
    try:
        box.apply(msg)
    except (AssertionError, RuntimeError, ValueError) as exc:
        raise CommandError("sandbox", str(exc)) from None
    s.reply(msg, {**box.state(), "ts": s.service.clock(), "op": msg["op"]})


async def auth(s: Session, msg: dict) -> None:
    if not is_token(msg["token"], s.service.config):
        raise CommandError("forbidden", "wrong instructor token")
    s.viewer.role = "instructor"
    s.ack(msg, role="instructor")
    s.hub.send(s.viewer, s.session_event())


async def ping(s: Session, msg: dict) -> None:
    s.ack(msg)


async def replay_control(s: Session, msg: dict) -> None:
    raise CommandError("replay", "replay commands work on a replay socket, /ws/replay/<name>")


async def pause(s: Session, msg: dict) -> None:
    s.service.aengine.pause()
    s.ack(msg, announce="pause")


async def resume(s: Session, msg: dict) -> None:
    s.service.aengine.resume()
    s.ack(msg, announce="resume")


async def step(s: Session, msg: dict) -> None:
    s.ack(msg, announce="step", step=await s.service.aengine.step_now())


async def reset(s: Session, msg: dict) -> None:
    s.ack(msg, announce="reset", aborted=await s.service.aengine.reset())


async def slow_motion(s: Session, msg: dict) -> None:
    s.ack(msg, announce="slow_motion", interval_s=await s.service.slow_motion(msg["interval_s"]))


async def set_knobs(s: Session, msg: dict) -> None:
    knobs = {k: v for k, v in msg.items() if k not in ("type", "ref")}
    s.ack(msg, announce="knobs", knobs=await s.service.set_knobs(knobs))


async def inject(s: Session, msg: dict) -> None:
    rids = await s.service.inject(msg["n"], msg.get("max_tokens", 32), msg.get("prompt_tokens"))
    s.ack(msg, announce="inject", request_ids=rids)


async def record_start(s: Session, msg: dict) -> None:
    service = s.service
    if service.hub.recorder is not None:
        raise CommandError("invalid_field", f"already recording {service.hub.recorder.name!r}; stop it first")
    name = msg.get("name") or f"session-{int(service.started_at + service.clock())}"
    path = service.config.recordings_dir / f"{name}.jsonl"
    service.hub.start_recording(path, name, service.model_name, service.recording_preamble())
    s.ack(msg, announce="recording", name=name, path=str(path))


async def record_stop(s: Session, msg: dict) -> None:
    rec = s.service.hub.stop_recording()
    if rec is None:
        raise CommandError("invalid_field", "not recording")
    s.ack(msg, announce="recording", name=rec.name, path=str(rec.path), events=rec.events)


async def viewers(s: Session, msg: dict) -> None:
    s.reply(msg, {"type": "viewers", "ts": s.service.clock(),
                  "viewers": [v.summary() for v in s.hub.viewers.values()]})


HANDLERS = {
    "subscribe": subscribe, "unsubscribe": unsubscribe, "snapshot": snapshot, "tokenize": tokenize,
    "submit": submit, "cancel": cancel, "route_policy": route_policy, "watch": watch, "unwatch": unwatch, "hold": steer("hold"),
    "next": steer("next_token"), "release": steer("release"), "pace": pace, "sweep": sweep,
    "slow_motion": slow_motion, "sandbox": sandbox, "auth": auth, "ping": ping, "kv_quant": kv_quant,
    "pause": pause, "resume": resume, "step": step, "reset": reset, "set_knobs": set_knobs,
    "inject": inject, "record_start": record_start, "record_stop": record_stop, "viewers": viewers,
    "replay": replay_control,
}
