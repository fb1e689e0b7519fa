"""Launch configurations per (M bucket, K, N), and where qlower's kernels stop winning.

Pure Python (no Triton import), so `supports` can read the crossovers on machines without Triton. The table
holds what the H200 sweep (`scripts/bench_cuda_kernels.py --sweep`) measured fastest; shapes it did not
cover fall back to per-bucket rules. M is bucketed to the next power of two: configs are chosen at compile
time for a static M, and for a dynamic M the op launches a skinny and a tiled kernel whose grids are gated
by M (one of the two has an empty grid and is skipped).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelConfig:
    """One launch: which kernel, its tile, and Triton's warps / pipeline stages."""

    kernel: str  # "gemv" (FMA, woq-int8 only), "mm" (tensor cores) or "tma" (Hopper TMA, dynamic-int8 only)
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    group_m: int = 8
    swap_ab: bool = False
    fast_cvt: bool = True
    progs_per_sm: int = 1  # "tma": a persistent grid of this many programs per SM

    def __str__(self) -> str:
        tags = [
            f"{self.kernel} {self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"
        ]
        if self.split_k > 1:
            tags.append(f"splitk{self.split_k}")
        if self.swap_ab:
            tags.append("swap")
        if self.kernel == "tma":
            tags.append(f"persistent x{self.progs_per_sm}")
        if self.kernel == "gemv" or not self.fast_cvt:
            tags.append("fastcvt" if self.fast_cvt else "i2f")
        return " ".join(tags)


def gemv(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3, split_k: int = 1, fast: bool = True):
    return KernelConfig("gemv", bm, bn, bk, warps, stages, split_k, 1, False, fast)


def mm(
    bm: int,
    bn: int,
    bk: int,
    warps: int = 4,
    stages: int = 3,
    *,
    split_k: int = 1,
    group_m: int = 8,
    swap: bool = False,
    fast: bool = True,
) -> KernelConfig:
    return KernelConfig("mm", bm, bn, bk, warps, stages, split_k, group_m, swap, fast)


def tma(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3, progs_per_sm: int = 1) -> KernelConfig:
    """Hopper int8 GEMM fed by TMA (int8_hopper.py), persistent; the launcher falls back to `mm` where TMA's
    alignment rules do not hold."""
    return KernelConfig("tma", bm, bn, bk, warps, stages, progs_per_sm=progs_per_sm)


