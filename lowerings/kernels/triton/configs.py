"""Launch configurations per (M bucket, K, N), and where qlower's kernels stop winning.

Pure Python (no Triton import), so `supports` can read the crossovers on machines without Triton. The tables
(`WOQ_INT8_TUNED`, `DYNAMIC_INT8_TUNED`: data keyed by device name, tuned.py) hold what each device's sweep
measured fastest, with the command that regenerates them; shapes and devices they do not cover fall back to
per-bucket rules. M is bucketed to the next power of two: configs are chosen at compile time for a static M;
a symbolic M gets `dynamic_plan`, one launch per M range with its grid gated by M, so each M runs the kernel a
static M there would.
"""

from __future__ import annotations

from dataclasses import dataclass

from qlower.lowerings.kernels.triton.tuned import H200, TunedTable


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
    # ops._conversion_here)
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
    """Hopper GEMM fed by TMA (int8_hopper.py), persistent: int8 x int8, or woq-int8 (`fast` as in `mm`; `swap`
    is refused: on the H200 it lost to the pointer tile at every swept point and was removed); the launcher
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
    cvt 2 (inline PTX) falls back to cvt 1 off CUDA (the interpreter), see ops._launch."""
    return KernelConfig("decode", bm, bn, bk, warps, stages, group_m=1, cvt=cvt, acc3=acc3)


def decode_dot(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 4, *, cvt: int = 2) -> KernelConfig:
    """`woq_decode_kernel` on swap-AB tensor cores: acc^T = W @ x^T, the weight read once for all M <= BM."""
    return KernelConfig("decode", bm, bn, bk, warps, stages, group_m=1, swap_ab=True, cvt=cvt)


def limbs(bm: int, bn: int, bk: int, warps: int = 4, stages: int = 3) -> KernelConfig:
    """`woq_limb_mm_kernel` (woq_limbs.py): swap-AB, BM activation rows by BN weight rows per program."""
    return KernelConfig("limbs", bm, bn, bk, warps, stages)


# Where the numbers below come from: the compiled woq_int8 rows are in BENCHMARKS.md, "CUDA (H200),
# woq_int8"; the kernel sweeps behind each config (H200, torch 2.11, Triton 3.6, 2026-11-30), their scripts
# and raw output are at git tag lab-archive, written up in `git show lab-archive:BENCHMARKS.md` (the
# sections quoted below as "lab-archive BENCHMARKS.md").

# The M = 1 "decode" winners of the woq M = 1 kernel sweeps (names as `KernelConfig.__str__` prints them)
DECODE_FMA_WIDE = decode_fma(1, 16, 512)  # `fma 1x16x512 w4 s1 cvt2`
# 4 rows on 2 warps per program (1024 programs at N = 4096), in two runs side by side with the 8-row tile, won
# both K >= N shapes: 6.92 / 7.00 vs 7.22 / 7.35 us at 4096^2 and 17.50 / 17.58 vs 17.81 / 17.93 us at
# 14336->4096 (lab-archive BENCHMARKS.md, "woq-int8 at M=1: 4-row tiles on 2 warps")
DECODE_FMA_LONG_K = decode_fma(1, 4, 1024, warps=2, acc3=True)  # `fma 1x4x1024 w2 s1 cvt2 acc3`
# With int8 -> bf16 by inline PTX (fast=2), the plain 16-row tile (weight as the MMA's B operand, mma.sync)
# beat the swap-AB decode kernel at every M <= 16 point: 32 columns where K >= N, 64 where N > K (lab-archive
# BENCHMARKS.md, "The conversion (`kernels._int8_to`, `FAST_CVT` 2 and 3)" and the compiled table after it)
MM16_NARROW_PTX = mm(16, 32, 256, 4, 4, fast=2)
DECODE_FMA_2ROWS_LONG_K = decode_fma(2, 8, 1024, warps=2)  # M = 2, K >= N (the 2026-12-01 sweep below)
DECODE_FMA_2ROWS_WIDE = decode_fma(2, 16, 512)  # M = 2, N > K
MM16_WIDE_PTX = mm(16, 64, 256, 4, 4, fast=2)

