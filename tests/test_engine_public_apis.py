"""The engine is read next to the chapters: it uses PyTorch's public interface only. No
private modules, no loading torch's own libraries by hand, no process-wide allocator
tuning, no rebinding of torch's attributes (monkeypatching)."""
from __future__ import annotations

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
