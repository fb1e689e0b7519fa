"""qlower's own operators, for choices Inductor cannot express as one aten op (e.g. a choice by M at run time).

Each op has a fake (meta) implementation so Inductor and AOTInductor can trace shapes through it.
"""

from __future__ import annotations

import torch

from qlower.lowerings.kernels import native
from qlower.lowerings.kernels.cpu_prepack import CACHE
from qlower.lowerings.kernels.cpu_scratch import scratch

aten = torch.ops.aten


@torch.library.custom_op("qlower::woq_int8_mm_by_m", mutates_args=())
def _woq_int8_mm_by_m(
    x: torch.Tensor, w_nk: torch.Tensor, scale: torch.Tensor, max_m_packed: int
) -> torch.Tensor:
    """x [M, K] @ (w_nk int8 [N, K] * scale [N]).T, choosing the kernel by M when M is only known at run time.

    Small M: `_weight_int8pack_mm` (it reads int8 weights: the decode win). Larger M: convert the weight into
    a reused float buffer, float GEMM, then the scale, since the packed kernel's cost grows with M much faster
    than a GEMM's (lowerings/kernels/csrc/qlower_ops.cpp computes the same, for AOTInductor).
    """
    m = x.shape[0]
    if m == 0:
        return x.new_empty((0, w_nk.shape[0]))
    if m <= max_m_packed:
        return aten._weight_int8pack_mm(x.contiguous(), w_nk.contiguous(), scale.contiguous())
    return int8_weight_mm(x, w_nk, False) * scale


@_woq_int8_mm_by_m.register_fake
def _(x: torch.Tensor, w_nk: torch.Tensor, scale: torch.Tensor, max_m_packed: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], w_nk.shape[0]))


woq_int8_mm_by_m = torch.ops.qlower.woq_int8_mm_by_m.default


@torch.library.custom_op("qlower::int8_mm_min_m", mutates_args=())
def _int8_mm_min_m(x: torch.Tensor, w_nk: torch.Tensor, min_m: int) -> torch.Tensor:
    """x int8 [M, K] @ w_nk int8 [N, K].T -> int32 [M, N] with `_int_mm`, for kernels that need M >= min_m
    (cuBLAS int8: M > 16). A dynamic M is only known at run time: pad small M with zero rows, then slice."""
    m = x.shape[0]
    if m >= min_m:
        return aten._int_mm(x, w_nk.t())
    padded = torch.nn.functional.pad(x, (0, 0, 0, min_m - m))
    return aten._int_mm(padded, w_nk.t())[:m]


@_int8_mm_min_m.register_fake
def _(x: torch.Tensor, w_nk: torch.Tensor, min_m: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], w_nk.shape[0]), dtype=torch.int32)


int8_mm_min_m = torch.ops.qlower.int8_mm_min_m.default


@torch.library.custom_op("qlower::qlinear_u8_cached", mutates_args=())
def _qlinear_u8_cached(
    x_u8: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_is_kn: bool
) -> torch.Tensor:
    """(x_u8 [M, K] - 128) @ (w int8 [N, K] * w_scale [N]).T in fp32 with oneDNN's u8s8 qlinear, on a weight
    packed once and cached while it is unchanged (lowerings/kernels/cpu_prepack.py): the speed of a frozen weight
    without freezing. `w` is the graph's own weight tensor ([K, N] when `w_is_kn`), so the cache sees the
    same tensor on every call."""
    n = w.shape[1] if w_is_kn else w.shape[0]
    if x_u8.shape[0] == 0:
        return x_u8.new_empty((0, n), dtype=torch.float32)
    packed = CACHE.packed(w, w_is_kn)
    return torch.ops.onednn.qlinear_pointwise.default(
        x_u8.contiguous(), 1.0, 128, packed, w_scale.contiguous(), None, None,
        1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip


@_qlinear_u8_cached.register_fake
def _(x_u8: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, w_is_kn: bool) -> torch.Tensor:
    return x_u8.new_empty((x_u8.shape[0], w.shape[1] if w_is_kn else w.shape[0]), dtype=torch.float32)


qlinear_u8_cached = torch.ops.qlower.qlinear_u8_cached.default


@torch.library.custom_op("qlower::int8_weight_mm", mutates_args=())
def _int8_weight_mm(x: torch.Tensor, w: torch.Tensor, w_is_kn: bool) -> torch.Tensor:
    """x [M, K] @ w.to(x.dtype) with w int8 [N, K] (transposed) or [K, N] (`w_is_kn`), on CPU: the float copy
    of the weight goes into a reused per-thread buffer (lowerings/kernels/cpu_scratch.py), so the conversion does not
    page-fault a fresh allocation on every call. The int8 -> float conversion is exact; scale and bias stay in
    the graph's epilogue."""
    w_float = scratch(tuple(w.shape), x.dtype)
    w_float.copy_(w)
    return torch.mm(x, w_float if w_is_kn else w_float.t())


@_int8_weight_mm.register_fake
def _(x: torch.Tensor, w: torch.Tensor, w_is_kn: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[1] if w_is_kn else w.shape[0]))


