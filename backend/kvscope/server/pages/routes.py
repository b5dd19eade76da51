"""The pages on the FastAPI app (pages/' one FastAPI file); /chapters/12 redirects to the full slug."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse

from kvscope.server.pages import Site

HTML_HEADERS = {"Cache-Control": "no-cache"}


def mount_pages(app: FastAPI, site: Site | None = None) -> Site:
    site = site or Site()
    app.state.pages = site

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def home() -> HTMLResponse:
        return HTMLResponse(site.home(), headers=HTML_HEADERS)

    @app.get("/glossary", response_class=HTMLResponse, include_in_schema=False)
    def glossary() -> HTMLResponse:
        return HTMLResponse(site.glossary_page(), headers=HTML_HEADERS)

    @app.get("/chapters/{slug}", response_class=HTMLResponse, include_in_schema=False)
    def chapter(slug: str):
        found = site.find_chapter(slug)
        if found is None:
            return HTMLResponse(site.not_found(f"/chapters/{slug}"), status_code=404, headers=HTML_HEADERS)
        if found.slug != slug:
            return RedirectResponse(found.url, status_code=307)
        return HTMLResponse(site.chapter(found), headers=HTML_HEADERS)

    @app.get("/chapters", include_in_schema=False)
    @app.get("/chapters/", include_in_schema=False)
    def chapters_index() -> RedirectResponse:
        return RedirectResponse("/", status_code=307)

    return site
