"""Build the C source that ships with kvscope (layers/cpu_paged_attention.c) into a shared
library with this machine's compiler, and load it with ctypes.

The library is built once per machine and source: it is cached under
$XDG_CACHE_HOME/kvscope/native (default ~/.cache), named by a hash of the source, the flags
and the CPU, so later starts load it at once, with no compiler needed. Flag sets are tried
from the fastest down (-march=native, OpenMP, glibc's vectorised exp), so a compiler or
libc without one of them still gets a working build. A source missing from the install is
an error, never a silent fallback: the wheel ships it (pyproject's package-data)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAG_SETS = (
    ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-lmvec", "-lm"),
    ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-lm"),
    ("-O3", "-march=native", "-lm"),
    ("-O3", "-lm"),
)


class NativeBuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "kvscope" / "native"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def load(source: Path) -> ctypes.CDLL:
    """The library built from `source`: the cached build if there is one, else a fresh one."""
    if not source.is_file():
        raise NativeBuildError(f"{source} is missing: this kvscope install is incomplete (reinstall it)")
    targets = [(flags, cache_dir() / f"{source.stem}-{_key(source, flags)}.so") for flags in FLAG_SETS]
    errors = []
    for flags, target in targets:
        if target.exists():
            try:
                return ctypes.CDLL(str(target))
            except OSError as exc:
                errors.append(f"{' '.join(flags)}: {exc}")
    cc = compiler()
    if cc is None:
        raise NativeBuildError("no C compiler found (set CC, or install gcc or clang)")
    for flags, target in targets:
        error = _compile(cc, source, flags, target)
        if error is None:
            try:
                return ctypes.CDLL(str(target))
            except OSError as exc:   # e.g. built against a vector maths library this libc lacks
                target.unlink(missing_ok=True)
                error = f"{' '.join(flags)}: {exc}"
        errors.append(error)
    raise NativeBuildError(f"could not build {source.name} with {cc}: {errors[-1]}")


def _key(source: Path, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256(source.read_bytes())
    h.update(" ".join((*flags, platform.machine(), _cpu_flags())).encode())
    return h.hexdigest()[:16]


def _cpu_flags() -> str:
    """-march=native builds for this CPU: a cache shared with another CPU must not match."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compile(cc: str, source: Path, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile into a temporary file, then rename: processes building at once never load a
    half-written library. Returns the compiler's complaint, or None."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    except OSError as exc:   # e.g. a read-only home: set XDG_CACHE_HOME
        return f"cannot write {target.parent}: {exc}"
    os.close(fd)
    compiler_flags = [f for f in flags if not f.startswith("-l")]
    libraries = [f for f in flags if f.startswith("-l")]
    cmd = [cc, *compiler_flags, "-fPIC", "-shared", str(source), "-o", tmp, *libraries]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        os.unlink(tmp)
        return f"{' '.join(flags)}: {exc}"
    if done.returncode != 0:
        os.unlink(tmp)
        return f"{' '.join(flags)}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    os.replace(tmp, target)
    return None
