"""CPU backend: `_weight_int8pack_mm` where it is correct and faster than the alternatives, else fused dequant.

Measured on the CI CPU (2-core AVX512 EPYC, torch 2.13, 4096x4096, see BENCHMARKS.md): the packed kernel is
a GEMV per row, so its cost grows linearly with M (bf16: ~0.55 ms per row at 4096x4096), while converting
the weight (2.2 ms into a reused buffer, see `SCRATCH_MIN_BYTES`) + bf16 GEMM costs little more than the GEMM:
the packed kernel wins up to M=8. With fp16/fp32 activations the packed kernel is slow
(7-9 ms at M=1) and only wins at M=1. With bf16 on AVX512 it needs K % 16 == 0 and does not check it
(wrong numbers for K=8/24/40, a segfault for K=7/33;
tests/end_to_end/test_woq_compile.py::test_bf16_odd_k_never_crashes_or_miscomputes).
"""

from __future__ import annotations

import functools
import os

import torch
from torch import fx
from torch._inductor.virtualized import V

from qlower.lowerings.devices.common import int8_operands, weight_scale_range_blocker
from qlower.lowerings.devices.emulated import DYNAMIC_INT8_EMULATED, MX_EMULATED, WOQ_INT8_DEQUANT_MM
from qlower.lowerings.emit.dynamic_int8 import (
    emit_int_mm,
    emit_qlinear_u8,
    emit_qlinear_u8_cached,
    make_emit_int8_gemm,
    make_emit_int_mm_u8,
)
from qlower.lowerings.emit.woq_int8 import (
    emit_int8_weight_mm,
    emit_int8pack_mm,
    emit_woq_int8_gemm,
    make_emit_int8pack_by_m,
)
from qlower.lowerings.graph.inductor_fixes import INT8PACK_BF16_K_MULTIPLE
from qlower.lowerings.kernels import cpu_prepack, native
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering, register_backend
from qlower.lowerings.scale_facts import product_dtype
from qlower.patterns.graph_utils import is_static
from qlower.patterns.record import QuantLinear

# Largest M at which the packed kernel beats dequant + GEMM, per activation dtype. bf16, 1 thread, on an
# AVX512-BF16 EPYC (a sweep against the float copy into a reused buffer; the numbers are here, the table
# of that run is in BENCHMARKS.md's git history): M=8 packed 4.52 vs 6.16 ms (4096^2), 14.8 vs 20.2 ms
# (4096->14336), 0.25 vs 0.34 ms (1024^2); M=16 packed 8.73 vs 7.42 ms, 29.4 vs 24.1 ms, 0.48 vs 0.41 ms.
# (It was 64 while the dequant + GEMM paid ~16 ms of page faults per call at 4096^2.)
PACKED_MAX_M = {torch.bfloat16: 8, torch.float16: 1, torch.float32: 1}


def _packed_kernel_is_correct(rec: QuantLinear) -> str | None:
    if not (is_static(rec.k) and is_static(rec.n)):
        return "K or N is symbolic (dynamic weight shape)"
    if rec.compute_dtype not in PACKED_MAX_M:
        return f"activation dtype {rec.compute_dtype} not supported by _weight_int8pack_mm"
    if rec.compute_dtype == torch.bfloat16 and rec.k % INT8PACK_BF16_K_MULTIPLE != 0:
        return (
            f"bf16 _weight_int8pack_mm on CPU needs K % {INT8PACK_BF16_K_MULTIPLE} == 0 (K={rec.k}); it gives "
            "wrong numbers or crashes"
        )
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


