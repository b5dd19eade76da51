"""`kvscope export-site DIR`: the whole book as files, linked relatively, with every module
reachable through the import map and every recording as a script, so the folder works
from any static host and from file:// (the browser side is tests/e2e/test_export_site.py)."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

pytest.importorskip("jinja2")

from kvscope.cli import main  # noqa: E402
from kvscope.server.pages import Site, frontend_dir  # noqa: E402
from kvscope.server.pages.static_modules import import_map, rewrite_specifiers  # noqa: E402

LINK = re.compile(r'(?:href|src)="([^"]+)"')
# a citation: a link the reader follows to a source, never something the page loads
CITATION = re.compile(r'<a [^>]*href="(https://[^"]+)"')


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    assert main(["export-site", str(out)]) == 0
    return out


def pages(site: Path) -> list[Path]:
    return sorted(site.rglob("index.html"))


def test_every_page_is_written(site):
    chapters = Site().chapter_list()
    assert len(chapters) == 21
    written = {p.parent.relative_to(site).as_posix() for p in pages(site)}
    assert written == {".", "glossary"} | {f"chapters/{c.slug}" for c in chapters}


def test_links_are_relative_and_resolve_to_files(site):
    for page in pages(site):
        html = page.read_text(encoding="utf-8")
        citations = set(CITATION.findall(html))
        for target in LINK.findall(html):
            if target.startswith(("#", "data:")) or target in citations:
                continue
            assert not target.startswith(("/", "http:", "https:")), (page, target)
            path = unquote(target.split("#")[0])
            assert (page.parent / path).resolve().is_file(), (page, target)


def test_pages_load_modules_only_through_the_import_map(site):
    for page in pages(site):
        html = page.read_text(encoding="utf-8")
        assert 'rel="modulepreload"' not in html and '<script type="module" src=' not in html
        assert "js/importmap.js" in html and "import 'kvscope/js/page.js';" in html
        assert 'data-live="off"' in html


def test_import_map_holds_every_module_with_resolvable_imports():
    imports = import_map(frontend_dir())["imports"]
    modules = {p.relative_to(frontend_dir()).as_posix() for p in (frontend_dir() / "js").rglob("*.js")}
    assert set(imports) == {f"kvscope/{m}" for m in modules}
    for name, url in imports.items():
        source = base64.b64decode(url.split(",", 1)[1]).decode("utf-8")
        assert not re.search(r"""(from|import)\s*\(?\s*['"`]\.{1,2}/""", source), name
        for specifier in re.findall(r"""(?:from|import)\s*\(?\s*['"](kvscope/[^'"]+)['"]""", source):
            assert specifier in imports, (name, specifier)
    page = base64.b64decode(imports["kvscope/js/page.js"].split(",", 1)[1]).decode("utf-8")
    assert "import(`kvscope/js/widgets/${tag}.js`)" in page


def test_specifier_rewriting():
    source = "import { a } from './lib/a.js';\nimport '../b.js';\nexport { c } from \"./c.js\";\nimport(`./w/${t}.js`);\nconst s = 'from ./x.js';"
    assert rewrite_specifiers(source, "js/widgets/x.js") == (
        "import { a } from 'kvscope/js/widgets/lib/a.js';\nimport 'kvscope/js/b.js';\n"
        "export { c } from \"kvscope/js/widgets/c.js\";\nimport(`kvscope/js/widgets/w/${t}.js`);\nconst s = 'from ./x.js';")


def test_recordings_are_scripts_with_the_same_events(site):
    recordings = sorted((frontend_dir() / "recordings").glob("*.jsonl"))
    assert recordings
    for recording in recordings:
        script = (site / "static" / "recordings" / f"{recording.stem}.js").read_text(encoding="utf-8")
        registered = re.search(r"kvscopeRecordings \|\|= \{\}\)\[(\".*?\")\] = (\".*\");", script)
        assert json.loads(registered.group(1)) == recording.stem
        url = json.loads(registered.group(2))
        assert base64.b64decode(url.split(",", 1)[1]) == recording.read_bytes()
    chapter = (site / "chapters" / "15-paged-attention" / "index.html").read_text(encoding="utf-8")
    name = re.search(r'data-recording="([^"]+)"', chapter).group(1)
    assert f'<script src="../../static/recordings/{name}.js"></script>' in chapter


def test_glossary_definitions_are_hidden_without_styles(site):
    html = (site / "chapters" / "12-the-kv-cache" / "index.html").read_text(encoding="utf-8")
    tips = re.findall(r'<span class="kv-term__tip"[^>]*>', html)
    assert tips and all(" hidden" in tip for tip in tips)
