"""The attached server's FastAPI app: the same WebSocket, replay socket, static front end
and chapter pages as `kvscope serve`, without kvscope's engine routes (/api/generate and
/v1 belong to the vLLM server itself)."""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import Response

from kvscope.server.app import mount_site
from kvscope.server.attach.service import AttachService
from kvscope.server.redact import hide_tokens_in_server_logs
from kvscope.server.security import SecurityMiddleware


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

    mount_site(app, service)
    return app
