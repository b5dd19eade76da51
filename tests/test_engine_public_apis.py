"""The engine is read next to the chapters: it uses PyTorch's public interface only. No
private modules, no loading torch's own libraries by hand, no process-wide allocator
tuning, no rebinding of torch's attributes (monkeypatching). And docs/engine.md gives its
modules' import floors, so a reader can take them in order."""
from __future__ import annotations

import re
from pathlib import Path

import kvscope
from test_import_graph import import_graph as package_graph

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


def import_graph() -> dict[str, list[str]]:
    """Core module (engine/..., layers/..., models/...) -> the core modules it imports, from
    the package's graph (scripts/import_graph.py; tests/test_import_graph.py checks that no
    module anywhere in kvscope closes a circle)."""
    graph = package_graph.import_graph()
    core = {m for m in graph if m.count(".") == 2 and m.split(".")[1] in ("engine", "layers", "models")}

    def name(m):
        return m.removeprefix("kvscope.").replace(".", "/")
    return {name(m): sorted(name(d) for d in graph[m] if d in core) for m in core}


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
