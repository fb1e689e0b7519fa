"""Opt-in: keep freed CPU memory in the process instead of returning it to the OS (glibc).

Why: glibc serves allocations of >= 32 MiB from fresh mmaps and unmaps them on free, and trims the heap above
128 KiB of free space, so a temporary of a dequantized weight page-faults on every call. On the CI VM that was
most of the cost of CPU paths that dequantize in the graph: MX emulation at M=128, 4096x4096 went from 0.48x
to 0.75x bf16 and at M=1 from 0.13x to 0.35x (BENCHMARKS.md). qlower's own woq-int8 lowering avoids it with a
reused buffer (lowerings/kernels/cpu_scratch.py); this switch helps every other large temporary too.

Cost: the process keeps its peak heap (RSS does not shrink after a large temporary is freed). It is a
process-wide setting, so qlower never applies it by itself. Same effect without code:
`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647` in the environment (or a caching allocator such as
jemalloc or tcmalloc).
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_MAX = -4


def keep_freed_cpu_memory() -> bool:
    """Tell glibc malloc to never use mmap for large blocks and never trim the heap. Returns True when applied,
    False where malloc is not glibc's (other C libraries, Windows, macOS), where nothing is changed."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):
            return False
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
