"""CPU backend: `_weight_int8pack_mm` where it is correct and faster than the alternatives, else fused dequant.

Measured on the CI CPU (2-core AVX512 EPYC, torch 2.13, 4096x4096, see BENCHMARKS.md): the packed kernel is
a GEMV per row, so its cost grows linearly with M (bf16: ~0.55 ms per row at 4096x4096), while converting
the weight (2.2 ms into a reused buffer, see `SCRATCH_MIN_BYTES`) + bf16 GEMM costs little more than the GEMM:
the packed kernel wins up to M=8. With fp16/fp32 activations the packed kernel is slow
(7-9 ms at M=1) and only wins at M=1. With bf16 on AVX512 it needs K % 16 == 0 and does not check it
(wrong numbers for K=8/24/40, a segfault for K=7/33: shared/notes/torch-internals.md).
"""

from __future__ import annotations

import torch

from qlower.patterns.graph_utils import is_static
from qlower.patterns.record import QuantLinear

from qlower.lowerings.backends.dynamic_int8_rules import (
    DYNAMIC_INT8_INT_MM_CPU,
    DYNAMIC_INT8_INT_MM_U8_CPU,
    DYNAMIC_INT8_QLINEAR_CACHED_CPU,
    DYNAMIC_INT8_QLINEAR_CPU,
)
from qlower.lowerings.backends.emulated import DYNAMIC_INT8_EMULATED, WOQ_INT8_DEQUANT_MM
from qlower.lowerings.backends.mx_rules import MX_EMULATED
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering, register_backend
from qlower.lowerings.emit.woq_int8 import (
    emit_int8_weight_mm,
    emit_int8pack_mm,
    make_emit_int8pack_by_m,
    weight_scale_range_blocker,
)

# Largest M at which the packed kernel beats dequant + GEMM on the CI CPU, per activation dtype. bf16, 1 thread
# (session 2, once the float copy stopped page-faulting): M=8 packed 4.52 vs 6.16 ms (4096^2), 14.8 vs 20.2 ms
# (4096->14336), 0.25 vs 0.34 ms (1024^2); M=16 packed 8.73 vs 7.42 ms, 29.4 vs 24.1 ms, 0.48 vs 0.41 ms.
# (It was 64 while the dequant + GEMM paid ~16 ms of page faults per call at 4096^2.)
PACKED_MAX_M = {torch.bfloat16: 8, torch.float16: 1, torch.float32: 1}


def _packed_kernel_is_correct(rec: QuantLinear) -> str | None:
    if not (is_static(rec.k) and is_static(rec.n)):
        return "K or N is symbolic (dynamic weight shape)"
    if rec.compute_dtype not in PACKED_MAX_M:
        return f"activation dtype {rec.compute_dtype} not supported by _weight_int8pack_mm"
    if rec.compute_dtype == torch.bfloat16 and rec.k % 16 != 0:
        return f"bf16 _weight_int8pack_mm on CPU needs K % 16 == 0 (K={rec.k}); it gives wrong numbers or crashes"
    return weight_scale_range_blocker(rec)


def _supports_packed_static_m(rec: QuantLinear) -> str | None:
    why = _packed_kernel_is_correct(rec)
    if why:
        return why
    if not is_static(rec.m):
        return "M is dynamic (the by-M lowering decides at run time)"
    m, limit = int(rec.m), PACKED_MAX_M[rec.compute_dtype]
    if m == 0:
        return "M == 0"
    if m > limit:
        return f"M={m} > {limit}: dequant + GEMM is faster on CPU"
    return None


def _supports_packed_by_m(rec: QuantLinear) -> str | None:
    why = _packed_kernel_is_correct(rec)
    if why:
        return why
    if is_static(rec.m):
        return "M is static (decided at compile time)"
    return None


WOQ_INT8_PACKED_CPU = Lowering(
    name="aten._weight_int8pack_mm",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_packed_static_m,
    emit=emit_int8pack_mm,
    doc="packed int8 weight GEMV; wins at small M",
)

WOQ_INT8_PACKED_BY_M_CPU = Lowering(
    name="qlower.woq_int8_mm_by_m",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_packed_by_m,
    emit=lambda graph, rec: make_emit_int8pack_by_m(PACKED_MAX_M[rec.compute_dtype])(graph, rec),
    doc="dynamic M: _weight_int8pack_mm up to the crossover M, dequant + GEMM above",
)


# int8 -> float into a reused buffer + GEMM, for float weights of >= 16 MiB. glibc serves allocations of 32 MiB
# and more from a fresh mmap, and in this VM the first touch of each page faults: converting int8 to bf16 into
# a fresh tensor took 19.2 ms at 4096x4096 against 2.2 ms into a reused buffer (1 thread); at 4096x3072
# 2.1 vs 1.7 ms, at 2048x2048 and below equal, where the custom op's fixed cost made it a loss
# (1.60 vs 1.45 ms for the whole M=128, 1024x1024 linear).
SCRATCH_MIN_BYTES = 16 * 2**20


def _supports_scratch_mm(rec: QuantLinear) -> str | None:
    from torch._inductor.virtualized import V

    if rec.compute_dtype not in PACKED_MAX_M:
        return f"activation dtype {rec.compute_dtype} is not a float GEMM dtype"
    if not (is_static(rec.m) and is_static(rec.k) and is_static(rec.n)):
        return "M, K or N is symbolic (the by-M lowering decides at run time)"
    nbytes = int(rec.k) * int(rec.n) * rec.compute_dtype.itemsize
    if nbytes < SCRATCH_MIN_BYTES:
        return f"the float weight ({nbytes >> 20} MiB) is < 16 MiB: Inductor's fused dequant is as fast"
    if V.aot_compilation:
        return "AOTInductor: the package has no Python run time for the reused buffer"
    return None


WOQ_INT8_SCRATCH_MM_CPU = Lowering(
    name="qlower.int8_weight_mm",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_scratch_mm,
    emit=emit_int8_weight_mm,
    doc="int8 weight converted (and scaled, where the graph scales it) into a reused per-thread buffer, float "
    "GEMM, an output scale in the epilogue",
)


def register() -> None:
    register_backend(
        "cpu",
        [
            WOQ_INT8_PACKED_CPU,
            WOQ_INT8_PACKED_BY_M_CPU,
            WOQ_INT8_SCRATCH_MM_CPU,
            WOQ_INT8_DEQUANT_MM,
            DYNAMIC_INT8_QLINEAR_CPU,
            DYNAMIC_INT8_QLINEAR_CACHED_CPU,
            DYNAMIC_INT8_INT_MM_U8_CPU,
            DYNAMIC_INT8_INT_MM_CPU,
            DYNAMIC_INT8_EMULATED,
            MX_EMULATED,
        ],
        describe=lambda device: f"{device} ({torch.backends.cpu.get_cpu_capability()})",
        replace=True,
    )