# woq-int8 on the TMA kernel (weight as the MMA's B operand, converted in registers by inline PTX; lab-archive
# BENCHMARKS.md, "woq-int8 with TMA-fed operands"); falls back to WOQ_TMA_FALLBACK where TMA cannot serve
# (ops._tma_unsupported)
WOQ_TMA = tma(128, 128, 64, 4, 4, progs_per_sm=2, fast=2)

M_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def m_bucket(m: int) -> int:
    """The smallest bucket >= m (the largest bucket for anything bigger)."""
    for b in M_BUCKETS:
        if m <= b:
            return b
    return M_BUCKETS[-1]


# Measured winners on H200 (torch 2.11, Triton 3.6, bf16, 8 rotating weight sets, CUDA-graph replay; 2026-11-30
# sweeps: `scripts/tune_cuda_kernels.py --sweep`, plus the woq M = 1 "decode" and M 4..4096 kernel sweeps
# kept at git tag lab-archive). Key: (M bucket, K, N); comment: kernel time in us, "was" the entry before,
# timed in the same run.
_H200_WOQ_INT8: dict[tuple[int, int, int], KernelConfig] = {
    (1, 4096, 4096): DECODE_FMA_LONG_K,  # 6.92 (fma 1x8x1024 w4 acc3: 7.22, gemv(1, 8, 1024): 8.8; bf16 13.6)
    # M 4..64 ("PTX" entries, fast=2): the int8 -> bf16 conversion by inline PTX (lab-archive BENCHMARKS.md,
    # "The conversion (`kernels._int8_to`, `FAST_CVT` 2 and 3)"; "was": the entry before, same run)
    (4, 4096, 4096): MM16_NARROW_PTX,  # 9.92 (was decode_dot(16, 32, 256): 10.93; bf16 13.4)
    (16, 4096, 4096): MM16_NARROW_PTX,  # 9.78 (was decode_dot(16, 32, 256): 10.68; bf16 13.5)
    (64, 4096, 4096): mm(32, 64, 256, 4, 4, fast=2),  # 16.24 (was the same tile swap-AB: 17.52; bf16 12.0)
    # M 128 / 256: a sweep of 13 configs per point incl. split-K (lab-archive BENCHMARKS.md, "woq-int8 at
    # M = 64..256: the crossover moved from 64 to 256"); the later PTX sweep moved them to swap-AB with the
    # 2-element PTX conversion (fast=3). Still below bf16 F.linear (13.5 / 16.5 us), above dequant + mm
    # (26.5 / 28.7 us)
    (128, 4096, 4096): mm(
        64, 64, 128, 4, 4, swap=True, fast=3
    ),  # 18.4 (was mm(64, 64, 256, 4, 4, swap=True): 20.7)
    (256, 4096, 4096): mm(
        128, 64, 128, 4, 4, swap=True, fast=3
    ),  # 24.3 (was the same tile through fp32: 27.3)
    # M >= 1024 (served under an explicit TRITON preference; AUTO uses dequant + cuBLAS there) and M=256 at
    # N=14336: TMA-fed operands, 2 programs per SM (lab-archive BENCHMARKS.md, "woq-int8 with TMA-fed
    # operands"; "was": the entry before, same run)
    (1024, 4096, 4096): WOQ_TMA,  # 64.1 (was mm(128, 128, 64, 4, 3, fast=2): 69.5; bf16 46.0)
    (4096, 4096, 4096): WOQ_TMA,  # 237.3 (was mm(128, 128, 64, 4, 3, fast=2): 265.1; bf16 170.7)
    (1, 4096, 14336): DECODE_FMA_WIDE,  # 16.61 (was mm(16, 128, 256, 4, 4): 23.7; bf16 30.5)
    # M 4 / 16, 4096->14336: the int8-limb kernel (woq_limbs.py) held M=4 until the PTX tile beat it
    (4, 4096, 14336): MM16_WIDE_PTX,  # 20.58 (was limbs(16, 64, 256, 4, 4): 25.55; bf16 30.5)
    (16, 4096, 14336): MM16_WIDE_PTX,  # 20.42 (was the same tile through fp32: 22.82; bf16 30.8)
    (64, 4096, 14336): mm(
        64, 64, 128, 4, 4, swap=True, fast=3
    ),  # 30.3 (was the same tile through fp32: 31.1)
    # M >= 128, N = 14336: PTX entries of the PTX sweep ("was" timed in it); the TMA entries as above
    # M=128: the faster 128x128x64 w8 swap tile (41.7 us) gave wrong rows at M > 128 and is refused (ops._launch)
    (128, 4096, 14336): mm(128, 64, 128, 4, 3, swap=True, fast=3),  # 38.3 (the same tile at s4: 47.9)
    (256, 4096, 14336): WOQ_TMA,  # 64.8 (was mm(128, 128, 64, 4, 4, fast=2): 70.5; bf16 42.9)
    (1024, 4096, 14336): WOQ_TMA,  # 242.7 (was mm(128, 128, 64, 4, 4, fast=2): 280.9; bf16 150.5)
    (
        4096,
        4096,
        14336,
    ): WOQ_TMA,  # 858.6 / 889.0 in two runs (was mm(128, 128, 64, 4, 4, fast=2): 1010.5 / 973.8)
    (
        1,
        14336,
        4096,
    ): DECODE_FMA_LONG_K,  # 17.50 (fma 1x8x1024 w4 acc3: 17.81; gemv(1, 8, 1024): 22.1; bf16 31.6)
    # M 4 / 16, 14336->4096: a 2-way K split (fp32 atomics into a zeroed buffer, then a cast) won the second
    # PTX sweep. (woq_decode's "sem" split, faster in the earlier decode-kernel sweep, needs a persistent
    # zeroed counter buffer, which a functional op cannot keep.)
    (4, 14336, 4096): mm(16, 64, 256, 4, 4, split_k=2, fast=2),  # 25.96 (MM16_NARROW_PTX: 28.59; bf16 32.4)
    (16, 14336, 4096): mm(16, 32, 256, 4, 4, split_k=2, fast=2),  # 24.08 (MM16_NARROW_PTX: 25.98; bf16 32.9)
    # M 2..16 on the shapes of the whole-decoder benchmark (fused qkv 4096->6144, gate/up 4096->28672) and M = 2
    # everywhere: kernel sweep of 2026-12-01 (eager launches, 8 rotating weight sets, CUDA-graph replays;
    # `python scripts/tune_cuda_kernels.py --sweep --sweep-families woq_int8 --sweep-m 2,4,8,16 --sweep-kn
    # 4096x4096,4096x14336,14336x4096,4096x6144,4096x28672`). At M = 2 the FMA decode tile on 2 rows beat the
    # 16-row MMA tile (7 of 16 rows padding); at N = 6144 and 28672 the 32-column tile beat the 64-column rule.
    (2, 4096, 4096): DECODE_FMA_2ROWS_LONG_K,  # 10.70 (MM16_NARROW_PTX 11.32)
    (2, 14336, 4096): DECODE_FMA_2ROWS_LONG_K,  # 30.43 (MM16_NARROW_PTX 32.80)
    (2, 4096, 6144): DECODE_FMA_2ROWS_WIDE,  # 13.23 (MM16_WIDE_PTX 14.95)
    (2, 4096, 28672): DECODE_FMA_2ROWS_WIDE,  # 40.05 (MM16_WIDE_PTX 44.59)
    (4, 4096, 6144): MM16_NARROW_PTX,  # 14.22 (MM16_WIDE_PTX 14.86)
    (8, 4096, 6144): MM16_NARROW_PTX,  # 13.85 (MM16_WIDE_PTX 14.86)
    (16, 4096, 6144): MM16_NARROW_PTX,  # 13.77 (MM16_WIDE_PTX 14.96)
    (4, 4096, 28672): MM16_NARROW_PTX,  # 43.04 (MM16_WIDE_PTX 43.79)
    (8, 4096, 28672): MM16_NARROW_PTX,  # 36.45 (MM16_WIDE_PTX 43.80)
    (16, 4096, 28672): MM16_NARROW_PTX,  # 36.52 (MM16_WIDE_PTX 43.94)
    # M = 64 at the decoder's fused shapes: sweep of 2026-12-02 (`python scripts/tune_cuda_kernels.py --sweep
    # --sweep-families woq_int8 --sweep-m 64 --sweep-kn 4096x4096,4096x14336,14336x4096,4096x6144,4096x28672`;
    # "was": the rule's pick, same run; bf16 F.linear timed alongside). The other three shapes kept their
    # entries or rule (4096^2 16.7, bf16 11.7; 14336->4096 47.3, split-K 2 47.1, bf16 36.0: below bf16).
    # 19.1 us (was mm(32, 64, 256, fast=2) 24.9; bf16 16.3)
    (64, 4096, 6144): mm(64, 64, 128, 4, 4, swap=True, fast=3),
    # 55.1 us (was mm(64, 64, 128, swap=True, fast=3) 58.0; bf16 61.0)
    (64, 4096, 28672): mm(64, 128, 64, 4, 4, fast=2),
    # M 32..256 at the five decoder shapes, 3 stages and split-K on the swap-AB tile (`python
    # scripts/tune_cuda_kernels.py --sweep --sweep-families woq_int8 --sweep-m 32,64,128,256 --sweep-kn
    # 4096x4096,4096x14336,14336x4096,4096x6144,4096x28672`; BENCHMARKS.md, "CUDA (H200), woq_int8"). us; "was":
    # the config before, same run. Points whose winner the rules below now give have no entry.
    (32, 4096, 14336): mm(32, 64, 256, 4, 4, fast=2),  # 25.5 (was swap 64x64x128 s4: 31.0)
    (32, 4096, 28672): mm(32, 128, 128, 4, 4, fast=2),  # 45.0 (was swap 64x64x128 s4: 57.6)
    (128, 4096, 28672): WOQ_TMA,  # 68.0 (was swap 128x64x128 s4: 91.0)
}
# The TMA sweep on the H200 (2026-11-30; lab-archive BENCHMARKS.md, "CUDA (H200): dynamic_int8, the TMA
# kernel"; script and raw output at that tag): of 16 TMA variants, 128x128x128, 4 warps, 3 stages,
# 2 persistent programs per SM (one's epilogue under the other's main loop), Triton-flattened tile loop and a
# two-half TMA store won at M >= 1024 (1223-1407 TOP/s; 128x256 tiles 1263-1290). At M=256 it lost to `mm`
# (32.8 vs 31.5 us), so buckets <= 512 keep `mm`.
TMA_LARGE_M = tma(128, 128, 128, 4, 3, progs_per_sm=2)
TMA_MIN_BUCKET = 1024
_H200_DYNAMIC_INT8: dict[tuple[int, int, int], KernelConfig] = {
    (1, 4096, 4096): mm(16, 64, 512, 4, 4, swap=True),  # 9.2
    (4, 4096, 4096): mm(16, 64, 512, 4, 4, swap=True),  # 8.1
    (16, 4096, 4096): mm(16, 32, 512, 4, 4, swap=True),  # 8.3
    (64, 4096, 4096): mm(64, 64, 256, 4, 4, swap=True),  # 10.1
    # M=128: 2026-11-30 sweep (tune_cuda_kernels.py --sweep --sweep-m 128); before it the bucket fell
    # to the M <= 256 rule's 128x128 tiles: 32 programs at N=4096 on 132 SMs, 24.5 us compiled (0.55x bf16).
    (128, 4096, 4096): mm(64, 64, 256, 4, 4, swap=True),  # 10.2 (the rule's 128x128x128: 22.8)
    (256, 4096, 4096): mm(64, 128, 128, 4, 4),  # 15.3
    (1024, 4096, 4096): TMA_LARGE_M,  # mm(128, 256, 128, 8, 3): 34.4
    (4096, 4096, 4096): TMA_LARGE_M,  # 99.5 (mm(128, 256, 128, 8, 3): 130.9-132.0)
    (1, 4096, 14336): mm(16, 128, 256, 4, 4, swap=True),  # 19.4
    (4, 4096, 14336): mm(16, 128, 256, 4, 4, swap=True),  # 17.9
    (16, 4096, 14336): mm(16, 64, 256, 4, 4, swap=True),  # 17.4
    (64, 4096, 14336): mm(64, 128, 256, 4, 4, swap=True),  # 18.7
    (128, 4096, 14336): mm(64, 128, 128, 4, 4),  # 21.8 (the rule's 128x128x128: 27.5)
    (256, 4096, 14336): mm(128, 128, 128, 8, 3),  # 30.7
    (1024, 4096, 14336): TMA_LARGE_M,  # 98.3 (mm(128, 256, 128, 8, 4): 128.7-133.6)
    (4096, 4096, 14336): TMA_LARGE_M,  # 342.0 (mm(128, 256, 128, 8, 4): 442.7-442.8)
}

