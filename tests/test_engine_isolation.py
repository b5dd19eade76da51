"""The engine and the benchmarks import no web stack: GPU machines used for benchmarks may
not have FastAPI or uvicorn installed."""
from __future__ import annotations

import subprocess
import sys

WEB = ("fastapi", "uvicorn", "starlette", "jinja2", "markdown_it", "websockets")


def test_engine_and_bench_import_without_the_web_stack():
    code = ("import sys, kvscope.engine, kvscope.bench.commands, kvscope.llm, kvscope.instrumentation; "
            "from kvscope.cli import build_parser; build_parser(); "   # the CLI as `kvscope bench` builds it
            f"print([m for m in {WEB!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