M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def m_bucket(m: int) -> int:
    """The smallest bucket >= m (the largest bucket for anything bigger)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return M_BUCKETS[-1]


# Measured winners on H200 (torch 2.11, Triton 3.6, bf16, 8 rotating weight sets, CUDA-graph replay; 2026-11-30
# sweep of scripts/bench_cuda_kernels.py --sweep). Key: (M bucket, K, N); comment: kernel time in us.
WOQ_INT8_TABLE: dict[tuple[int, int, int], KernelConfig] = {
    (1, 4096, 4096): gemv(1, 8, 1024),  # 9.1
    (4, 4096, 4096): mm(16, 32, 256, 4, 4, swap=True),  # 12.9
    (16, 4096, 4096): mm(16, 32, 256, 4, 4, swap=True),  # 12.1
    (64, 4096, 4096): mm(32, 64, 256, 4, 4, swap=True),  # 17.5
    (256, 4096, 4096): mm(128, 64, 128, 4, 4),  # 31.4
    (1024, 4096, 4096): mm(128, 128, 64, 8, 4),  # 77.9
    (4096, 4096, 4096): mm(128, 128, 64, 8, 4),  # 302.3
    (1, 4096, 14336): mm(16, 128, 256, 4, 4),  # 23.7 (second sweep; gemv 1x32x256: 24.0-24.5)
    (4, 4096, 14336): mm(16, 64, 128, 4, 5, swap=True),  # 26.7
    (16, 4096, 14336): mm(16, 64, 256, 4, 4),  # 21.9
    (64, 4096, 14336): mm(64, 64, 128, 4, 4),  # 35.9
    (256, 4096, 14336): mm(128, 128, 64, 8, 3),  # 76.5
    (1024, 4096, 14336): mm(128, 128, 64, 8, 4),  # 294.9
    (4096, 4096, 14336): mm(128, 128, 64, 8, 4),  # 1096.0
}
# Second H200 run (scripts/gpu_exp_int8.py, 2026-11-30): of 16 TMA variants, 128x128x128, 4 warps, 3 stages,
# 2 persistent programs per SM (one's epilogue under the other's main loop), Triton-flattened tile loop and a
# two-half TMA store won at M >= 1024 (1223-1407 TOP/s; 128x256 tiles 1263-1290). At M=256 it lost to `mm`
# (32.8 vs 31.5 us), so buckets <= 512 keep `mm`.
TMA_LARGE_M = tma(128, 128, 128, 4, 3, progs_per_sm=2)
TMA_MIN_BUCKET = 1024
DYNAMIC_INT8_TABLE: dict[tuple[int, int, int], KernelConfig] = {
    (1, 4096, 4096): mm(16, 64, 512, 4, 4, swap=True),  # 9.2
    (4, 4096, 4096): mm(16, 64, 512, 4, 4, swap=True),  # 8.1
    (16, 4096, 4096): mm(16, 32, 512, 4, 4, swap=True),  # 8.3
    (64, 4096, 4096): mm(64, 64, 256, 4, 4, swap=True),  # 10.1
    (256, 4096, 4096): mm(64, 128, 128, 4, 4),  # 15.3
    (1024, 4096, 4096): TMA_LARGE_M,  # mm(128, 256, 128, 8, 3): 34.4
    (4096, 4096, 4096): TMA_LARGE_M,  # 99.5 (mm(128, 256, 128, 8, 3): 130.9-132.0)
    (1, 4096, 14336): mm(16, 128, 256, 4, 4, swap=True),  # 19.4
    (4, 4096, 14336): mm(16, 128, 256, 4, 4, swap=True),  # 17.9
    (16, 4096, 14336): mm(16, 64, 256, 4, 4, swap=True),  # 17.4
    (64, 4096, 14336): mm(64, 128, 256, 4, 4, swap=True),  # 18.7
    (256, 4096, 14336): mm(128, 128, 128, 8, 3),  # 30.7
    (1024, 4096, 14336): TMA_LARGE_M,  # 98.3 (mm(128, 256, 128, 8, 4): 128.7-133.6)
    (4096, 4096, 14336): TMA_LARGE_M,  # 342.0 (mm(128, 256, 128, 8, 4): 442.7-442.8)
}

# Dynamic M (explicit TRITON preference only): the skinny kernel serves M <= DYNAMIC_M_SPLIT, the tiled one above.
DYNAMIC_M_SPLIT = 16
_DYNAMIC_LARGE_BUCKET = 1024


def _woq_rule(bucket: int, k: int, n: int) -> KernelConfig:
    """Shapes the sweep did not cover: the configs that were good on both swept (K, N)."""
    if bucket == 1:
        return gemv(1, 8, 1024)
    if bucket <= 16:
        return mm(16, 64, 256, 4, 4)
    if bucket <= 64:
        return mm(64, 64, 128, 4, 4)
    if bucket <= 256:
        return mm(128, 128, 64, 8, 3)
    return mm(128, 128, 64, 8, 4)


def _dynamic_rule(bucket: int, k: int, n: int) -> KernelConfig:
    if bucket <= 16:
        return mm(16, 64, 256, 4, 4, swap=True)
    if bucket <= 64:
        return mm(64, 128, 256, 4, 4, swap=True)
    if bucket <= 256:
        return mm(128, 128, 128, 8, 3)
    if bucket < TMA_MIN_BUCKET:
        return mm(128, 256, 128, 8, 4)
    return TMA_LARGE_M


def woq_int8_config(m: int, k: int, n: int) -> KernelConfig:
    b = m_bucket(m)
    return WOQ_INT8_TABLE.get((b, k, n)) or _woq_rule(b, k, n)


def dynamic_int8_config(m: int, k: int, n: int) -> KernelConfig:
    b = m_bucket(m)
    return DYNAMIC_INT8_TABLE.get((b, k, n)) or _dynamic_rule(b, k, n)


# What a "tma" config runs where TMA cannot (not sm_90, unaligned rows or base, dynamic M): the best `mm`.
TMA_FALLBACK = mm(128, 256, 128, 8, 4)


def _no_gemv_or_split(cfg: KernelConfig, fallback: KernelConfig) -> KernelConfig:
    """Dynamic M: one launch covers every M of its side (no per-row GEMV, no split-K epilogue, no persistent
    grid sized from M)."""
    return fallback if (cfg.kernel != "mm" or cfg.split_k > 1) else cfg


def woq_int8_dynamic_configs(k: int, n: int) -> tuple[int, KernelConfig, KernelConfig]:
    small = _no_gemv_or_split(woq_int8_config(DYNAMIC_M_SPLIT, k, n), _woq_rule(DYNAMIC_M_SPLIT, k, n))
    large = _no_gemv_or_split(
        woq_int8_config(_DYNAMIC_LARGE_BUCKET, k, n), _woq_rule(_DYNAMIC_LARGE_BUCKET, k, n)
    )
    return DYNAMIC_M_SPLIT, small, large


def dynamic_int8_dynamic_configs(k: int, n: int) -> tuple[int, KernelConfig, KernelConfig]:
    small = _no_gemv_or_split(
        dynamic_int8_config(DYNAMIC_M_SPLIT, k, n), _dynamic_rule(DYNAMIC_M_SPLIT, k, n)
    )
    large = _no_gemv_or_split(dynamic_int8_config(_DYNAMIC_LARGE_BUCKET, k, n), TMA_FALLBACK)
    return DYNAMIC_M_SPLIT, small, large


# Crossovers under AUTO: the largest static M at which qlower's kernel was measured at least as fast as the next
# lowering in the CUDA ranking (None: it won on the whole grid measured). woq-int8 on H200, 4096->4096: Triton
# 17.5 us vs stock dequant + cuBLAS ~27 us at M=64, but 77.9 vs 63.5 us at M=1024 and 302 vs 201 us at M=4096
# (the mixed-dtype tensor-core loop reaches ~450 TFLOP/s, cuBLAS bf16 ~800); 4096->14336 at M=4096: Triton
# 1096 us vs dequant_mm 649 us. M=128/256 were not measured side by side, so the limit is the last measured win. dynamic-int8: int8 tensor cores at ~1090 TOP/s at M=4096
# beat `_int_mm` (cuBLAS, ~860 TOP/s in shared/notes/baselines.md) and the emulated path everywhere measured.
WOQ_INT8_MAX_M: int | None = 64
DYNAMIC_INT8_MAX_M: int | None = None