# --------------------------------------------------------------------- qlower.woq_int8_gemm
# qlower's own CPU GEMM (lowerings/kernels/csrc/woq_gemm.cpp): int8 -> float inside the kernel, the graph's own
# arithmetic (tests/lowerings/kernels/test_cpu_woq_gemm.py). Four paths, chosen by the kernel at each call:
# direct (its own micro-kernel, each int8 block converted once and reused by every M row), chunked (chunks of
# N columns converted into a buffer of x's dtype, multiplied by ATen's own GEMM, oneDNN's AMX / AVX512-BF16
# kernels where the CPU has them), amx (bf16 x on AMX-BF16 tiles, the weight converted in registers) and panel
# (bf16 x on vdpbf16ps, the weight converted once per 48-column panel into the instruction's pair layout).
# `QLOWER_CPU_WOQ_GEMM_PATH=auto|direct|chunked|amx|panel` forces one; auto (`plan_call` in the kernel) takes amx
# for bf16 x from M = 8 to 128 where the CPU has AMX tiles (`kAmxMinM`, `kAmxMaxM`), chunked for bf16 x at the
# avx512_bf16 level from M = 16 on where oneDNN's bf16 GEMM runs on AMX (`kChunkedMinM`, `amx_bf16_gemm`),
# panel for bf16 x at that level from M = 64 where it does not (M = 32 with K <= 2048; `kPanelMinM`), direct otherwise (the avx512
# fp32-FMA kernels below M = 4 there). The report names the path a record runs (woq_gemm_tier).
# AUTO takes the op where it was measured faster than every other lowering, per ISA level (cpu_woq_isa; or its
# tier, woq_weight_tier, where an entry names one) and activation dtype, with the kernel's auto path:
# WOQ_GEMM_MAX_M holds the static M range (min_m, max_m) it is
# preferred in (max_m None: no upper bound; (0, None): every M, a dynamic M included; absent: not preferred).
#
# Measured on a 2-core AMD EPYC (KVM, AVX2, no AVX512), torch 2.13, the direct path: eager calls of what each
# lowering emits, the minimum of 3 interleaved rounds, 4 weight sets rotated; ms at 4096x4096 | 4096x14336,
# this kernel vs `_weight_int8pack_mm` vs `qlower.int8_weight_mm` (+ the scale):
#   bf16, 1 thread   M=1 1.33 vs 1.73 vs 7.34 | 5.05 vs 5.95 vs 24.3;   M=4 2.52 vs 3.39 vs 16.9 | 7.91 vs 11.3
#                    vs 57.6;   M=16 10.9 vs 13.5 vs 53.4 | 36.9 vs 46.7 vs 188;   M=128 73.7 vs 400 | 230 vs
#                    1392;   M=1024 717 vs 3535 | 2376 vs 12164 (this CPU's bf16 GEMM has no native bf16 unit)
#   bf16, 2 threads  M=1 0.73 vs 0.81 vs 3.48 | 2.54 vs 2.97 vs 13.5;   M=4 1.29 vs 1.63 vs 8.40 | 4.54 vs 6.14
#                    vs 30.3;   M=16 5.21 vs 6.35 vs 26.7 | 21.1 vs 29.6 vs 95.7;   M=128 30.5 vs 199 | 108 vs
#                    703;   M=1024 311 vs 1624 | 1128 vs 5784
#   fp16, 2 threads, 4096x4096: 0.80 / 6.15 / 30.2 / 714 at M = 1, 16, 128, 1024 vs int8_weight_mm 8.49 / 26.9
#                    / 171 / 2788 (_weight_int8pack_mm at M = 1: 11.1)
#   fp32, 2 threads, 4096x4096: 0.73 / 5.03 / 63.8 / 504 vs 5.50 / 13.6 / 92.1 / 474; 1 thread M=128 69.4 vs
#                    73.7, M=1024 553 vs 496 (int8_weight_mm's fp32 GEMM wins there): up to M = 128.
# AVX512 without BF16 (Skylake-SP, Cascade Lake, Ice Lake servers): the avx512 (fp32 FMA) kernels against the
# lowerings such a CPU has, measured on an AVX512-BF16 EPYC with oneDNN capped at AVX512_CORE (no bf16 or AMX
# instructions, as there) and QLOWER_CPU_WOQ_ISA=avx512 (BENCHMARKS.md, "AVX512 without BF16"; 2 threads, bf16,
# 4096^2, 4096->14336, 14336->4096): 1.9-11x of bf16 F.linear at every M from 1 to 1024 (2.2-2.7x from
# M = 64), against dequant + GEMM's 0.07-0.98x and `_weight_int8pack_mm`'s 1.3-8.5x at M <= 16 (ahead of the
# kernel only at M = 16, where AUTO does not rank it: PACKED_MAX_M): every M. (On a Xeon with AMX, where
# oneDNN's own kernels run on AMX, the same fp32-FMA kernels lost to int8pack from M = 16; that machine's
# tier is avx512_bf16.)
# avx512_bf16 level, the kernel's auto path (the same Xeon, 2 threads, `scripts/bench_cpu_woq_gemm.py --paths
# auto,direct,chunked`, ms at 4096^2 | 4096->14336; BENCHMARKS.md has the table):
#   oneDNN capped at AVX512_CORE_BF16 (no AMX, as on an AVX512-BF16 EPYC; auto = direct): M=1 0.62 | 3.21 vs
#     `_weight_int8pack_mm` 0.66 | 3.37; M=4 0.79 | 3.96 vs 1.05 | 4.39; M=16 4.65 | 22.1 vs 3.97 | 19.8
#     (int8pack is AUTO's choice only up to PACKED_MAX_M = 8; dequant + GEMM 14.8 | 62.3); M=128 29.1 | 114 vs
#     dequant + GEMM 42.9 | 149; M=1024 219 | 771 vs 221 | 859;
#   AMX (auto = chunked from M = 16): M=128 11.6 | 24.7 vs dequant + GEMM 23.0 | 48.6; M=1024 58.6 | 105 vs
#     79.7 | 268.
#   So every M; the one loss measured, M = 16 against int8pack, is to a lowering AUTO does not rank there.
#   On an AVX512-BF16 EPYC itself (no AMX; BENCHMARKS.md, "AMD EPYC with AVX512-BF16"), where auto runs the
#   vdpbf16ps kernels from M = 4 and the panels from M = 64: 1.3-4.3x of bf16 F.linear at M <= 32, 0.9-1.05x
#   above, against `_weight_int8pack_mm` 0.57-2.7x (M <= 16) and dequant + GEMM 0.13-0.89x at every M.
#   With the amx path (BENCHMARKS.md, "CPU, woq_int8: qlower::woq_int8_gemm", the Sapphire Rapids table) the op
#   is the fastest int8 lowering at every M measured there as well.
WOQ_GEMM_ISA_ENV = "QLOWER_CPU_WOQ_ISA"  # forces the kernel's ISA path (scalar, avx2, avx512, avx512_bf16)
WOQ_GEMM_PATH_ENV = "QLOWER_CPU_WOQ_GEMM_PATH"  # forces the kernel's path (auto, direct, chunked, amx, panel)
WOQ_GEMM_EVERY_M: tuple[int, int | None] = (0, None)
WOQ_GEMM_MAX_M: dict[tuple[str, torch.dtype], tuple[int, int | None]] = {
    ("avx2", torch.bfloat16): WOQ_GEMM_EVERY_M,
    ("avx2", torch.float16): WOQ_GEMM_EVERY_M,
    ("avx2", torch.float32): (0, 128),
    ("avx512", torch.bfloat16): WOQ_GEMM_EVERY_M,
    ("avx512", torch.float16): WOQ_GEMM_EVERY_M,
    ("avx512_bf16", torch.bfloat16): WOQ_GEMM_EVERY_M,
    ("avx512_bf16_no_amx", torch.float16): WOQ_GEMM_EVERY_M,
    ("avx512_bf16_no_amx", torch.float32): WOQ_GEMM_EVERY_M,
}
# fp16 activations on AVX512 CPUs without AMX (without AVX512-FP16 too: oneDNN's fp16 GEMM is emulated there):
# the kernel's fp32-FMA level ran 2.1-6.6x of fp16 F.linear at M = 1-1024 on the AVX512-BF16 EPYC (2 threads,
# 4096^2 and 14336->4096), and 2.5-11.9x with oneDNN capped at AVX512_CORE, against dequant + GEMM's 0.06-1.00x
# and `_weight_int8pack_mm`'s 0.08-0.19x (BENCHMARKS.md, "fp16 activations on AVX512 CPUs"). Keyed by tier
# (woq_weight_tier): AMX Xeons have AVX512-FP16 and were not measured with fp16.
# fp32 activations there too: 0.97-11.5x of fp32 F.linear at M = 1-1024 against dequant + GEMM's 0.13-1.05x and
# int8pack's 0.07-0.51x (BENCHMARKS.md, "fp32 activations on the AVX512-BF16 EPYC"). Not the avx512 tier: its
# Xeons' fp32 GEMM (MKL, two FMA units) was not measured, and MKL on this EPYC is no stand-in for it.
# Small weights, per ISA level: the smallest K * N AUTO takes the op at (WOQ_GEMM_MIN_WEIGHT), and the K * N
# below which a static M <= PACKED_MAX_M still takes `_weight_int8pack_mm` (WOQ_GEMM_SMALL_PACKED). avx2:
# BENCHMARKS.md, "AMD EPYC, AVX2: small weights" (2 threads, the C++-registered kernel): from 128x128 to
# 2048x2048 the op beat dequant + GEMM at M = 16 and 256 (2.5-8.7x bf16 against 0.78-1.31x) and tied
# `_weight_int8pack_mm` at M = 16 (it lost at 128x128), but at M = 1 below K * N = 2^19 it lost to it (a
# fixed ~15 us a call: 512x512 0.033 vs 0.023 ms, 128x128 0.019 vs 0.006 ms). Other levels: measured faster
# only from K * N = 2^22 (an AVX512 Xeon, before the op's kernel moved to C++: at 1024^2, M = 1 it tied with
# `_weight_int8pack_mm`).
WOQ_GEMM_MIN_WEIGHT: dict[str, int] = {"avx2": 0}
WOQ_GEMM_MIN_WEIGHT_DEFAULT = 2**22
# The small-weight tables are keyed by `woq_weight_tier`: the ISA level, split at avx512_bf16 by whether the CPU
# has AMX tiles. AVX512-BF16 without AMX (an EPYC, 2 threads, `python -m scripts.bench_cpu_woq_gemm --threads 2
# --shapes 512x512,1024x1024,512x1536,2048x2048 --ms 1,4,16,32,64,128,256 --paths auto --rounds 3`;
# BENCHMARKS.md, "AMD EPYC with AVX512-BF16"): below K * N = 2^22 the op ran 0.79-1.26x of bf16 at M = 16-128
# against dequant + GEMM's 0.59-0.94x (and `_weight_int8pack_mm`'s 0.61-0.77x at M = 16), 1.5-4.0x at M = 1-4
# (int8pack ahead only at 512x512, M = 1-4), and tied dequant + GEMM at M = 256 (0.92-0.98x against
# 0.86-0.96x; another run had the op behind by up to 0.04x): there small weights take it for a static M up to
# WOQ_GEMM_SMALL_MAX_M, int8pack below K * N = 2^19 at M <= 8.
WOQ_GEMM_SMALL_PACKED: dict[str, int] = {"avx2": 2**19, "avx512_bf16_no_amx": 2**19}
WOQ_GEMM_SMALL_MAX_M: dict[str, int] = {"avx512_bf16_no_amx": 128}  # below WOQ_GEMM_MIN_WEIGHT, static M only


