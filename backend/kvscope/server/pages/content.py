"""The chapters and the glossary read from `content/` as plain dataclasses (docs/authoring.md)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import frontmatter
import yaml

PARTS = {
    "foundations": ("Foundations", range(1, 11)),
    "serving": ("How serving works", range(11, 15)),
    "internals": ("Engine internals", range(15, 19)),
    "scaling": ("Scaling out", range(19, 22)),
}
CHAPTER_FILE = re.compile(r"^(\d{2})-([a-z0-9-]+)\.md$")
CHECKOUT = Path(__file__).resolve().parents[4]   # backend/kvscope/server/pages/ -> the repository


class ContentError(ValueError):
    """A chapter or glossary file breaks the authoring contract."""


@dataclass(frozen=True)
class Term:
    term: str
    short: str
    chapter: int | None
    aliases: tuple[str, ...] = ()

    @property
    def anchor(self) -> str:
        return "term-" + re.sub(r"[^a-z0-9]+", "-", self.term.lower()).strip("-")


@dataclass
class Glossary:
    terms: list[Term]
    _index: dict[str, Term] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        for term in self.terms:
            for name in (term.term, *term.aliases):
                key = normalise(name)
                other = self._index.get(key)
                if other is not None and other is not term:
                    raise ContentError(f"glossary: {name!r} names both {other.term!r} and {term.term!r}")
                self._index[key] = term

    def lookup(self, name: str) -> Term | None:
        """Case-insensitive lookup of a term or one of its aliases."""
        return self._index.get(normalise(name))


@dataclass(frozen=True)
class Chapter:
    number: int
    slug: str            # "12-the-kv-cache"
    title: str
    summary: str
    part: str
    body: str            # Markdown, front matter removed
    path: Path
    meta: dict

    @property
    def url(self) -> str:
        return f"/chapters/{self.slug}"


def normalise(name: str) -> str:
    """Lookup key: case, repeated spaces and typographic apostrophes do not matter."""
    return re.sub(r"\s+", " ", name.replace("’", "'")).strip().lower()


def content_dir() -> Path:
    """KVSCOPE_CONTENT_DIR, or the repository's content/."""
    return Path(os.environ.get("KVSCOPE_CONTENT_DIR") or CHECKOUT / "content")


def frontend_dir(configured: Path | None = None) -> Path:
    """KVSCOPE_FRONTEND_DIR, the server's --frontend-dir, or the repository's frontend/."""
    return Path(os.environ.get("KVSCOPE_FRONTEND_DIR") or configured or CHECKOUT / "frontend")


def load_glossary(directory: Path) -> Glossary:
    terms: list[Term] = []
    for path in sorted((directory / "glossary").glob("*.yaml")):
        entries = yaml.safe_load(path.read_text(encoding="utf-8")) or []
        if not isinstance(entries, list):
            raise ContentError(f"{path.name}: expected a list of terms")
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or not entry.get("term") or not entry.get("short"):
                raise ContentError(f"{path.name}: entry {i + 1} needs `term` and `short`")
            aliases = entry.get("aliases") or []
            if isinstance(aliases, str):
                aliases = [aliases]
            chapter = entry.get("chapter")
            terms.append(Term(term=str(entry["term"]), short=str(entry["short"]).strip(),
                              chapter=int(chapter) if chapter is not None else None,
                              aliases=tuple(str(a) for a in aliases)))
    return Glossary(terms)


def load_chapters(directory: Path) -> list[Chapter]:
    chapters: list[Chapter] = []
    for path in sorted(directory.glob("*.md")):
        match = CHAPTER_FILE.match(path.name)
        if not match:
            continue
        post = frontmatter.loads(path.read_text(encoding="utf-8"))
        number = int(match.group(1))
        for key in ("title", "summary", "part"):
            if not post.metadata.get(key):
                raise ContentError(f"{path.name}: front matter needs `{key}`")
        part = str(post.metadata["part"])
        if part not in PARTS:
            raise ContentError(f"{path.name}: unknown part {part!r} (one of {', '.join(PARTS)})")
        if number not in PARTS[part][1]:
            raise ContentError(f"{path.name}: chapter {number} does not belong to part {part!r}")
        chapters.append(Chapter(number=number, slug=path.stem, title=str(post.metadata["title"]),
                                summary=str(post.metadata["summary"]), part=part, body=post.content,
                                path=path, meta=dict(post.metadata)))
    numbers = [c.number for c in chapters]
    if len(set(numbers)) != len(numbers):
        raise ContentError("two chapter files share a number")
    return chapters


def signature(directory: Path) -> tuple:
    """Changes whenever a content file changes; rendered pages are cached against it."""
    stats = [(p.name, p.stat()) for sub in (directory, directory / "glossary") for p in sub.glob("*") if p.is_file()]
    return tuple(sorted((name, stat.st_mtime_ns, stat.st_size) for name, stat in stats))
