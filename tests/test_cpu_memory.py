"""`qlower.keep_freed_cpu_memory()`: a process-wide malloc setting, so each check runs in its own process."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only"
)

# A 64 MiB tensor comes from the heap (the program break moves) only once large blocks may not use mmap.
_SCRIPT = """
import ctypes, sys
import torch, qlower
libc = ctypes.CDLL(None)
libc.sbrk.restype = ctypes.c_void_p
applied = qlower.keep_freed_cpu_memory() if sys.argv[1] == "on" else False
before = libc.sbrk(0)
t = torch.empty(64 * 2**20, dtype=torch.uint8)
grown = libc.sbrk(0) - before
del t
t = torch.empty(64 * 2**20, dtype=torch.uint8)
print(applied, grown >= 64 * 2**20, libc.sbrk(0) - before >= 64 * 2**20)
"""


def _run(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), mode], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_large_blocks_come_from_the_heap_and_stay_after_free():
    assert _run("on") == ["True", "True", "True"]


def test_default_malloc_maps_large_blocks():
    assert _run("off") == ["False", "False", "False"]
