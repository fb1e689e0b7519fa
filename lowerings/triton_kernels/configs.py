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

    kernel: str  # "gemv" (FMA, woq-int8 only) or "mm" (tensor cores)
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    group_m: int = 8
    swap_ab: bool = False
    fast_cvt: bool = True

    def __str__(self) -> str:
        tags = [
            f"{self.kernel} {self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"
        ]
        if self.split_k > 1:
            tags.append(f"splitk{self.split_k}")
        if self.swap_ab:
            tags.append("swap")
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


M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def m_bucket(m: int) -> int:
    """The smallest bucket >= m (the largest bucket for anything bigger)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return M_BUCKETS[-1]


# Measured winners (filled from the H200 sweep; key: (M bucket, K, N)).
WOQ_INT8_TABLE: dict[tuple[int, int, int], KernelConfig] = {}
DYNAMIC_INT8_TABLE: dict[tuple[int, int, int], KernelConfig] = {}

# Dynamic M: the skinny kernel serves M <= DYNAMIC_M_SPLIT, the tiled one above it.
DYNAMIC_M_SPLIT = 16
_DYNAMIC_LARGE_BUCKET = 512


def _woq_rule(bucket: int, k: int, n: int) -> KernelConfig:
    if bucket <= 2:
        return gemv(bucket, 16, 512 // bucket, warps=4)
    if bucket <= 16:
        return mm(16, 64, 256, 4, 4, swap=True)
    if bucket <= 64:
        return mm(bucket, 64, 128, 4, 4, swap=bucket < 64)
    if bucket <= 256:
        return mm(64, 128, 128, 4, 4)
    return mm(128, 256, 64, 8, 3)


def _dynamic_rule(bucket: int, k: int, n: int) -> KernelConfig:
    if bucket <= 16:
        return mm(16, 64, 256, 4, 4, swap=True)
    if bucket <= 64:
        return mm(bucket, 64, 256, 4, 4, swap=bucket < 64)
    if bucket <= 256:
        return mm(64, 128, 256, 4, 3)
    return mm(128, 256, 128, 8, 3)


def woq_int8_config(m: int, k: int, n: int) -> KernelConfig:
    b = m_bucket(m)
    return WOQ_INT8_TABLE.get((b, k, n)) or _woq_rule(b, k, n)


def dynamic_int8_config(m: int, k: int, n: int) -> KernelConfig:
    b = m_bucket(m)
    return DYNAMIC_INT8_TABLE.get((b, k, n)) or _dynamic_rule(b, k, n)


def _no_gemv_or_split(cfg: KernelConfig, fallback: KernelConfig) -> KernelConfig:
    """Dynamic M: one launch covers every M of its side (no per-row GEMV, no split-K epilogue)."""
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
    large = _no_gemv_or_split(
        dynamic_int8_config(_DYNAMIC_LARGE_BUCKET, k, n), _dynamic_rule(_DYNAMIC_LARGE_BUCKET, k, n)
    )
    return DYNAMIC_M_SPLIT, small, large


# Crossovers: the largest static M at which qlower's kernel was measured at least as fast as the next lowering
# in the CUDA ranking (None: no limit found on the grid measured).
WOQ_INT8_MAX_M: int | None = None
DYNAMIC_INT8_MAX_M: int | None = None