# Regenerate: each command prints the measured winners as table entries (`TABLE (family, m, k, n): config`).
WOQ_INT8_TUNED = TunedTable(
    "woq_int8",
    "python scripts/tune_cuda_kernels.py --sweep --sweep-families woq_int8 --out <scratch>",
    {H200: _H200_WOQ_INT8},
)
DYNAMIC_INT8_TUNED = TunedTable(
    "dynamic_int8",
    "python scripts/tune_cuda_kernels.py --sweep --sweep-families dynamic_int8 --out <scratch>",
    {H200: _H200_DYNAMIC_INT8},
)
WOQ_INT8_TABLE = _H200_WOQ_INT8  # the H200 tables by their old names (qlower.tuning, tests)
DYNAMIC_INT8_TABLE = _H200_DYNAMIC_INT8


def _woq_decode_rule(bucket: int, k: int, n: int) -> KernelConfig | None:
    """Static M <= 16 off the table: the M = 1 FMA kernel or the 16-row tile that won the sweeps (None: M > 16).

    M = 1: 1x4x1024 acc3 on 2 warps (replacing 1x8x1024 on 4 warps) won both measured shapes with
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
    beat the two-row one at M = 1 on four shapes: BENCHMARKS.md, "Whole decoder, CUDA (H200): changing batch
    under CUDA graphs"). Split-K configs stay split: the launcher gives a gated split-K range an accumulator
    and a cast of its own (`int8_ops._launch_all`)."""
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


