"""Rendering of the explainer's pages (chapters, home, glossary) from `content/`.

Light on purpose: only jinja2, markdown-it-py, python-frontmatter and pyyaml; no engine
or web-framework imports, so it is cheap to import and easy to test."""
from kvscope.server.pages.content import (PARTS, Chapter, ContentError, Glossary, Term, content_dir,
                                              frontend_dir, load_chapters, load_glossary)
from kvscope.server.pages.markdown import RenderError, make_markdown, render_markdown
from kvscope.server.pages.site import Site, export_static_site

__all__ = ["PARTS", "Chapter", "ContentError", "Glossary", "RenderError", "Site", "Term", "content_dir",
           "export_static_site", "frontend_dir", "load_chapters", "load_glossary", "make_markdown",
           "render_markdown"]
