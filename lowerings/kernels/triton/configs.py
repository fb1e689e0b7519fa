"""Launch configurations per (M bucket, K, N), and where qlower's kernels stop winning.

Pure Python (no Triton import), so `supports` can read the crossovers on machines without Triton. The tables
(`WOQ_INT8_TUNED`, `DYNAMIC_INT8_TUNED`) are data: one file per GPU under tuned/ (loaded by tuned.py), holding
what that device's sweep measured fastest and the command that regenerates them; shapes and devices they do not
cover fall back to per-bucket rules. M is bucketed to the next power of two: configs are chosen at compile time
for a static M; a symbolic M gets `dynamic_plan`, one launch per M range with its grid gated by M, so each M runs
the kernel a static M there would.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from qlower.lowerings.kernels.triton.tuned import STAND_IN, TunedTable


@dataclass(frozen=True)
class KernelConfig:
    """One launch: which kernel, its tile, and Triton's warps / pipeline stages."""

    # "gemv" (FMA, woq-int8 only), "mm" (tensor cores), "tma" (Hopper TMA, persistent), "decode"
    # (`woq_decode_kernel`, woq-int8 only, static M: FMA, or swap-AB tensor cores when `swap_ab`) or "limbs"
    # (`woq_limbs`, woq-int8 only, static M, K <= 2**16: x as three int8 digit planes on int8 tensor cores)
    kernel: str
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    group_m: int = 8
    swap_ab: bool = False
    # int8 -> operand dtype in `gemv` / `mm`: I2F (0), the fp32 magic number (1), or inline PTX straight to
    # bf16/fp16 on 4 (2) or 2 (3: swap-AB wgmma) elements per asm call (`mm` on CUDA; 1 elsewhere, see
    # int8.ops._conversion_here)
    fast_cvt: int = 1
    progs_per_sm: int = 1  # "tma": a persistent grid of this many programs per SM
    cvt: int = 1  # "decode": int8 -> fp32 by the magic number (1) or inline PTX (2); 3: the dot path to bf16
    acc3: bool = False  # "decode" FMA at BLOCK_M 1: a [BLOCK_N, BLOCK_K] accumulator reduced once at the end

    def __str__(self) -> str:
        if self.kernel == "decode":  # the names the comments below quote ("fma 1x4x1024 w2 s1 cvt2 acc3")
            s = f"{'dot' if self.swap_ab else 'fma'} {self.block_m}x{self.block_n}x{self.block_k} "
            return s + f"w{self.num_warps} s{self.num_stages} cvt{self.cvt}" + (" acc3" if self.acc3 else "")
        tags = [
            f"{self.kernel} {self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}"
        ]
        if self.split_k > 1:
            tags.append(f"splitk{self.split_k}")
        if self.swap_ab:
            tags.append("swap")
        if self.kernel == "tma":
            tags.append(f"persistent x{self.progs_per_sm}")
        if self.group_m != 8 and self.kernel in ("mm", "tma", "limbs"):
            tags.append(f"group{self.group_m}")
        if self.kernel == "gemv" or self.fast_cvt != 1:
            tags.append({0: "i2f", 1: "fastcvt", 2: "cvt2", 3: "cvt3"}[int(self.fast_cvt)])
        return " ".join(tags)


def gemv(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3, split_k: int = 1, fast: int = 1):
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
    fast: int = 1,
) -> KernelConfig:
    return KernelConfig("mm", bm, bn, bk, warps, stages, split_k, group_m, swap, fast)


def tma(
    bm: int,
    bn: int,
    bk: int,
    warps: int = 4,
    stages: int = 3,
    progs_per_sm: int = 1,
    *,
    swap: bool = False,
    fast: int = 1,
    group_m: int = 8,
) -> KernelConfig:
    """Hopper GEMM fed by TMA (int8/hopper.py), persistent: int8 x int8, or woq-int8 (`fast` as in `mm`; `swap`
    is refused: on sm_90 it lost to the pointer tile at every swept point and was removed); the launcher
    falls back to `mm` where TMA's alignment rules do not hold."""
    return KernelConfig(
        "tma",
        bm,
        bn,
        bk,
        warps,
        stages,
        group_m=group_m,
        swap_ab=swap,
        fast_cvt=fast,
        progs_per_sm=progs_per_sm,
    )


