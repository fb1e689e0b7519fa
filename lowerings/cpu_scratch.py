"""Reusable per-thread scratch buffers for large CPU temporaries that a kernel fills on every call.

Why: on the CI CPU (a KVM guest) a fresh 32 MiB allocation is returned by glibc from a new mmap, and the
first write to each 4 KiB page faults: converting a 4096x4096 int8 weight to bf16 into a fresh tensor took
18.3 ms, into an already-touched buffer 2.2 ms (1 thread; `MALLOC_MMAP_THRESHOLD_`/`MALLOC_TRIM_THRESHOLD_`
set high gave the same 2.2 ms, confirming the cause). A buffer kept per thread and dtype, grown to the
largest size asked for, pays the faults once. Cost: one buffer of the largest weight converted per thread.
"""

from __future__ import annotations

import threading

import torch

_LOCAL = threading.local()


def scratch(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU tensor of `shape` and `dtype` whose memory is reused by the next call on this thread:
    its contents are valid only until then, so callers must not return it or keep it."""
    buffers: dict[torch.dtype, torch.Tensor] = getattr(_LOCAL, "buffers", None) or {}
    _LOCAL.buffers = buffers
    numel = 1
    for size in shape:
        numel *= size
    buf = buffers.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = buffers[dtype] = torch.empty(numel, dtype=dtype)
    return buf[:numel].view(shape)
