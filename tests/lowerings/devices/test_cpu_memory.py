"""`qlower.keep_freed_cpu_memory()`: a process-wide malloc setting, so each check runs in its own process."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import SUBPROCESS_TIMEOUT_S

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or platform.libc_ver()[1] < "2.33",
    reason="glibc >= 2.33 (mallinfo2) only",
)

# mallinfo2: hblkhd = bytes in mmapped blocks, fordblks = free bytes kept in the heap. A 64 MiB tensor is an
# mmapped block by default; with the setting it is heap memory, and it stays there after it is freed.
_SCRIPT = """
import ctypes, sys
import torch, qlower
class Info(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
applied = qlower.keep_freed_cpu_memory() if sys.argv[1] == "on" else False
before = libc.mallinfo2()
t = torch.empty(64 * 2**20, dtype=torch.uint8)
mapped = libc.mallinfo2().hblkhd - before.hblkhd >= 32 * 2**20
del t
kept = libc.mallinfo2().fordblks - before.fordblks >= 32 * 2**20
print(applied, mapped, kept)
"""


def _run(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SCRIPT), mode],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_large_blocks_come_from_the_heap_and_stay_after_free():
    assert _run("on") == ["True", "False", "True"]


def test_default_malloc_maps_large_blocks():
    assert _run("off") == ["False", "True", "False"]