def decode_fma(
    bm: int, bn: int, bk: int, warps: int = 4, stages: int = 1, *, cvt: int = 2, acc3: bool = False
) -> KernelConfig:
    """`woq_decode_kernel` on CUDA cores (woq_decode.py): a weight tile converted once for all BM <= 4 rows.
    cvt 2 (inline PTX) falls back to cvt 1 off CUDA (the interpreter), see int8.ops._launch."""
    return KernelConfig("decode", bm, bn, bk, warps, stages, group_m=1, cvt=cvt, acc3=acc3)


def decode_dot(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 4, *, cvt: int = 2) -> KernelConfig:
    """`woq_decode_kernel` on swap-AB tensor cores: acc^T = W @ x^T, the weight read once for all M <= BM."""
    return KernelConfig("decode", bm, bn, bk, warps, stages, group_m=1, swap_ab=True, cvt=cvt)


def limbs(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3) -> KernelConfig:
    """`woq_limb_mm_kernel` (woq_limbs.py): swap-AB, BM activation rows by BN weight rows per program."""
    return KernelConfig("limbs", bm, bn, bk, warps, stages)


# The named configs below are the winners the tuned tables (tuned/*.json) pick most, and what the rules give off
# the tables (names as `KernelConfig.__str__` prints them). M = 1, "decode": the FMA tile, 16 columns where
# N > K; where K >= N, 4 rows on 2 warps with a 2-D accumulator (1024 programs at N = 4096).
DECODE_FMA_WIDE = decode_fma(1, 16, 512)  # `fma 1x16x512 w4 s1 cvt2`
DECODE_FMA_LONG_K = decode_fma(1, 4, 1024, warps=2, acc3=True)  # `fma 1x4x1024 w2 s1 cvt2 acc3`
# M 2..16: the plain 16-row tile with int8 -> bf16 by inline PTX (fast=2), weight as the MMA's B operand
# (mma.sync): 32 columns where K >= N, 64 where N > K. At M = 2 the tuned tables pick the FMA decode tile on
# 2 rows.
MM16_NARROW_PTX = mm(16, 32, 256, 4, 4, fast=2)
MM16_WIDE_PTX = mm(16, 64, 256, 4, 4, fast=2)

