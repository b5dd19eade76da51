"""The CPU engine keeps freed activations in the heap (engine/host_memory.py)."""
from __future__ import annotations

import ctypes.util

import pytest

from kvscope.engine import host_memory


def test_thresholds_are_set_once_per_process_on_glibc():
    if not ctypes.util.find_library("c"):
        pytest.skip("no C library to ask")
    first = host_memory.keep_freed_activations()
    assert host_memory.keep_freed_activations() is first    # cached: set once
    import platform
    if platform.libc_ver()[0] == "glibc":
        assert first is True


def test_a_user_setting_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert host_memory.keep_freed_activations.__wrapped__() is False