def woq_weight_tier(isa: str) -> str:
    """The key of the small-weight tables: `isa`, with "_no_amx" appended at avx512_bf16 on a CPU without AMX
    tiles (where the kernel runs its vdpbf16ps tiles)."""
    return f"{isa}_no_amx" if isa == "avx512_bf16" and not torch.cpu._is_amx_tile_supported() else isa


def cpu_woq_isa() -> str:
    """The ISA level qlower::woq_int8_gemm runs at on this CPU: QLOWER_CPU_WOQ_ISA, else the best available
    (the kernel decides the same way at run time with `__builtin_cpu_supports`; at avx512_bf16 its auto path
    for bf16 x is the AMX tiles, converted chunks, the vdpbf16ps or the fp32-FMA kernels by M and by whether
    oneDNN runs on AMX (woq_gemm.cpp, plan_call): the table's entry for that level is for all of them)."""
    forced = os.environ.get(WOQ_GEMM_ISA_ENV)
    if forced:
        return forced
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    if torch.cpu._is_avx512_supported():
        return "avx512"
    return "avx2" if torch.cpu._is_avx2_supported() else "scalar"


def _supports_woq_gemm(rec: QuantLinear) -> str | None:
    if rec.compute_dtype not in PACKED_MAX_M:
        return f"activation dtype {rec.compute_dtype} is not bf16/fp16/fp32"
    if rec.weight_scale is not None and product_dtype(rec) not in (rec.compute_dtype, torch.float32):
        return f"the graph's scale product is {product_dtype(rec)}: the kernel scales in fp32"
    if not native.compiler_available():
        return "no C++ compiler on PATH to build the kernel (lowerings/kernels/native.py)"
    return None


