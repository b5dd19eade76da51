"""The import graph of the kvscope package, read from the source (nothing is imported).

Every `import` and `from ... import` counts, also those inside functions: a lazy import
that closes a circle still ties two modules together for a reader. Imports under
`if TYPE_CHECKING:` never run and only name types for annotations: they are left out
unless --annotations is given. Importing a submodule does not count as importing its
parent package (Python runs the parent's __init__, but it does not make the parent a
dependency a reader must follow).

Prints each module's floor (0: imports nothing of kvscope; otherwise one above the highest
floor it imports, the modules of a circle sharing one floor) and every circle; exits 1 if
there is a circle.

    python3 scripts/import_graph.py            # floors by folder, then circles
    python3 scripts/import_graph.py --modules  # every module with its floor and imports
    python3 scripts/import_graph.py --annotations  # TYPE_CHECKING imports counted too
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = "kvscope"
ROOT = Path(__file__).resolve().parents[1] / "backend" / PACKAGE


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py under the package."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module `name` names, or the nearest package above it (for `from pkg.mod import obj`)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _annotation_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return ids


def imports_of(module: str, path: Path, modules: dict[str, Path], annotations: bool = False) -> set[str]:
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skip = set() if annotations else _annotation_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the module's own package upwards
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` names a submodule when one exists, else an attribute of pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = _resolve(name, modules)
                if target is not None and target != module:
                    found.add(target)
    return found


def import_graph(root: Path = ROOT, annotations: bool = False) -> dict[str, set[str]]:
    modules = module_files(root)
    return {m: imports_of(m, p, modules, annotations) for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def floors(graph: dict[str, set[str]]) -> dict[str, int]:
    """0 for a module importing nothing of the package, else 1 + the highest floor below it;
    the modules of one circle share a floor (so this is defined even with circles)."""
    group = {m: m for m in graph}
    for component in circles(graph):
        for m in component:
            group[m] = component[0]
    floor: dict[str, int] = {}

    def of(m: str, seen: frozenset = frozenset()) -> int:
        g = group[m]
        if g in floor:
            return floor[g]
        members = [x for x in graph if group[x] == g]
        below = {group[t] for x in members for t in graph[x]} - {g}
        floor[g] = 1 + max((of(t, seen | {g}) for t in below), default=-1)
        return floor[g]

    return {m: of(m) for m in graph}


def folder(module: str, graph: dict[str, set[str]]) -> str:
    """The package a module lives in (a package's __init__ belongs to itself)."""
    is_package = any(other.startswith(module + ".") for other in graph)
    return module if is_package else module.rpartition(".")[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", action="store_true", help="list every module with its floor and imports")
    ap.add_argument("--annotations", action="store_true", help="count imports under `if TYPE_CHECKING:` too")
    opts = ap.parse_args()
    graph = import_graph(annotations=opts.annotations)
    floor = floors(graph)
    if opts.modules:
        for m in sorted(graph, key=lambda m: (floor[m], m)):
            inside = ", ".join(sorted(graph[m])) or "-"
            print(f"{floor[m]:>2}  {m}  <-  {inside}")
    else:
        by_folder: dict[str, list[str]] = defaultdict(list)
        for m in graph:
            by_folder[folder(m, graph)].append(m)
        print(f"{len(graph)} modules, {sum(len(v) for v in graph.values())} imports, highest floor "
              f"{max(floor.values())}")
        for name in sorted(by_folder):
            ms = sorted(by_folder[name], key=lambda m: (floor[m], m))
            print(f"{name}:  " + "  ".join(f"{m.rpartition('.')[2] if m != name else '__init__'}:{floor[m]}"
                                           for m in ms))
    found = circles(graph)
    for component in found:
        print("circle: " + " <-> ".join(component))
    print(f"{len(found)} circle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
