"""The attached server's FastAPI app: the same WebSocket, replay socket, static front end
and chapter pages as `kvscope serve`, without kvscope's engine routes (/api/generate and
/v1 belong to the vLLM server itself)."""
from __future__ import annotations

from fastapi import FastAPI

from kvscope.server.app import mount_site, service_app
from kvscope.server.attach.service import AttachService


def create_attach_app(service: AttachService) -> FastAPI:
    app = service_app(service, "kvscope (attached to vLLM)", docs_url=None)

    @app.get("/healthz")
    async def healthz():
        s = service.server
        return {"status": "ok" if service.connected else "disconnected", "attached": s.url,
                "vllm_version": s.version, "model": s.model, "viewers": len(service.hub.viewers),
                "kv_events": service.kv_events_note(), **service.figures}

    mount_site(app, service)
    return app