def woq_gemm_preferred(rec: QuantLinear) -> str | None:
    """None where AUTO takes qlower.woq_int8_gemm over the other CPU woq lowerings (WOQ_GEMM_MAX_M), else why not."""
    isa = cpu_woq_isa()
    tier = woq_weight_tier(isa)
    m_range = WOQ_GEMM_MAX_M.get((tier, rec.compute_dtype), WOQ_GEMM_MAX_M.get((isa, rec.compute_dtype)))
    if m_range is None:
        return f"not measured faster on the {isa} path with {rec.compute_dtype} activations (WOQ_GEMM_MAX_M)"
    min_m, max_m = m_range
    if not (is_static(rec.k) and is_static(rec.n)):
        return f"K={rec.k}, N={rec.n} are not static: the weight-size limits below need them"
    weight = int(rec.k) * int(rec.n)
    min_weight = WOQ_GEMM_MIN_WEIGHT.get(tier, WOQ_GEMM_MIN_WEIGHT_DEFAULT)
    small_max_m = WOQ_GEMM_SMALL_MAX_M.get(tier)
    small_m = small_max_m is not None and is_static(rec.m) and int(rec.m) <= small_max_m
    if weight < min_weight and not small_m:
        return f"K*N={weight} < {min_weight}: not measured faster on the {isa} path (WOQ_GEMM_MIN_WEIGHT)"
    packed_below = WOQ_GEMM_SMALL_PACKED.get(tier, 0)
    packed_m = PACKED_MAX_M[rec.compute_dtype]
    if weight < packed_below and is_static(rec.m) and packed_m is not None and int(rec.m) <= packed_m:
        return (
            f"M={rec.m} <= {packed_m} and K*N={weight} < {packed_below}: `_weight_int8pack_mm` was faster "
            "(WOQ_GEMM_SMALL_PACKED)"
        )
    if rec.weight_layout != "NK":
        return "a [K, N] weight: the kernel packs it with a scalar transpose"
    if (min_m, max_m) == WOQ_GEMM_EVERY_M:
        return None
    where = f"M in [{min_m}, {'inf' if max_m is None else max_m}]"
    if not is_static(rec.m):
        return f"M is dynamic and the {isa} path was measured faster only at {where}"
    m = int(rec.m)
    if m < min_m or (max_m is not None and m > max_m):
        return f"M={m}: the {isa} path was measured faster only at {where}"
    return None


