"""The site rendered with Jinja2, cached until content changes; links are relative when exported."""
from __future__ import annotations

import shutil
import threading
from itertools import groupby
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, pass_context, select_autoescape
from markupsafe import Markup

from kvscope.server.pages.content import (PARTS, Chapter, content_dir, frontend_dir, load_chapters,
                                       load_glossary, signature)
from kvscope.server.pages.markdown import make_markdown, render_markdown
from kvscope.server.pages.static_modules import import_map_script, recording_script

STATIC_PREFIX = "/static/"


@pass_context
def _static(context, path: str) -> str:
    return context.get("root", "/") + STATIC_PREFIX.lstrip("/") + path.lstrip("/")


@pass_context
def _link(context, url: str) -> str:
    """A page's URL ("/", "/glossary", "/chapters/<slug>") as this page should write it."""
    root = context.get("root", "/")
    if root == "/":
        return url
    target = url.strip("/")
    return root + (target + "/" if target else "") + "index.html"


def page_root(url: str) -> str:
    """From the exported file of page `url` back to the site's top folder."""
    depth = len([part for part in url.strip("/").split("/") if part])
    return "../" * depth or "./"


class Site:
    def __init__(self, content: Path | None = None, frontend: Path | None = None, recordings: Path | None = None,
                 static_export: bool = False):
        self.content = Path(content) if content else content_dir()
        self.frontend = Path(frontend) if frontend else frontend_dir()
        self.recordings = Path(recordings) if recordings else self.frontend / "recordings"
        self.templates = Environment(
            loader=FileSystemLoader(str(self.frontend / "templates")),
            autoescape=select_autoescape(["html"], default_for_string=True, default=True),
            trim_blocks=True, lstrip_blocks=True)
        self.templates.globals.update(static=_static, link=_link)
        self.static_export = static_export
        self._lock = threading.Lock()
        self._signature: tuple | None = None
        self._pages: dict[str, str] = {}
        self.markdown = make_markdown()

    def _fresh(self) -> None:
        """The content read again, and the cached pages dropped, when a file changed."""
        current = signature(self.content) + signature(self.frontend / "templates")
        if current != self._signature:
            self.glossary = load_glossary(self.content)
            self.chapters = load_chapters(self.content)
            self._by_slug = {c.slug: c for c in self.chapters}
            self._pages = {}
            self._signature = current

    def _cached(self, key: str, build) -> str:
        with self._lock:
            self._fresh()
            page = self._pages.get(key)
            if page is None:
                page = self._pages[key] = build()
            return page

    def chapter_list(self) -> list[Chapter]:
        with self._lock:
            self._fresh()
            return list(self.chapters)

    def find_chapter(self, slug: str) -> Chapter | None:
        """By full slug, or by number alone ("12" or "12-anything")."""
        with self._lock:
            self._fresh()
            if slug in self._by_slug:
                return self._by_slug[slug]
            head = slug.split("-", 1)[0]
            if head.isdigit():
                return next((c for c in self.chapters if c.number == int(head)), None)
            return None

    def recording_for(self, chapter: Chapter | None) -> str:
        """A page's recording: the chapter's own (front matter or slug), else `default`, else the first, else ""."""
        names = sorted(p.stem for p in self.recordings.glob("*.jsonl"))   # none when the folder is missing
        wanted = []
        if chapter is not None:
            if chapter.meta.get("recording"):
                wanted.append(str(chapter.meta["recording"]))
            wanted += [chapter.slug, chapter.slug.split("-", 1)[1]]
        wanted.append("default")
        return next((name for name in wanted if name in names), names[0] if names else "")

    def _render(self, template: str, url: str = "/", **context) -> str:
        context.setdefault("recording", self.recording_for(context.get("chapter")))
        context["static_export"] = self.static_export
        context["root"] = page_root(url) if self.static_export else "/"
        return self.templates.get_template(template).render(parts=PARTS, **context)

    def home(self) -> str:
        def build():
            parts = [(key, label, [c for c in self.chapters if c.part == key]) for key, (label, _) in PARTS.items()]
            return self._render("home.html", page="home", toc=parts)
        return self._cached("/", build)

    def chapter(self, chapter: Chapter) -> str:
        def build():
            rendered = render_markdown(self.markdown, chapter.body, self.glossary, chapter.path.name)
            i = self.chapters.index(chapter)
            previous = self.chapters[i - 1] if i > 0 else None
            following = self.chapters[i + 1] if i + 1 < len(self.chapters) else None
            return self._render("chapter.html", url=chapter.url, page="chapter", chapter=chapter, body=Markup(rendered.html),
                                part_label=PARTS[chapter.part][0], previous=previous, next=following,
                                widgets=rendered.widgets, headings=rendered.headings)
        return self._cached(f"/chapters/{chapter.slug}", build)

    def glossary_page(self) -> str:
        def build():
            terms = sorted(self.glossary.terms, key=lambda t: t.term.lower())
            by_number = {c.number: c for c in self.chapters}
            groups = [(letter, list(items)) for letter, items in groupby(terms, key=lambda t: t.term[0].upper())]
            return self._render("glossary.html", url="/glossary", page="glossary", groups=groups, chapters=by_number)
        return self._cached("/glossary", build)

    def not_found(self, path: str) -> str:
        return self._render("not_found.html", page="not-found", path=path, chapters=self.chapter_list())

    def render_all(self) -> dict[str, str]:
        """Every page by its URL path; raises on the first content error."""
        pages = {"/": self.home(), "/glossary": self.glossary_page()}
        for chapter in self.chapter_list():
            pages[chapter.url] = self.chapter(chapter)
        return pages


def export_static_site(out: Path, site: Site | None = None) -> Path:
    """The whole book as plain files that replay recordings with no backend, from any host or file://."""
    source = site or Site()
    site = Site(source.content, source.frontend, source.recordings, static_export=True)
    out = Path(out)
    for url, html in site.render_all().items():
        target = out / url.strip("/") / "index.html" if url != "/" else out / "index.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(html, encoding="utf-8")
    static = out / "static"
    shutil.copytree(site.frontend, static, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("templates", "__pycache__", "recordings"))
    (static / "js" / "importmap.js").write_text(import_map_script(site.frontend), encoding="utf-8")
    if site.recordings.is_dir():
        shutil.copytree(site.recordings, static / "recordings", dirs_exist_ok=True)
        for recording in site.recordings.glob("*.jsonl"):
            (static / "recordings" / f"{recording.stem}.js").write_text(recording_script(recording), encoding="utf-8")
    return out