# Crossovers under AUTO: the largest static M at which qlower's kernel was measured at least as fast as the next
# lowering in the CUDA ranking (None: it won on the whole grid measured). woq-int8 on H200: a kernel sweep
# (lab-archive BENCHMARKS.md, "woq-int8 at M = 64..256: the crossover moved from 64 to 256") timed the
# Triton kernel against dequant + cuBLAS side by side at M = 64, 128 and 256 on 4096->4096 and 4096->14336,
# and it won all six (17.4 vs 23.2 ... 77.2 vs 93.3 us; neither reaches bf16
# F.linear there). At M=1024 it lost (77.9 vs 57.8 us on 4096->4096; the mixed-dtype tensor-core loop reaches
# ~450 TFLOP/s, cuBLAS bf16 ~800), and at M=4096 (302 vs 195 us; 4096->14336 1096 vs 649 us). M=512 was not
# measured, so the limit is the last measured win. The PTX tiles narrowed the gap but still lose there
# (M=1024 4096^2: 67.7 vs 57.9 us; M=4096: 266 vs 189 us; AUTO's compiled rows: BENCHMARKS.md, "CUDA (H200),
# woq_int8"). dynamic-int8: qlower's int8 tensor-core kernels beat cuBLASLt `_int_mm` (M=4096,
# 4096->14336: 342 vs 544.8 us kernel alone, 1407 vs ~880 TOP/s; BENCHMARKS.md, "CUDA (H200), dynamic_int8")
# and the emulated path everywhere measured.
WOQ_INT8_MAX_M: int | None = 256
DYNAMIC_INT8_MAX_M: int | None = None