def _defer_to_woq_gemm(rec: QuantLinear) -> str | None:
    """`prefer` of the lowerings ranked above qlower.woq_int8_gemm: AUTO passes them over where it wins."""
    if _supports_woq_gemm(rec) is None and woq_gemm_preferred(rec) is None:
        return "qlower.woq_int8_gemm was measured faster here (WOQ_GEMM_MAX_M)"
    return None


# M at which the report names the kernel's path when M is symbolic (the kernel chooses per call).
PLAN_SAMPLE_M = (1, 16, 256, 1024)


def woq_gemm_tier(rec: QuantLinear) -> str:
    """The kernel's path and ISA tier for this record, as the kernel itself decides (native.woq_gemm_plan):
    one for a static M, else the path at each of PLAN_SAMPLE_M."""
    nk = rec.weight_layout == "NK"
    k = int(rec.k) if is_static(rec.k) else 0
    if is_static(rec.m):
        return native.woq_gemm_plan(int(rec.m), rec.compute_dtype, nk, k)
    return "by M: " + ", ".join(
        f"{m} {native.woq_gemm_plan(m, rec.compute_dtype, nk, k)}" for m in PLAN_SAMPLE_M
    )


WOQ_INT8_GEMM_CPU = Lowering(
    name="qlower.woq_int8_gemm",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_woq_gemm,
    emit=emit_woq_int8_gemm,
    prefer=woq_gemm_preferred,
    doc="qlower's CPU GEMM converting int8 inside the kernel (AMX-BF16 tiles, its own AVX512-BF16/AVX512/AVX2/"
    "scalar micro-kernel, or converted chunks multiplied by ATen's GEMM), scale and bias in its epilogue",
    detail=woq_gemm_tier,
)


WOQ_INT8_PACKED_CPU = Lowering(
    name="aten._weight_int8pack_mm",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_packed_static_m,
    emit=emit_int8pack_mm,
    doc="packed int8 weight GEMV; wins at small M",
    prefer=_defer_to_woq_gemm,
)

WOQ_INT8_PACKED_BY_M_CPU = Lowering(
    name="qlower.woq_int8_mm_by_m",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_packed_by_m,
    emit=lambda graph, rec, preference: make_emit_int8pack_by_m(PACKED_MAX_M[rec.compute_dtype])(
        graph, rec, preference
    ),
    doc="dynamic M: _weight_int8pack_mm up to the crossover M, dequant + GEMM above",
    prefer=_defer_to_woq_gemm,
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
    prefer=_defer_to_woq_gemm,
)


# --------------------------------------------------------------------- dynamic_int8
# The dynamic-int8 lowerings of each device and the rules that say when each is correct.
#
# - CPU (measured on the AVX512-VNNI CI CPU without AMX, 1 thread, 4096x4096, 4 rotating weights, ms):
#
#       M     bf16   s8 _int_mm  u8 _int_mm  u8 _int_mm, KN weight  u8 qlinear, prepacked  s8 qlinear
#       1     4.19   1.12        0.97        2.92                   1.71
#       16    4.89   7.28        4.36        3.44                   2.01
#       128  21.37  15.48       12.71       11.79                  10.48                   ~37 000
#
#   Weight a constant (freezing, M >= 2): u8 oneDNN qlinear on a weight prepacked once at compile time (it
#   also won at K = 1024..2816, by 3-45%). Otherwise, M >= 2 and K >= 4096: u8s8 `_int_mm` (x_q + 128 as
#   uint8, minus 128 * colsum(w), ~0.7 ms more for the sums; s8s8 re-packs the [N, K] weight every call, which
#   costs most at large K: s8 won at K <= 2816, u8 at K = 4096, 8192); else s8s8 `_int_mm` (M = 1: a GEMV).
#   Inductor's own freezing rewrite of `convert(_int_mm(x, w)) * s * s` makes an s8 qlinear, which took 37.5 s
#   for one M=128 call: qlower's epilogue never has that shape. AMX CPUs: s8s8 `_int_mm` (as torchao picks).
# - CUDA: cuBLASLt `_int_mm` needs M > 16, K % 8 == 0 and N % 8 == 0, and its meta kernel checks none of
#   them; the operands it gets are row-major x [M, K] and the transposed view of a contiguous [N, K] weight
#   (the TN layout cuBLASLt int8 wants). Small or dynamic M is padded to 17 rows (a static pad fuses into the
#   quantize prologue; a dynamic M goes through `qlower::int8_mm_min_m`). Other K, N: the emulated lowering.
# - XPU: `_int_mm` (oneDNN), no size rules as of torch 2.13.

