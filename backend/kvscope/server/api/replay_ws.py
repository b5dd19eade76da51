"""`/ws/replay/<name>`: a recording played through the live protocol, steered by `replay` commands."""
from __future__ import annotations

import asyncio
import math
import re
import time
from pathlib import Path

from starlette.websockets import WebSocket, WebSocketDisconnect

from kvscope.instrumentation.recording import Replayer, read_recording
from kvscope.server.classroom.hub import dumps
from kvscope.server.api.validation import error_event, incoming_frames, message_ref, parse_frame, validate_command
from kvscope.server.errors import CommandError

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def find_recording(folders: list[Path], name: str) -> Path | None:
    paths = [folder / f"{name}.jsonl" for folder in folders] if NAME.match(name) else []
    return next((path for path in paths if path.is_file()), None)


def speed_from_query(raw: str | None) -> float | None:
    """?speed=: a finite number, kept within 0.01..100; None when it is not a number."""
    try:
        speed = float(raw or 1)
    except ValueError:
        return None
    return max(0.01, min(speed, 100.0)) if math.isfinite(speed) else None


async def serve_replay(ws: WebSocket, folders: list[Path], name: str, max_frame_bytes: int) -> None:
    await ws.accept()
    speed = speed_from_query(ws.query_params.get("speed"))
    path = find_recording(folders, name)
    try:
        if speed is None:
            raise CommandError("invalid_field", "speed must be a number (0.01 to 100)")
        if path is None:
            raise CommandError("replay", f"no recording named {name!r}")
        try:
            _, events = read_recording(path)
        except ValueError as exc:
            raise CommandError("replay", str(exc)) from None
    except CommandError as exc:
        await ws.send_text(dumps(error_event(exc.code, exc.message)))
        await ws.close(code=1008 if speed is None else 1000)
        return
    player = Replayer(events, speed=speed)
    if ws.query_params.get("paused"):
        player.pause()
    wake = asyncio.Event()
    reader = asyncio.create_task(read_controls(ws, player, wake, max_frame_bytes))
    try:
        while not reader.done():
            for event in player.due(time.monotonic()):
                await ws.send_text(dumps({**event, "replay": True} if event.get("type") == "session" else event))
            wait = player.wait_time()
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), timeout=wait if wait is not None else 3600)
            except asyncio.TimeoutError:
                pass
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        reader.cancel()


async def read_controls(ws: WebSocket, player: Replayer, wake: asyncio.Event, max_frame_bytes: int) -> None:
    try:
        async for data in incoming_frames(ws):
            msg: dict = {}
            try:
                msg = parse_frame(data, max_frame_bytes)
                if validate_command(msg) != "replay":
                    raise CommandError("replay", "this socket plays a recording; only replay commands work here")
                now = time.monotonic()
                if "speed" in msg:
                    player.set_speed(msg["speed"], now)
                if msg["action"] == "play":
                    player.play(now)
                else:
                    player.pause()
                for event in player.step() if msg["action"] == "step" else ():
                    await ws.send_text(dumps(event))
                await ws.send_text(dumps({"type": "ack", "ts": 0.0, "ref": message_ref(msg), "cmd": "replay",
                                          "position": player.position, "total": len(player.events)}))
            except CommandError as exc:
                await ws.send_text(dumps(error_event(exc.code, exc.message, msg)))
            wake.set()
    finally:
        wake.set()   # the player loop notices the viewer left
