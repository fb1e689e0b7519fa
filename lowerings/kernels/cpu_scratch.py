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


@torch.library.custom_op("qlower::int8_scaled_weight_mm", mutates_args=())
def _int8_scaled_weight_mm(
    x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, w_is_kn: bool, product_dtype: torch.dtype
) -> torch.Tensor:
    """x [M, K] @ (w * s) for a graph that scales the weight itself (`w.to(dtype) * s`), on CPU.

    w int8 [N, K] (transposed) or [K, N] (`w_is_kn`); s broadcasts on w, in fp32 or wider, so the product
    is exact before it is rounded once to `product_dtype`: the graph's own scaled weight, inf where the
    graph's is (tests/lowerings/emit/test_dequant_range.py). It goes into a reused per-thread buffer, as in
    `qlower::int8_weight_mm`, then into x's dtype if that differs, and a float GEMM reads it.
    """
    scaled = scratch(tuple(w.shape), product_dtype)
    torch.mul(w, s, out=scaled)
    if product_dtype != x.dtype:
        converted = scratch(tuple(w.shape), x.dtype)
        converted.copy_(scaled)
        scaled = converted
    return torch.mm(x, scaled if w_is_kn else scaled.t())


@_int8_scaled_weight_mm.register_fake
def _(
    x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, w_is_kn: bool, product_dtype: torch.dtype
) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[1] if w_is_kn else w.shape[0]))


int8_scaled_weight_mm = torch.ops.qlower.int8_scaled_weight_mm.default