CPU_U8_MIN_M = 2  # below: s8s8 is as fast, no column sums (but see u8s8_at_m1: VNNI CPUs keep u8s8 at M = 1)


CPU_U8_MIN_K = 4096  # below: s8s8 `_int_mm` was faster (K = 1024, 2048, 2816); u8s8 won at K = 4096, 8192


# Cached-prepack qlinear: a fixed ~55 us per call (custom op + oneDNN); it won from K*N = 2^22 int8 weights on
# (M=16: 394 vs 806 us at 2048^2, 364 vs 987 us at 4096x1024), tied at 1024^2 and lost below (63 vs 10 us
# at 256^2). 1 thread, CI CPU, single calls.
CPU_CACHED_MIN_WEIGHT = 2**22


def cpu_int8_isa() -> str:
    """'amx', 'vnni' or 'none': the running CPU's int8 dot-product unit (QLOWER_CPU_INT8_ISA overrides)."""
    forced = os.environ.get("QLOWER_CPU_INT8_ISA")
    if forced:
        return forced
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    return "vnni" if torch.cpu._is_vnni_supported() else "none"


@functools.cache
def int_mm_takes_uint8() -> bool:
    """Whether this torch's CPU `_int_mm` accepts a uint8 activation (torch 2.13 does; 2.11 raises "expected
    self to be int8")."""
    try:
        torch._int_mm(torch.zeros(1, 8, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.int8))
    except RuntimeError:
        return False
    return True


def u8s8_at_m1(rec: QuantLinear) -> bool:
    """Whether an M that can be 1 (a static 1, or a symbolic M) takes u8s8 rather than s8s8 `_int_mm`.

    On VNNI CPUs without AMX, where torch's `_int_mm` takes uint8: the form torchao itself runs there, and
    measured faster at M = 1 (0.97 vs 1.12 ms at 4096^2, the table above). The M = 1 garbage once blamed on
    s8s8 there was a stride-0 leading dimension (`inductor_fixes.dense_unit_strides`); s8s8 with dense operands
    was exact at M = 1, 2, 3, 17 under oneDNN's AVX512_CORE_VNNI ISA cap (an AMX Xeon, torch 2.11), but
    no VNNI-only CPU has run it since, so M = 1 keeps the form that was right there.
    """
    m1 = not (is_static(rec.m) and int(rec.m) >= 2)
    return m1 and cpu_int8_isa() == "vnni" and int_mm_takes_uint8()


def _supports_cpu_s8s8(rec: QuantLinear) -> str | None:
    why = int8_operands(rec)
    if why:
        return why
    if u8s8_at_m1(rec):
        return "an M that can be 1 takes u8s8 on VNNI CPUs without AMX (u8s8_at_m1)"
    return None


def weight_is_frozen(rec: QuantLinear) -> bool:
    """Whether Inductor's freezing will turn the weight into a constant (so ops on it fold at compile time).

    qlower's pass runs before freezing: the weight is still a placeholder. It becomes a constant when freezing
    is on for this inference compile and Dynamo lifted it as a parameter (AOTAutograd puts parameters first:
    `TracingContext.params_flat`). `options={"freezing": True}` alone does not freeze nn.Module parameters
    (Dynamo reads the global config): then params_flat is empty and this says False.
    """
    from torch._inductor import config

    if not config.freezing or torch.is_grad_enabled():
        return False
    node = rec.weight
    if node.op == "get_attr":
        return True
    ctx = torch._guards.TracingContext.try_get()
    params = getattr(ctx, "params_flat", None) if ctx is not None else None
    if node.op != "placeholder" or not params:
        return False
    placeholders = [n for n in node.graph.nodes if n.op == "placeholder"]
    return placeholders.index(node) < len(params)


def weight_is_stored(rec: QuantLinear) -> bool:
    """Whether the weight node is itself a graph input or attribute: Inductor then passes the caller's own
    tensor to the op on every call, with its version counter, so a run-time cache can hit and can see
    in-place writes. A view of one (slice, transpose) reaches the op as `reinterpret_tensor`, a new tensor
    each call that shares the storage but not the version counter; a computed weight is new every call."""
    return isinstance(rec.weight, fx.Node) and rec.weight.op in ("placeholder", "get_attr")


# The u8 qlinear on a weight prepacked at compile time (freezing) against s8s8 `_int_mm` and bf16 F.linear on
# the AMX Xeon (2 threads; BENCHMARKS.md, "CPU, dynamic_int8", "AMX Xeon (the AMX-INT8 tier)", has the table and
# its command): M = 16-128 1.3-1.8x of bf16 where `_int_mm` runs 0.98-1.28x, M = 1024 1.07-1.17x. The cached
# prepack (no freezing) compares the weight's bytes every call, which costs more than AMX's GEMM saves
# (0.52-0.98x of bf16 at M = 16-1024): VNNI CPUs without AMX only.
QLINEAR_FROZEN_ISAS = ("vnni", "amx")
QLINEAR_ISA_NAMES = {"vnni": "VNNI CPUs without AMX", "amx": "AMX CPUs"}