int8_weight_mm = torch.ops.qlower.int8_weight_mm.default


# qlower::woq_int8_gemm: x [M, K] @ w_nk int8 [N, K].T on CPU with the int8 -> float conversion inside the
# GEMM's K loop, in the graph's own arithmetic: fp32 sums rounded to x's dtype, then `* scale` (fp32, rounded to
# `out_dtype`) and `+ bias`; with `scale_on_weight` the weight is `round(w * scale)` as `w.to(dtype) * s` rounds
# it instead. w_nk may be a transposed view of a [K, N] weight. The C++ kernel is
# lowerings/kernels/csrc/woq_gemm.cpp (the same in libqlower_ops.so for AOTInductor).
#
# Defined with a Library, not `torch.library.custom_op`: loading the in-process library
# (lowerings/kernels/native.py) registers the C++ kernel as this op's CPU kernel, so a compiled graph's call
# reaches C++ through the dispatcher alone. custom_op's Python kernels (autograd, ADInplaceOrView, the checked
# backend wrapper) cost 30-35 us per call on the 2-core CI CPU (40 against 11 us for a 64x64 call, a scratch
# probe), which is as long as a small layer's GEMM. The Python kernel below serves calls made before the
# library is loaded (say, a graph from Inductor's cache): it loads it, and later calls skip Python.
_NATIVE_LIB = torch.library.Library("qlower", "FRAGMENT")
_NATIVE_LIB.define(
    "woq_int8_gemm(Tensor x, Tensor w_nk, Tensor? scale, Tensor? bias, bool scale_on_weight, "
    "ScalarType out_dtype) -> Tensor"
)


def _woq_int8_gemm_loading(
    x: torch.Tensor,
    w_nk: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale_on_weight: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return native.ops().woq_int8_gemm(x, w_nk, scale, bias, scale_on_weight, out_dtype)


_NATIVE_LIB.impl("woq_int8_gemm", _woq_int8_gemm_loading, "CompositeExplicitAutograd")


@torch.library.register_fake("qlower::woq_int8_gemm")
def _(
    x: torch.Tensor,
    w_nk: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale_on_weight: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], w_nk.shape[0]), dtype=out_dtype)


woq_int8_gemm = torch.ops.qlower.woq_int8_gemm.default

# qlower::int8_gemm: x int8 [M, K] @ w_nk int8 [N, K].T -> int32, exactly, on CPU: qlower's own kernels
# (lowerings/kernels/csrc/int8_gemm.cpp: the weight read once, as stored) up to `max_m` rows, `aten._int_mm`
# above (a symbolic M decides at each call). Defined as woq_int8_gemm is, for the same per-call cost.
_NATIVE_LIB.define("int8_gemm(Tensor x, Tensor w_nk, int max_m) -> Tensor")


def _int8_gemm_loading(x: torch.Tensor, w_nk: torch.Tensor, max_m: int) -> torch.Tensor:
    return native.ops().int8_gemm(x, w_nk, max_m)


_NATIVE_LIB.impl("int8_gemm", _int8_gemm_loading, "CompositeExplicitAutograd")


@torch.library.register_fake("qlower::int8_gemm")
def _(x: torch.Tensor, w_nk: torch.Tensor, max_m: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], w_nk.shape[0]), dtype=torch.int32)


int8_gemm = torch.ops.qlower.int8_gemm.default

# Ops that never reach a C++ wrapper (they need Python state at run time, like the prepack cache, or are
# emitted only where the wrapper is Python: `mxfp4_dense` and `woq_int8_dense_gated`, the gated buckets'
# run-time choice under CUDA graphs, kernels/triton/mx/launch.py and kernels/triton/int8/ops.py): they get no C
# shim and no C++ kernel.
PYTHON_RUNTIME_ONLY = frozenset(
    {
        "qlower::qlinear_u8_cached",
        "qlower::int8_weight_mm",
        "qlower::int8_scaled_weight_mm",
        "qlower::mxfp4_dense",
        "qlower::woq_int8_dense_gated",
    }
)

# qlower's operators are registered now: a qlower library loaded after this point would define them again, and
# registers nothing; torch.ops.load_library says so (lowerings/kernels/native.py, tests/lowerings/kernels/test_native_library.py).
native.check_library_loads()
