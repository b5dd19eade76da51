"""The reader test of issue 35: which of kvscope's files and functions one CPU decode step
calls, from `LLMEngine.step` down to the attention kernel (instrumentation left out).
Counts every Python call while one decode step of the embedded model runs.

    python scripts/reader_path.py            # eager decode (enforce_eager, no CPU compile)
    python scripts/reader_path.py --compiled # the compiled decode step"""
from __future__ import annotations

import argparse
import os
import sys

from kvscope import LLM, SamplingParams


def calls_of_one_decode_step(compiled: bool) -> list[tuple[str, str]]:
    llm = LLM(cpu_compile=compiled)
    engine = llm.engine
    engine.add_request("Once upon a time there was", SamplingParams(max_tokens=8), request_id="reader")
    engine.step()                      # the prefill; the next step decodes
    seen: list[tuple[str, str]] = []

    def profile(frame, event, _arg):
        path = frame.f_code.co_filename
        if event == "call" and f"{os.sep}kvscope{os.sep}" in path and "instrumentation" not in path:
            seen.append((path.split(f"{os.sep}kvscope{os.sep}", 1)[1], frame.f_code.co_name))
    sys.setprofile(profile)
    try:
        engine.step()
    finally:
        sys.setprofile(None)
        llm.close()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiled", action="store_true")
    calls = calls_of_one_decode_step(parser.parse_args().compiled)
    named = sorted({c for c in calls if not c[1].startswith("<")})   # comprehensions are not functions to read
    files = sorted({f for f, _ in named})
    print(f"{len(files)} files, {len(named)} functions")
    for f in files:
        print(f"  {f}: {', '.join(n for ff, n in named if ff == f)}")


if __name__ == "__main__":
    main()