def _qlinear_u8_rules(rec: QuantLinear, isas: tuple[str, ...] = ("vnni",)) -> str | None:
    """What both u8 qlinear lowerings need: int8 symmetric operands, a CPU of `isas` (where each was measured
    faster), oneDNN, M >= 2."""
    why = int8_operands(rec)
    if why:
        return why
    isa = cpu_int8_isa()
    if isa not in isas:
        return f"measured faster on {' and '.join(QLINEAR_ISA_NAMES[i] for i in isas)} only (this CPU: {isa})"
    if not torch.backends.mkldnn.is_available():
        return "oneDNN is not available"
    aq = rec.act_quant
    assert aq is not None
    if aq.zero_point is not None or rec.weight_zero_point is not None:
        return "zero points (the _int_mm lowerings compensate them)"
    if is_static(rec.m) and int(rec.m) < CPU_U8_MIN_M:
        return f"M={int(rec.m)} < {CPU_U8_MIN_M}: the _int_mm GEMV path is faster"
    return None


def _supports_cpu_qlinear(rec: QuantLinear) -> str | None:
    why = _qlinear_u8_rules(rec, QLINEAR_FROZEN_ISAS)
    if why:
        return why
    if not weight_is_frozen(rec):
        return "the weight is not a constant (needs freezing): a prepacked weight must fold at compile time"
    return None


def _supports_cpu_qlinear_cached(rec: QuantLinear) -> str | None:
    why = _qlinear_u8_rules(rec)
    if why:
        return why
    if not cpu_prepack.enabled():
        return f"the run-time prepack cache is off ({cpu_prepack.ENV_SWITCH}=0)"
    if V.aot_compilation:
        return "AOTInductor: the package has no Python run time for the cache (the C shims cover _int_mm)"
    if not weight_is_stored(rec):
        return "the weight is a view or computed in the graph (a new tensor every call: a cache cannot hit)"
    if not (is_static(rec.k) and is_static(rec.n)) or rec.k * rec.n < CPU_CACHED_MIN_WEIGHT:
        return f"K*N={rec.k}*{rec.n} < 2^22: the cached qlinear's fixed cost outweighs the re-pack it saves"
    return None


def _supports_cpu_u8s8(rec: QuantLinear) -> str | None:
    why = int8_operands(rec)
    if why:
        return why
    isa = cpu_int8_isa()
    if isa != "vnni":
        return f"u8s8 only pays on VNNI CPUs without AMX (this CPU: {isa})"
    if not int_mm_takes_uint8():
        return f"torch {torch.__version__}'s CPU _int_mm takes int8 activations only"
    if u8s8_at_m1(rec):
        return None
    if is_static(rec.m) and int(rec.m) < CPU_U8_MIN_M:
        return f"M={int(rec.m)} < {CPU_U8_MIN_M}: s8s8 takes a GEMV path as fast, without column sums"
    if rec.k < CPU_U8_MIN_K:
        return f"K={rec.k} < {CPU_U8_MIN_K}: s8s8 measured faster (its weight re-pack only hurts at large K)"
    return None


# qlower::int8_gemm (lowerings/kernels/csrc/int8_gemm.cpp): the int8 weight read once as stored (no per-call
# re-pack), AVX512-VNNI / AVX-512 / AVX2 dot products; `_int_mm` above INT8_GEMM_MAX_M rows. Against s8s8
# `_int_mm` on the 2-vCPU AMX Xeon (2 threads, one op call each; BENCHMARKS.md, "CPU, dynamic_int8:
# qlower::int8_gemm", has the table and its command): M = 1 1.5-2.7x faster, M = 4 1.1-1.6x, M = 8 0.8-1.05x,
# M = 16 about 0.5x (oneDNN runs AMX tiles there). On VNNI CPUs without AMX `_int_mm` has no tiles either, so
# the crossover is at least as high; 4 is kept there too.
INT8_GEMM_MAX_M = 4
# On a VNNI CPU without AMX (an AVX512-BF16/VNNI EPYC, 2 threads, `python scripts/bench_cpu_int8_gemm.py
# --threads 2 --shapes 4096x4096,4096x14336,14336x4096 --ms 1,2,4,8,16`; BENCHMARKS.md, "CPU, dynamic_int8:
# qlower::int8_gemm on an AVX512-VNNI EPYC") the op lost to u8s8 `_int_mm` at M = 1 (583 vs 344 us at 4096^2:
# oneDNN's GEMV path) and at M = 16 (2384 vs 2205 us), and won from M = 2 to 8 (1.3-2.1x of u8s8, 2-3.9x of
# s8s8): a static M takes it there only.
INT8_GEMM_VNNI_M: tuple[int, int] = (2, 8)
INT8_GEMM_ISA_ENV = "QLOWER_CPU_INT8_GEMM_ISA"  # forces the kernels' level: scalar, avx2, avx512, avx512_vnni