# woq-int8 on the TMA kernel (weight as the MMA's B operand, converted in registers by inline PTX; 2 programs
# per SM); falls back to WOQ_TMA_FALLBACK where TMA cannot serve (int8.ops._tma_unsupported)
WOQ_TMA = tma(128, 128, 64, 4, 4, progs_per_sm=2, fast=2)

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def m_bucket(m: int) -> int:
    """The smallest bucket >= m (the largest bucket for anything bigger)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return M_BUCKETS[-1]


# dynamic-int8 at M >= 1024 on sm_90: the persistent TMA kernel, 128x128x128, 4 warps, 3 stages, 2 programs per
# SM (one's epilogue under the other's main loop), Triton-flattened tile loop and a two-half TMA store; buckets
# <= 512 keep `mm` (BENCHMARKS.md, "CUDA, dynamic_int8").
TMA_LARGE_M = tma(128, 128, 128, 4, 3, progs_per_sm=2)
TMA_MIN_BUCKET = 1024

_FIELDS = {f.name: f.type for f in dataclasses.fields(KernelConfig)}
KERNELS = ("gemv", "mm", "tma", "decode", "limbs")


def config_from_fields(fields: dict[str, Any]) -> KernelConfig:
    """A data file's config (KernelConfig's fields by name; defaults for those left out), checked."""
    unknown = set(fields) - set(_FIELDS)
    if unknown:
        raise ValueError(f"tuned config {fields}: unknown fields {sorted(unknown)}")
    if fields.get("kernel") not in KERNELS:
        raise ValueError(f"tuned config {fields}: kernel must be one of {KERNELS}")
    for name, value in fields.items():
        if name != "kernel" and type(value) is not (bool if _FIELDS[name] == "bool" else int):
            raise ValueError(f"tuned config {fields}: {name} = {value!r} is not {_FIELDS[name]}")
    return KernelConfig(**fields)


# Key: (M bucket, K, N). Regenerate: the `regenerate` command of each table (its `--out` folder then holds the
# data file to replace the device's, and its output prints each winner as `TABLE (family, m, k, n): config`).
# A split-K entry accumulates in fp32 by atomics into a zeroed buffer, then casts (woq_decode's semaphore split
# would need a persistent zeroed counter buffer, which a functional op cannot keep).
WOQ_INT8_TUNED = TunedTable.from_files("woq_int8", config_from_fields)
DYNAMIC_INT8_TUNED = TunedTable.from_files("dynamic_int8", config_from_fields)
# The stand-in device's tables as dicts (the tests set entries in them): what the tables answer from. The
# knobs the tuners and benchmarks change are this module's names (scripts import
# qlower.lowerings.kernels.triton.configs; the tuner writes through `WOQ_INT8_TUNED.writable()`).
WOQ_INT8_TABLE = WOQ_INT8_TUNED.writable(STAND_IN)
DYNAMIC_INT8_TABLE = DYNAMIC_INT8_TUNED.writable(STAND_IN)


def _woq_decode_rule(bucket: int, k: int, n: int) -> KernelConfig | None:
    """Static M <= 16 off the table: the M = 1 FMA kernel or the 16-row tile that won the sweeps (None: M > 16).

    M = 1: 1x4x1024 acc3 on 2 warps (over 1x8x1024 on 4 warps) won both measured shapes with
    K >= N (4096->4096, 14336->4096), 1x16x512 the one with N > K (4096->14336). With N not larger than K,
    narrow tiles give many programs (1024 at N = 4096 on 132 SMs, vs 256 for 16 rows) and each walks a long
    K, where the 2-D accumulator (one reduction at the end instead of one per step) pays off; with N = 14336
    there are programs enough either way. K = N itself was measured (acc3 won), so the switch is at K >= N
    rather than K >= 2N; nothing was measured between K = N and N = 3.5 K.
    M 2..16: the plain 16-row `mm` tile with the PTX conversion won every measured shape (MM16_NARROW_PTX; its
    16-row tile serves any M <= 16 alike, so buckets 2 and 8 follow 4 and 16): 32 columns where K >= N, 64
    where N > K.
    """
    if bucket == 1:
        return DECODE_FMA_LONG_K if k >= n else DECODE_FMA_WIDE
    if bucket <= 16:
        return _mm16_ptx(k, n)
    return None


def _mm16_ptx(k: int, n: int) -> KernelConfig:
    """M 2..16 (static, or dynamic M's skinny launch): 32 columns where K >= N, 64 where N > K."""
    return MM16_NARROW_PTX if k >= n else MM16_WIDE_PTX


def _woq_rule(bucket: int, k: int, n: int) -> KernelConfig:
    """Shapes the sweep did not cover: the configs that were good on the swept (K, N) of each side of N = K.
    Pointer kernels up to M = 256 (they also serve dynamic M's skinny launch); above, the TMA tile that won every
    swept M >= 1024 (static M only; it falls back to its pointer twin where TMA cannot serve).

    M 32..256 (the sweep of the M 32..256 table entries): a long K (>= 8192) above N splits K 4 ways
    (14336->4096: 29.8 / 39.5 / 56.6 us at M = 32 / 64 / 128 against 47.1 / 47.1 / 59.0 unsplit); the 128-row
    swap-AB tile runs 3 stages where N > K (4096->14336 at M = 128: 38.3 against 47.9 us at 4 stages;
    4096->6144 at M = 256: 36.9 against 47.0).
    """
    if bucket == 1:
        return gemv(1, 8, 1024)
    if bucket <= 16:
        return _mm16_ptx(k, n)
    wide = n > 8192
    split = k > n and k >= 8192  # few N tiles, a long K: fill the SMs by splitting K
    if bucket <= 32:
        return mm(32, 64, 256, 4, 4, split_k=4 if split else 1, fast=2)
    if bucket <= 64:  # the PTX conversions, 2 elements per call on the swap-AB register operand
        if split:
            return mm(64, 64, 128, 4, 4, swap=True, split_k=4, fast=3)
        return mm(64, 64, 128, 4, 3, swap=True, fast=3) if wide else mm(32, 64, 256, 4, 4, fast=2)
    if bucket <= 128:
        if split:
            return mm(128, 64, 128, 4, 3, swap=True, split_k=4, fast=3)
        return (
            mm(128, 64, 128, 4, 3, swap=True, fast=3) if n > k else mm(64, 64, 128, 4, 4, swap=True, fast=3)
        )
    if bucket <= 256:
        if wide:
            return WOQ_TMA
        return mm(128, 64, 128, 4, 3 if n > k else 4, swap=True, fast=3)
    return WOQ_TMA


def _dynamic_rule(bucket: int, k: int, n: int) -> KernelConfig:
    if bucket <= 16:
        return mm(16, 64, 256, 4, 4, swap=True)
    if bucket <= 64:
        return mm(64, 128, 256, 4, 4, swap=True)
    if bucket <= 128:  # the M=128 sweep: tiles small enough to give every SM work at N = 4096
        return mm(64, 128, 128, 4, 4) if n > 8192 else mm(64, 64, 256, 4, 4, swap=True)
    if bucket <= 256:
        return mm(128, 128, 128, 8, 3)
    if bucket < TMA_MIN_BUCKET:
        return mm(128, 256, 128, 8, 4)
    return TMA_LARGE_M


def woq_int8_config(m: int, k: int, n: int, device: str | None = None) -> KernelConfig:
    """Static M: the device's table (`device`: a name, None: the current device), else the decode rule
    (M <= 16), else the per-bucket `mm` / GEMV rule. No entry or rule names a "limbs" config now (it stays
    for sweeps; the kernel needs K <= woq_limbs.MAX_K)."""
    b = m_bucket(m)
    return WOQ_INT8_TUNED.get((b, k, n), device) or _woq_decode_rule(b, k, n) or _woq_rule(b, k, n)


def dynamic_int8_config(m: int, k: int, n: int, device: str | None = None) -> KernelConfig:
    b = m_bucket(m)
    return DYNAMIC_INT8_TUNED.get((b, k, n), device) or _dynamic_rule(b, k, n)


# What a "tma" config runs where TMA cannot (not sm_90, unaligned rows or base): the best `mm` (dynamic-int8;
# woq-int8's large-M tile).
TMA_FALLBACK = mm(128, 256, 128, 8, 4)
WOQ_TMA_FALLBACK = mm(128, 128, 64, 4, 4, fast=2)

# One dynamic-M launch: rows lo..hi (hi None: no upper end) get `config`.
MRange = tuple[int, "int | None", KernelConfig]


def dynamic_plan(
    static_config, table: TunedTable, k: int, n: int, device: str | None = None, max_m: int | None = None
) -> list[MRange]:
    """A symbolic M's launches: per M bucket the config a static M in it gets (`static_config(m, k, n, device)`),
    up to `max_m` (None: every M; the last range open-ended). Fewer launches, since each costs host time
    outside CUDA graphs: a bucket the device's `table` did not measure takes the next measured bucket's config
    (where any bucket of this (K, N) was measured), and consecutive buckets with one config merge. M = 1 is
    the exception: it always gets the static M = 1 config, never a larger bucket's (the one-row decode tile
    beat the two-row one at M = 1 on four shapes: BENCHMARKS.md, "Whole decoder, CUDA: changing batch under
    CUDA graphs"). Split-K configs stay split: the launcher gives a gated split-K range an accumulator
    and a cast of its own (`int8.ops._launch_all`)."""
    tops = [min(b, max_m) if max_m is not None else b for b in M_BUCKETS]
    tops = sorted(set(tops))
    measured = [t for t in tops if table.get((t, k, n), device) is not None]
    plan: list[list] = []
    lo = 1
    for i, top in enumerate(tops):
        rep = top if top == 1 else next((t for t in measured if t >= top), top)
        cfg = static_config(rep, k, n, device)
        end = None if (max_m is None and i == len(tops) - 1) else top
        if plan and plan[-1][2] == cfg:
            plan[-1][1] = end
        else:
            plan.append([lo, end, cfg])
        lo = top + 1
    return [(a, b, c) for a, b, c in plan]
