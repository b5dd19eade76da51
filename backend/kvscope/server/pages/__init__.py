"""The explainer's pages from `content/`, with no engine or FastAPI (only routes.py needs it)."""
from kvscope.server.pages.content import (PARTS, Chapter, ContentError, Glossary, Term, content_dir,
                                       frontend_dir, load_chapters, load_glossary)
from kvscope.server.pages.markdown import RenderError, make_markdown, render_markdown
from kvscope.server.pages.site import Site, export_static_site

__all__ = ["PARTS", "Chapter", "ContentError", "Glossary", "RenderError", "Site", "Term", "content_dir",
           "export_static_site", "frontend_dir", "load_chapters", "load_glossary", "make_markdown",
           "render_markdown"]
