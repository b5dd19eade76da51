"""The attached server's FastAPI app: the same WebSocket, replay socket, static front end
and chapter pages as `kvscope serve`, without kvscope's engine routes (/api/generate and
/v1 belong to the vLLM server itself)."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, WebSocket
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from kvscope.server.app import frontend_dir, mount_pages, recording_folders
from kvscope.server.attach.service import AttachService
from kvscope.server.redact import hide_tokens_in_server_logs
from kvscope.server.replay_ws import serve_replay
from kvscope.server.security import SecurityMiddleware, origin_allowed
from kvscope.server.ws import serve_websocket


def create_attach_app(service: AttachService) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(title="kvscope (attached to vLLM)", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(SecurityMiddleware, bind_host=service.config.host, extra_hosts=service.config.extra_hosts)
    hide_tokens_in_server_logs()
    app.state.service = service

    @app.get("/healthz")
    async def healthz():
        s = service.server
        return {"status": "ok" if service.connected else "disconnected", "attached": s.url,
                "vllm_version": s.version, "model": s.model, "viewers": len(service.hub.viewers),
                "kv_events": service.kv_events_note(), **service.figures}

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.websocket("/ws")
    async def ws(websocket: WebSocket):
        await serve_websocket(websocket, service)

    @app.websocket("/ws/replay/{name}")
    async def replay(websocket: WebSocket, name: str):
        if not origin_allowed(websocket.headers.get("origin"), websocket.headers.get("host"),
                              service.config.extra_origins):
            await websocket.close(code=1008, reason="origin not allowed")
            return
        await serve_replay(websocket, recording_folders(service), name, service.config.limits.max_frame_bytes)

    front = frontend_dir(service.config.frontend_dir)
    if front is not None:
        app.mount("/static", StaticFiles(directory=front), name="static")
    mount_pages(app)
    if front is not None and not any(getattr(r, "path", None) == "/console" for r in app.routes):
        @app.get("/console", include_in_schema=False)
        async def console():
            return FileResponse(front / "console.html")
    return app
