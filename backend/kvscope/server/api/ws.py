"""`/ws`: one WebSocket per page, a reader and a pump, so a page that stops reading blocks only its pump."""
from __future__ import annotations

import asyncio
import itertools
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from kvscope.instrumentation.schema import INSTRUCTOR_COMMANDS, SUBSCRIBABLE
from kvscope.server.api.commands import HANDLERS, Session
from kvscope.server.classroom.policy import is_token, learner_id
from kvscope.server.security import origin_allowed
from kvscope.server.service.engine_service import EngineService
from kvscope.server.api.validation import error_event, incoming_frames, parse_frame, validate_command
from kvscope.server.errors import CommandError
from kvscope.server.classroom.viewer import Filter, Viewer

log = logging.getLogger("kvscope.server")
_viewer_ids = itertools.count(1)


async def serve_websocket(ws: WebSocket, service: EngineService) -> None:
    await ws.accept()
    if not origin_allowed(ws.headers.get("origin"), ws.headers.get("host"), service.config.extra_origins):
        await ws.close(code=1008, reason=f"origin not allowed: {ws.headers.get('origin')}"[:120])
        return
    peer = f"{ws.client.host}:{ws.client.port}" if ws.client else "?"
    role = "instructor" if is_token(ws.query_params.get("token"), service.config) else "learner"
    viewer = Viewer(f"c{next(_viewer_ids)}", peer, service.config, role)
    viewer.submits = service.policy.learner_submits(learner_id(ws.query_params.get("learner")))
    session = Session(service, viewer)
    hub = service.hub
    hub.add(viewer)
    families = [f for f in ws.query_params.get("subscribe", "").split(",") if f in SUBSCRIBABLE]
    viewer.subscribe(families, Filter())
    greeting = [{**service.hello, "ts": service.clock()}, session.session_event(), service.engine_state("connect")]
    for event in greeting + hub.snapshots(families):
        hub.send(viewer, dict(event))
    pump = asyncio.create_task(pump_frames(ws, viewer, service))
    viewer.on_overflow = lambda: asyncio.get_running_loop().create_task(evict(ws, pump))
    try:
        async for data in incoming_frames(ws):
            await handle(session, data)
    finally:
        pump.cancel()
        hub.remove(viewer)
        await service.drop_viewer(viewer.id, list(viewer.active))


async def handle(session: Session, data: str | bytes) -> None:
    viewer, limits = session.viewer, session.service.config.limits
    msg: dict = {}
    try:
        if not viewer.is_instructor and not viewer.messages.take():   # every frame counts, parsed or not
            raise CommandError("rate_limited", f"at most {limits.messages_per_second:g} messages a second; "
                                               f"this one was not processed")
        msg = parse_frame(data, limits.max_frame_bytes)
        kind = validate_command(msg)
        if kind in INSTRUCTOR_COMMANDS and not viewer.is_instructor:
            raise CommandError("forbidden", f"{kind!r} is an instructor command: connect with the instructor "
                                            f"token (?token=… or an auth message)")
        # an attached server (serve --attach) refuses the commands that need kvscope's engine
        await getattr(session.service, "handlers", HANDLERS)[kind](session, msg)
    except CommandError as exc:
        session.hub.send(viewer, error_event(exc.code, exc.message, msg, exc.request_id))
    except Exception as exc:   # a bug must not cost the viewer its connection
        log.exception("command failed: %r", str(msg.get("type"))[:40])
        failed = f"the server failed on this message: {type(exc).__name__}"
        session.hub.send(viewer, error_event("internal", failed, msg))


CLOSE_TIMEOUT_S = 5.0


async def evict(ws: WebSocket, pump: asyncio.Task) -> None:
    """Close a page too far behind (1013); one that does not even read the close frame is cut."""
    pump.cancel()
    try:
        await asyncio.wait_for(ws.close(code=1013, reason="too far behind: it did not read its events"),
                               CLOSE_TIMEOUT_S)
    except (asyncio.TimeoutError, RuntimeError, ConnectionError, WebSocketDisconnect):
        pass
    transport = ws.scope.get("kvscope.transport")
    if transport is not None and not transport.is_closing():
        transport.abort()


async def pump_frames(ws: WebSocket, viewer: Viewer, service: EngineService) -> None:
    """Write queued frames; display-only ones at most one per min_frame_interval."""
    interval = service.config.min_frame_interval
    try:
        while True:
            await viewer.wake.wait()
            viewer.wake.clear()
            if viewer.overflowed:
                return   # evict() closes it
            frame, essential = viewer.take_frame(service.hub.snapshot_texts)
            if frame is None:
                continue
            if ws.application_state != WebSocketState.CONNECTED:
                return
            if isinstance(frame, bytes):   # a watched request's arrays: a step's frames go back to back
                await ws.send_bytes(frame)
                continue
            await ws.send_text(frame)
            if not essential:
                await asyncio.sleep(interval)
    except (WebSocketDisconnect, RuntimeError, ConnectionError):
        return
