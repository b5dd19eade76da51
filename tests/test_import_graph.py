"""The package's import graph (scripts/import_graph.py, read from the source): no circles
anywhere in kvscope, lazy imports included, and the server's folders stacked so each one
imports only from those below it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
import_graph = importlib.util.module_from_spec(spec)
sys.modules["import_graph"] = import_graph
spec.loader.exec_module(import_graph)

# bottom to top; each may import from itself and the ones before it. "base" is the loose
# modules at server/'s top (config, errors, security, ...); the app is shared by both
# servers, our engine's and the attached one (attach/), and main starts either.
SERVER_STACK = ["base", "classroom", "service", "api", "pages", "app", "attach", "main"]


def server_folder(module: str) -> str | None:
    if not module.startswith("kvscope.server."):
        return None
    name = module.split(".")[2]
    return name if name in SERVER_STACK else "base"


def test_no_import_circles_in_the_package():
    assert import_graph.circles(import_graph.import_graph()) == []


def test_the_script_finds_a_lazy_circle_and_leaves_out_type_checking_imports(tmp_path):
    pkg = tmp_path / "kvscope"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from kvscope.b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from kvscope import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvscope.a import x\n")
    (pkg / "d.py").write_text("import kvscope.b\n")
    graph = import_graph.import_graph(pkg)
    assert import_graph.circles(graph) == [["kvscope.a", "kvscope.b"]]
    assert graph["kvscope.c"] == set()
    assert import_graph.import_graph(pkg, annotations=True)["kvscope.c"] == {"kvscope.a"}
    floors = import_graph.floors(graph)
    assert (floors["kvscope.a"], floors["kvscope.b"], floors["kvscope.c"], floors["kvscope.d"]) == (0, 0, 0, 1)


def test_each_server_folder_imports_only_from_those_below_it():
    graph = import_graph.import_graph()
    upward = []
    for module, targets in graph.items():
        here = server_folder(module)
        if here is None:
            continue
        for target in targets:
            there = server_folder(target)
            if there is not None and SERVER_STACK.index(there) > SERVER_STACK.index(here):
                upward.append(f"{module} -> {target}")
    assert upward == []