def _supports_int8_gemm(rec: QuantLinear) -> str | None:
    why = int8_operands(rec)
    if why:
        return why
    if rec.weight_layout != "NK":
        return "a [K, N] weight: the kernel reads weight rows along K (it would copy the weight every call)"
    if INT8_GEMM_MAX_M < 1:
        return "INT8_GEMM_MAX_M = 0: the op serves no M"
    vnni_u8 = cpu_int8_isa() == "vnni" and int_mm_takes_uint8()
    if not is_static(rec.m) and vnni_u8:
        return "a symbolic M on a VNNI CPU without AMX keeps u8s8 `_int_mm` (the op's larger-M call is s8s8)"
    lo, hi = INT8_GEMM_VNNI_M if vnni_u8 else (1, INT8_GEMM_MAX_M)
    if is_static(rec.m) and (int(rec.m) > hi or 0 < int(rec.m) < lo):  # M = 0: the op's empty output
        where = "a VNNI CPU without AMX (INT8_GEMM_VNNI_M)" if vnni_u8 else "INT8_GEMM_MAX_M"
        return f"M={int(rec.m)} outside [{lo}, {hi}]: oneDNN's `_int_mm` is faster on {where}"
    if not native.compiler_available():
        return "no C++ compiler on PATH to build the kernel (lowerings/kernels/native.py)"
    return None


def int8_gemm_tier(rec: QuantLinear) -> str:
    """The ISA level of the op's own kernels, and where a symbolic M hands over to `_int_mm`."""
    isa = native.int8_gemm_isa()
    return isa if is_static(rec.m) else f"{isa} up to M = {INT8_GEMM_MAX_M}, `_int_mm` above"


DYNAMIC_INT8_GEMM_CPU = Lowering(
    name="qlower.int8_gemm",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_int8_gemm,
    emit=lambda graph, rec, preference: make_emit_int8_gemm(INT8_GEMM_MAX_M)(graph, rec, preference),
    doc="qlower's int8 GEMM for small M (the weight read once, as stored), `_int_mm` above; fused rescale",
    detail=int8_gemm_tier,
)


DYNAMIC_INT8_QLINEAR_CPU = Lowering(
    name="onednn.qlinear_pointwise.u8",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_cpu_qlinear,
    emit=emit_qlinear_u8,
    doc="oneDNN u8s8 qlinear on a weight prepacked at compile time (freezing), per-token scale in the epilogue",
)


DYNAMIC_INT8_QLINEAR_CACHED_CPU = Lowering(
    name="qlower.qlinear_u8_cached",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_cpu_qlinear_cached,
    emit=emit_qlinear_u8_cached,
    doc="oneDNN u8s8 qlinear on a weight packed at the first call and cached while unchanged (no freezing)",
)


DYNAMIC_INT8_INT_MM_U8_CPU = Lowering(
    name="aten._int_mm.u8s8",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_cpu_u8s8,
    emit=make_emit_int_mm_u8(),
    doc="oneDNN u8s8 GEMM (VNNI without AMX): shifted activation, column-sum compensation in the rescale",
)


DYNAMIC_INT8_INT_MM_CPU = Lowering(
    name="aten._int_mm",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_cpu_s8s8,
    emit=emit_int_mm,
    doc="oneDNN int8 GEMM between the fused activation quantize and the fused rescale",
)


def register() -> None:
    register_backend(
        "cpu",
        [
            WOQ_INT8_PACKED_CPU,
            WOQ_INT8_PACKED_BY_M_CPU,
            WOQ_INT8_SCRATCH_MM_CPU,
            WOQ_INT8_GEMM_CPU,
            WOQ_INT8_DEQUANT_MM,
            DYNAMIC_INT8_GEMM_CPU,
            DYNAMIC_INT8_QLINEAR_CPU,
            DYNAMIC_INT8_QLINEAR_CACHED_CPU,
            DYNAMIC_INT8_INT_MM_U8_CPU,
            DYNAMIC_INT8_INT_MM_CPU,
            DYNAMIC_INT8_EMULATED,
            MX_EMULATED,
        ],
        describe=lambda device: f"{device} ({torch.backends.cpu.get_cpu_capability()})",
        replace=True,
        # read by cpu_int8_isa, the prepack cache rule, cpu_woq_isa; the woq_int8_gemm path the table assumes
        env=(
            "QLOWER_CPU_INT8_ISA",
            cpu_prepack.ENV_SWITCH,
            WOQ_GEMM_ISA_ENV,
            WOQ_GEMM_PATH_ENV,
            INT8_GEMM_ISA_ENV,
        ),
    )
