"""Exported pages run from file:// too: an import map of data: URLs (each module of frontend/js as
`kvscope/<path>`), and each recording a data: URL in `window.kvscopeRecordings[<name>]`."""
from __future__ import annotations

import base64
import json
import posixpath
import re
from pathlib import Path

PREFIX = "kvscope/"
# `from './x.js'`, `import './x.js'`, `import('./x.js')` and `import(`./widgets/${tag}.js`)`.
STATIC_SPECIFIER = re.compile(r"""(\bfrom\s*|\bimport\s*\(?\s*)(['"])(\.{1,2}/[^'"]+)\2""")
TEMPLATE_SPECIFIER = re.compile(r"(\bimport\s*\(\s*)`(\.{1,2}/[^`]*)`")


def rewrite_specifiers(source: str, path: str) -> str:
    """Relative specifiers in the module at `path` (relative to frontend/) → module names."""
    folder = posixpath.dirname(path)

    def resolve(specifier: str) -> str:
        return PREFIX + posixpath.normpath(posixpath.join(folder, specifier))

    source = STATIC_SPECIFIER.sub(lambda m: f"{m.group(1)}{m.group(2)}{resolve(m.group(3))}{m.group(2)}", source)
    return TEMPLATE_SPECIFIER.sub(lambda m: f"{m.group(1)}`{resolve(m.group(2))}`", source)


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def import_map(frontend: Path) -> dict:
    imports = {}
    for file in sorted((frontend / "js").rglob("*.js")):
        path = file.relative_to(frontend).as_posix()
        source = rewrite_specifiers(file.read_text(encoding="utf-8"), path)
        imports[PREFIX + path] = data_url("text/javascript", source.encode("utf-8"))
    return {"imports": imports}


def import_map_script(frontend: Path) -> str:
    """A classic script that puts the import map in the page before any module loads."""
    payload = json.dumps(import_map(frontend), separators=(",", ":"))
    return ("// Written by `kvscope export-site`: every module of frontend/js as a data: URL, so\n"
            "// the exported pages also run when opened as files. See server/pages/static_modules.py.\n"
            "(() => {\n  const map = document.createElement('script');\n  map.type = 'importmap';\n"
            f"  map.textContent = {json.dumps(payload)};\n  document.currentScript.after(map);\n}})();\n")


def recording_script(recording: Path) -> str:
    """A classic script giving the replay client this recording without fetching a file."""
    url = data_url("application/jsonl", recording.read_bytes())
    return ("// Written by `kvscope export-site`: the recording as a data: URL (see static_modules.py).\n"
            f"(window.kvscopeRecordings ||= {{}})[{json.dumps(recording.stem)}] = {json.dumps(url)};\n")
