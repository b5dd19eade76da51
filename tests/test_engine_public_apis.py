"""The engine is read next to the chapters: it uses PyTorch's public interface only. No
private modules, no loading torch's own libraries by hand, no process-wide allocator
tuning, no rebinding of torch's attributes (monkeypatching). And its modules import one
another without circles, so a reader can take them in order."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import kvscope

ROOT = Path(kvscope.__file__).parent
FOLDERS = ("engine", "layers", "models")
FORBIDDEN = {
    "torch._inductor": r"torch\._inductor",
    "torch._dynamo": r"torch\._dynamo",
    "torch._C": r"torch\._C\b",
    "ctypes.CDLL of a torch library": r"CDLL\([^)]*torch",
    "mallopt": r"\bmallopt\b",
    "an assignment to a torch attribute": r"^\s*torch(\.\w+)+\s*=[^=]",
    "setattr on torch": r"setattr\(\s*torch\b",
    "eval of generated code": r"(?<![.\w])eval\(",
}


def engine_sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_the_engine_uses_public_apis_only():
    found = []
    for path in engine_sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}")
    assert not found, "private or process-wide interfaces in the engine:\n" + "\n".join(found)


def test_the_check_sees_what_it_forbids(tmp_path):
    """The patterns catch the spellings they are for (so the test above can fail)."""
    samples = ["from torch._inductor.compile_fx import compile_fx", "torch._dynamo.mark_dynamic(x, 0)",
               "torch._C._set_grad_enabled(False)", "lib = ctypes.CDLL(os.path.join(torch_dir, 'libtorch_cpu.so'))",
               "libc.mallopt(-3, 1 << 30)", "    torch.nn.functional.linear = fast_linear",
               "setattr(torch.nn.functional, 'linear', f)", "fn = eval(source)"]
    for sample in samples:
        assert any(re.search(p, sample) for p in FORBIDDEN.values()), sample
    assert not any(re.search(p, "if torch.compiler.is_compiling() == False:") for p in FORBIDDEN.values())


def core_imports(path: Path) -> set[str]:
    """The kvscope engine, layers and models modules `path` imports, at any depth in the
    file, except under `if TYPE_CHECKING:` (annotations only, never run)."""
    found = set()

    def visit(node):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvscope"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)   # from kvscope.layers import kernels
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def import_graph() -> dict[str, list[str]]:
    """Core module (engine/..., layers/..., models/...) -> the core modules it imports."""
    modules = {"/".join(p.relative_to(ROOT).with_suffix("").parts): p
               for p in engine_sources() if p.name != "__init__.py"}
    dotted = {"kvscope." + m.replace("/", "."): m for m in modules}
    return {m: sorted(dotted[d] for d in core_imports(p) if d in dotted) for m, p in modules.items()}


def test_the_core_has_no_import_circles():
    graph = import_graph()
    assert graph["engine/model_runner"], "the import graph should see the runner's imports"
    done, path = set(), []

    def walk(m):
        if m in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for dep in graph[m]:
            walk(dep)
        path.pop()
        done.add(m)

    for m in graph:
        walk(m)


def test_docs_engine_md_names_every_core_file_and_its_import_floor():
    """docs/engine.md's reading order names each core file, and its floors table (each file
    imports only from floors below) is the import graph's."""
    graph = import_graph()
    floors: dict[str, int] = {}

    def floor(m):
        if m not in floors:
            floors[m] = 1 + max((floor(d) for d in graph[m]), default=-1)
        return floors[m]

    text = (ROOT.parents[1] / "docs" / "engine.md").read_text()
    documented = {}
    for number, files in re.findall(r"^\| (\d+) \| ((?:`[\w/]+\.py`(?:, )?)+) \|$", text, re.M):
        for name in re.findall(r"`([\w/]+)\.py`", files):
            documented[name] = int(number)
    assert documented == {m: floor(m) for m in graph}
    missing = [m for m in graph if f"`{m}.py`" not in text.split("## Reading order")[1].split("floor |")[0]]
    assert not missing, f"not in the reading order: {missing}"
