"""The FastAPI app both servers run: WebSocket, REST, OpenAI routes, static front end and chapter pages."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, WebSocket
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from kvscope.server.api.openai_api import OpenAIError, openai_router
from kvscope.server.api.replay_ws import serve_replay
from kvscope.server.redact import hide_tokens_in_server_logs
from kvscope.server.api.rest import error_response, rest_router
from kvscope.server.errors import CommandError
from kvscope.server.security import SecurityMiddleware, origin_allowed
from kvscope.server.api.ws import serve_websocket
from kvscope.server.pages.content import frontend_dir
from kvscope.server.pages.routes import mount_pages

WS_MAX_FRAME = 1 << 20   # larger frames are closed by the protocol; up to this, refused with an error
# Longer than clients' pool expiry (httpx: 5 s), so the client closes an idle keep-alive
# connection first: with equal timeouts a request sent as the server closes it is lost
# before the engine sees it.
KEEP_ALIVE_S = 75


def create_app(service, title: str = "kvscope", engine_routes: bool = True) -> FastAPI:
    """The app both servers run, our engine or an attached vLLM behind it (attached: no /api or /v1 of ours)."""
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(title=title, lifespan=lifespan, docs_url="/api/docs" if engine_routes else None, redoc_url=None)
    app.add_middleware(SecurityMiddleware, bind_host=service.config.host, extra_hosts=service.config.extra_hosts)
    hide_tokens_in_server_logs()
    app.state.service = service
    if engine_routes:
        app.include_router(rest_router(service))
        app.include_router(openai_router(service))
        app.add_exception_handler(CommandError, error_response)
        app.add_exception_handler(OpenAIError, lambda _request, exc: exc.response())
    front = frontend_dir(service.config.frontend_dir)

    @app.get("/healthz")
    async def healthz():
        return service.health()

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
        await serve_replay(websocket, [service.config.recordings_dir, front / "recordings"], name,
                           service.config.limits.max_frame_bytes)

    if front.is_dir():
        app.mount("/static", StaticFiles(directory=front), name="static")

        @app.get("/console", include_in_schema=False)
        async def console():
            return FileResponse(front / "console.html")
    mount_pages(app)
    return app


def run(app: FastAPI, config, log_level: str) -> None:
    import uvicorn
    uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                                  ws_max_size=WS_MAX_FRAME, ws_per_message_deflate=False,
                                  ws_ping_interval=20, ws_ping_timeout=20, timeout_keep_alive=KEEP_ALIVE_S)).run()

