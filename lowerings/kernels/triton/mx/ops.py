"""`qlower::mx_linear`: the MX Triton kernels as one triton_op, and which kernel/config runs for which shape.

Inputs are uint8 views (elements, packed e2m1 bytes, e8m0 codes) plus format codes; the op picks the GEMV
kernel for small M and the tiled kernel above (a dynamic M launches both with gated grids: no guard, no
recompile). Configs were chosen on sm_90 (scripts/bench_mx.py sweeps them); other GPUs get the same.

Weight-only MXFP4/MXFP8 with bf16/fp16 activations at M <= 16 runs the word-wise decode kernels of
`mx/decode.py` instead where they measured faster (`pick_decode`: the measured points, the `"mx"` table of
`tuned/<gpu>.json`, and the rules below).

`a_special` / `w_special` say how e8m0 codes 0 and 255 decode (`Special`; the record's `scale_special` /
`w_scale_special`, mapped by lowerings/emit/triton_mx.py): every kernel launched here takes them as constexprs.

Not using `from __future__ import annotations` (nor `X | None`): `triton_op` infers the schema from live
annotations, on the oldest torch qlower supports too.
"""

# ruff: noqa: UP045

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

import torch
from torch.library import triton_op, wrap_triton

from qlower.lowerings.kernels.triton import interpreted
from qlower.lowerings.kernels.triton.launch_args import (
    Leaf,
    branch_on_m,
    cdiv,
    is_static,
    m_range_gate,
    python_wrapper,
)
from qlower.lowerings.kernels.triton.mx.decode import BITS, CVT, F16BITS, DecodeConfig, as_words
from qlower.lowerings.kernels.triton.mx.kernels import (
    E2M1,
    E4M3,
    E5M2,
    FLOAT,
    SPECIAL_INF,
    SPECIAL_ZERO,
    mx_gemv_kernel,
    mx_mm_kernel,
)
from qlower.lowerings.kernels.triton.mx.launch import BF16_DENSE, cutlass_gemm, dense_bf16, launch_decode
from qlower.lowerings.kernels.triton.tuned import STAND_IN, TunedTable

ELEM_CODE = {"float": FLOAT, "e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}


@dataclass(frozen=True)
class Special:
    """How e8m0 codes 0 and 255 decode, per operand: `SPECIAL_ZERO` (code 0 is 0.0) | `SPECIAL_INF` (code 255
    is +inf) where the matched graph's decode departs from the OCP spec; 0: the spec's values."""

    a: int = 0
    w: int = 0

    def __post_init__(self) -> None:
        for bits in (self.a, self.w):
            if bits & ~(SPECIAL_ZERO | SPECIAL_INF):
                raise ValueError(
                    f"e8m0 special flags {bits}: only SPECIAL_ZERO (1) and SPECIAL_INF (2) exist"
                )


SPEC = Special()


@dataclass(frozen=True)
class MXConfig:
    kernel: str  # "gemv" or "mm"
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    block_m: int = 1
    group_m: int = 8


# Largest M served by the GEMV kernel (weights streamed once per output row; tiles above).
GEMV_MAX_M = 4
# Configs measured on sm_90 (Triton 3.6; BENCHMARKS.md "CUDA, mx"): the compiled model with these ran MXFP8
# weight-only M=1 at 1.30x bf16, MXFP4 weight-only M=1 at 0.95x, MXFP8 dynamic M=4096 at 0.15x (the per-32
# chunk fp8 tile kernel is far from the tensor cores' rate: see mx_lowering.py for what AUTO does with that).
GEMV_FP4 = MXConfig("gemv", block_n=32, block_k=256, num_warps=4, num_stages=3)
GEMV_FP8 = MXConfig("gemv", block_n=8, block_k=1024, num_warps=4, num_stages=2)
MM_FP8_LARGE = MXConfig("mm", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
MM_FP8_SMALL = MXConfig("mm", block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=3)
MM_UPCAST_LARGE = MXConfig("mm", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)
MM_UPCAST_SMALL = MXConfig("mm", block_m=32, block_n=128, block_k=128, num_warps=4, num_stages=3)


def fp8_mma(a_fmt: int, w_fmt: int) -> bool:
    """Both operands fp8-coded and of one fp8 type (e2m1 decodes to e4m3): per-chunk fp8 tensor-core dots."""
    e4 = (E4M3, E2M1)
    return (a_fmt in e4 and w_fmt in e4) or (a_fmt == E5M2 and w_fmt == E5M2)


def pick_config(m: int, a_fmt: int, w_fmt: int) -> MXConfig:
    if m <= GEMV_MAX_M:
        return GEMV_FP4 if w_fmt == E2M1 else GEMV_FP8
    if fp8_mma(a_fmt, w_fmt):
        return MM_FP8_LARGE if m > 256 else MM_FP8_SMALL
    return MM_UPCAST_LARGE if m > 256 else MM_UPCAST_SMALL


# ------------------------------------------------------------------ weight-only decode kernels (mx/decode.py)
# Measured on sm_90 by the MX decode-kernel sweeps (torch 2.11, Triton 3.6; CUDA-graph replay over 8 rotating
# weight sets; bf16 activations; us). The compiled rows: BENCHMARKS.md, "CUDA, mx" ("MXFP4 weight-only",
# "MXFP8 weight-only"); the kernel sweeps' numbers are these notes (quoted names: the sweeps' write-ups).
# The f16x2 GEMV (`mx/hfma.py`, kernel "hfma"), two sweeps, 13 shapes per M (second sweep's numbers; bf16
#   F.linear 30-32 us at 4096->14336 and 14336->4096, 13.3-13.5 us at 4096->4096; "was": the decode kernels'
#   pick before it; "MX weight-only on packed f16x2 FMAs"):
#   M=1: N > K n16 kw128 (fp4 14.6 was 24.9; fp8 16.5 was 19.3); N = K n8 kw256 (fp4 6.2 was 11.4; fp8 7.7
#     was 11.0); K > N a 2-way K split, fp4 n16 kw128 (16.9 was 29.5), fp8 n8 kw256 (18.1 was 29.5).
#   M=2 (block_m 2): N > K fp4 n16 kw128 (21.8 was 45.5), fp8 the same split 2 (22.8 was 40.2); N = K n8 kw256
#     (fp4 8.5 was 18.3; fp8 10.6, the tile kernel 11.2); K > N n16 kw128 split 2 (fp4 23.3 was 58.7; fp8 28.6,
#     the tile kernel 33.4).
#   M=3-4 (block_m 4, measured at M=4): fp4 N > K n16 kw128 sk2 (39.5 was 45.3), N = K n16 kw128 (15.1 was
#     18.8), K > N n8 kw128 (47.6 was 61.1); fp8 N > K the dot kernel below stays (40.2 vs 43.1), N = K n8 kw256
#     (14.9, tile kernel 18.7), K > N n16 kw128 sk2 (43.1, tile kernel 64.7).
#   M=16: every hfma shape lost to the dot kernel (fp4 128-150 vs 46-103 us): block_m 4 repeats x work per row.
# The first decode-kernel sweep (the "gemv"/"mm" decode kernels against the kernels before them; the MX
#   paragraph of the woq_int8 decode-kernel write-up):
#   M 5-16 (measured at M=16): mm/cvt m16 n64 w4 s3, kw16 (128 elements) fp4 / kw32 fp8, every shape (fp4
#     70.6->46.4, 73.6->31.4, 230.6->103.2; fp8 51.7->39.1, 56.5->27.5, 168.8->89.3 us current -> new).
#   M > 16: not measured; the current tile kernels.
# The prefetch run: register prefetch of the next weight tile (`prefetch`) at M=1, 8 shapes side by side
#   ("MX weight-only: register prefetch"): fp4 n16 kw128 pf won all three (K, N): 13.2 vs 14.6 us (N > K),
#   6.1 vs 6.1 (N = K), 16.0 vs the split-K pick's 17.1 (K > N, no split needed); fp8 only at N = K (n8 kw256
#   pf 7.2 vs 7.7; elsewhere prefetch lost, 17.4 vs 16.7 at N > K). A second run at M = 2 and 4 moved the
#   entries marked "prefetch run" in HF_M2 / HF_M4 (prefetch; 2 warps with a K split for fp4 K > N at M=4);
#   ties (within 0.1 us) and fp8 M=4 N > K (39.7 vs 40.5) stayed.
# The 11-op decode run: the e2m1 decode in 11 integer ops per word instead of 16 (`hfma._asm_e2m1`; "The
#   e2m1 decode in 11 integer ops per word"); at M=1 (two runs) fp4 N > K without prefetch 12.3 / 12.3 us vs
#   prefetch 13.0 / 13.0 (bf16 30.4); N = K prefetch stays (5.9 vs 7.2); K > N prefetch n16 kw128 15.4-15.6,
#   n8 kw256 15.2 (within noise: kept).
#   At M=3..4 ("MXFP4 at M = 2-4 with the new decode") two programs of 2 rows each beat one of 4 where N <= K:
#   11.0 vs 13.1 us at 4096^2, 32.5 vs 35.6 at 14336->4096 (1.00x bf16); at N > K it tied (35.4 vs 36.2) and
#   stayed. M=2 kept its picks (each within 0.1 us of the best of 13 shapes).
#   Software-pipelined loads (`tl.range(num_stages=2..4)`, cp.async through shared memory) lost at every shape
#   (e.g. 14.1-16.3 vs 12.3 us) and were not kept.
# Other (K, N) follow the same rules by the sign of N - K. E5M2 weights and MX activations keep the current
# kernels.
DECODE_MAX_M = 16
HF_WIDE = DecodeConfig("hfma", CVT, block_n=16, block_kw=128, num_warps=4, num_stages=1)
HF_SQUARE = replace(HF_WIDE, block_n=8, block_kw=256)
HF_FP8_M1_NARROW = replace(HF_SQUARE, split_k=2)  # fp8, K > N, M=1
HF_SQUARE_PF = replace(HF_SQUARE, prefetch=True)  # M=1: fp8 at N = K, fp4 at N <= K
HF_FP4_2ROWS = replace(HF_WIDE, block_m=2)  # fp4 2-row programs: M=2 at N > K, M=3..4 at N <= K


# MXFP4 at M = 1, with the kernels' special-code flags (the hand-written form's +inf flag / no
# flag; us): N <= K the square tile with prefetch, 15.7 / 15.1 at 14336->4096 and 6.2 / 6.3 at 4096^2 (the
# wide prefetch tile before it: 19.8 / 15.4 and 6.9 / 5.9; the flag's non-finite recompute cost it 4.4 us
# there); K < N < 2K the square tile without prefetch, 7.7 / 7.4 at 4096->6144 (wide 8.8 / 8.3); N >= 2K the
# wide tile, 12.9 / 12.5 at 4096->14336 (square 14.3 / 13.8). bf16 F.linear 31.6 | 12.5 | 16.1 | 30.4.


def _m1(w_fmt: int, k: int, n: int) -> DecodeConfig:
    """The M=1 config by weight format and the ratio of N to K."""
    if w_fmt == E2M1:
        return HF_WIDE if n >= 2 * k else HF_SQUARE if n > k else HF_SQUARE_PF
    return HF_WIDE if n > k else HF_SQUARE_PF if n == k else HF_FP8_M1_NARROW


HF_M2 = {  # (w_fmt, sign of N - K) -> config at M=2
    (E2M1, 1): HF_FP4_2ROWS,
    (E4M3, 1): replace(HF_WIDE, block_m=2, split_k=2),
    (E2M1, 0): replace(HF_SQUARE, block_m=2),
    (E4M3, 0): replace(HF_SQUARE, block_m=2, prefetch=True),  # prefetch run: 9.8 vs 10.8 us
    (E2M1, -1): replace(HF_WIDE, block_m=2, split_k=2),
    (E4M3, -1): replace(HF_SQUARE, block_m=2, prefetch=True),  # prefetch run: 25.9 vs 28.7 us
}
DEC_MM_FP4 = DecodeConfig("mm", CVT, block_n=64, block_kw=16, num_warps=4, num_stages=3, block_m=16)
DEC_MM_FP8 = DecodeConfig("mm", CVT, block_n=64, block_kw=32, num_warps=4, num_stages=3, block_m=16)
HF_M4 = {  # (w_fmt, sign of N - K) -> config at M=3..4
    (E2M1, 1): replace(HF_WIDE, block_m=4, prefetch=True),  # prefetch run: 34.9 vs 39.2 us
    (E4M3, 1): DEC_MM_FP8,
    (E2M1, 0): HF_FP4_2ROWS,  # 11-op decode run: 11.0 vs 13.1 us (block_m 4, prefetch)
    (E4M3, 0): replace(HF_SQUARE, block_m=4),
    (E2M1, -1): HF_FP4_2ROWS,  # 11-op decode run: 32.5 vs 35.6 us (the prefetch run's 2-warp split-K pick)
    (E4M3, -1): replace(HF_WIDE, block_m=4, split_k=2),
}
_DECODE_KERNELS = ("gemv", "hfma", "mm", "bf16mm", "bf16dq")
_DECODE_FIELDS = {f.name: f.type for f in fields(DecodeConfig)}


def decode_config_from_fields(cfg: dict[str, Any]) -> DecodeConfig:
    """A `DecodeConfig` from its fields as the tuned data files hold them (`dataclasses.asdict`; `decode` is the
    code of mx/decode.py: 1 BITS, 2 CVT, 3 F16BITS), else ValueError naming the problem."""
    unknown = set(cfg) - set(_DECODE_FIELDS)
    if unknown:
        raise ValueError(f"MX decode config {cfg}: unknown fields {sorted(unknown)}")
    if cfg.get("kernel") not in _DECODE_KERNELS:
        raise ValueError(f"MX decode config {cfg}: kernel must be one of {_DECODE_KERNELS}")
    if cfg.get("decode") not in (BITS, CVT, F16BITS):
        raise ValueError(f"MX decode config {cfg}: decode must be {BITS}, {CVT} or {F16BITS}")
    for name, value in cfg.items():
        want = str if name == "kernel" else bool if _DECODE_FIELDS[name] in (bool, "bool") else int
        if type(value) is not want:
            raise ValueError(f"MX decode config {cfg}: {name} must be {want.__name__}")
    return DecodeConfig(**cfg)


# The measured points, (w_fmt code, M bucket's upper end, K, N) -> config: the `"mx"` table of the tuned data
# files (tuned/<gpu>.json, keyed by the device they were measured on, read through tuned.py); the rules give
# the same configs there (tests/lowerings/kernels/test_mx_triton_interp.py checks that), the table is the
# record of the sweeps.
DECODE_TUNED = TunedTable.from_files("mx", decode_config_from_fields)
DECODE_TABLE = DECODE_TUNED.entries(STAND_IN)  # the stand-in device's entries
# Dynamic-M buckets (lo, hi): a symbolic M launches one gated kernel per bucket that is not provably empty.
_BUCKETS = ((1, 1), (2, 2), (3, 4), (5, DECODE_MAX_M), (DECODE_MAX_M + 1, None))


# MXFP4 weights with bf16 x from M = 3 (`mx/bf16.py`: e2m1 straight to scaled bf16, no convert instructions).
# M = 3..4 (16-row tiles against `mx/hfma.py`, with the +inf flag of the hand-written form; us at
# 4096^2 | 4096->14336 | 14336->4096 | 4096->6144 | 4096->28672, bf16 F.linear 13.2 | 29.9 | 31.9 | 15.9 |
# 55.1): the M16 configs 10.6 | 23.6 | 24.9 | 13.2 | 41.4 against the hfma 4-row / 2-row GEMV 11.2 | 36.4 |
# 32.1 | 15.2 | 60.8. At M = 2 the hfma GEMV stays: 8.2 | 20.2 | 20.8 | 10.8 | 36.4 against 10.7 | 23.4 |
# 24.7 | 13.3 | 41.2.
# Measured on sm_90 (GPU time, 8 rotating weight sets, a sweep of tiles, split-K and swap-AB per M;
# BENCHMARKS.md "CUDA, mx", "MXFP4 weight-only"), us at 4096^2 | 4096->14336 | 14336->4096, bf16 F.linear in
# brackets:
#   M=16 (13.6 | 33.1 | 33.5): m16 tiles, split-K 4, n64 kw16 where N >= K, n32 kw32 below: 10.9 | 23.7 |
#        25.1 (the CVT dot kernel before: 31.5 | 46.7 | 102).
#   M=32 (13.9 | 31.9 | 33.6): swap-AB m32 n64 kw32, split-K 4: 13.3 | 31.5 | 31.6 (m64 tiles: 17.0 | 37.0 | 49.0).
#   M=64 (11.7 | 33.6 | 36.2): N > K m64 n64 kw16: 37.5 (swap-AB 41.8); N <= K swap-AB m64 n128 kw8 w8 split-K
#        4: 15.9 | 41.9 (m64 tiles 17.2 | 47.0).
#   M=128 (13.4 | 33.2 | 37.7): N > K swap-AB m128 n64 kw16: 53.8 (dequantize + cuBLAS 79.6); N <= K the
#        dequantize + cuBLAS: 24.7 | 83.6 (swap-AB 31.3 | 104).
#   M=256 / 2048 (17.3 | 42.4 | 46.3 / 83.0 | 291 | 282): dequantize (`mx_bf16_dequant_kernel` n32 kw32: 11.3 |
#        42.4 | 42.2 us for the weight alone) then cuBLAS: 27.0 | 86.1 | 91.0 / 94.2 | 332 | 320 (the MX tile
#        kernel before: 109 | 383 | 354 / 244 | 857 | 902).
BF16_MIN_M = 3
BF16_MM_MAX_M = 128
_MM = dict(num_warps=4, num_stages=3)
BF16_M16_WIDE = DecodeConfig("bf16mm", CVT, block_n=64, block_kw=16, block_m=16, split_k=4, **_MM)
BF16_M16_NARROW = replace(BF16_M16_WIDE, block_n=32, block_kw=32)
BF16_M32 = DecodeConfig("bf16mm", CVT, block_n=64, block_kw=32, block_m=32, split_k=4, swap_ab=True, **_MM)
BF16_M64_WIDE = DecodeConfig("bf16mm", CVT, block_n=64, block_kw=16, block_m=64, **_MM)
BF16_M64_NARROW = DecodeConfig(
    "bf16mm", CVT, block_n=128, block_kw=8, block_m=64, split_k=4, swap_ab=True, num_warps=8, num_stages=3
)
BF16_M128_WIDE = DecodeConfig("bf16mm", CVT, block_n=64, block_kw=16, block_m=128, swap_ab=True, **_MM)
# qlower's CUTLASS MXFP4 GEMM (`kernels/cutlass/mxfp4.py`) where the op is handed its block scales
# (`cutlass_min_m`, from the CUTLASS lowering: `devices/cuda_cutlass.py`): a launch shape of no Triton kernel.
CUTLASS_GEMM = DecodeConfig("cutlass", CVT, block_n=0, block_kw=0, num_warps=0, num_stages=0)
# The configs that compute the whole output in one call (gated for a symbolic M), not tiles into it.
DENSE_KERNELS = ("bf16dq", "cutlass")
# What the op is handed for the CUTLASS GEMM: (the block scales or None, its first M, its last M or 0).
Cutlass = tuple[Optional[torch.Tensor], int, int]
NO_CUTLASS: Cutlass = (None, 0, 0)
_BF16_BUCKETS = ((1, 1), (2, 2), (3, 16), (17, 32), (33, 64), (65, 128), (129, None))


def bf16_decodes(x_dtype: torch.dtype, w_fmt: int) -> bool:
    """Whether `mx/bf16.py` serves this call from M = 3 on: e2m1 weights, bf16 x, compiled Triton (inline PTX)."""
    return w_fmt == E2M1 and x_dtype == torch.bfloat16 and not interpreted()


def pick_weight_only(
    m: int,
    w_fmt: int,
    k: int,
    n: int,
    x_dtype: torch.dtype,
    device: Optional[str] = None,
    cutlass_min_m: int = 0,
) -> Optional[DecodeConfig]:
    """The weight-only config at M = m: `mx/bf16.py`'s above M = 2 where it serves (`bf16_decodes`; "bf16dq":
    dequantize, then cuBLAS, where that measured faster), else `pick_decode`'s (None: the MX tile kernel).
    `cutlass_min_m` (> 0: the op has the CUTLASS GEMM's block scales): the CUTLASS GEMM from that M, and
    wherever dequantize + cuBLAS would run."""
    if bf16_decodes(x_dtype, w_fmt) and m >= BF16_MIN_M:
        if cutlass_min_m and (m >= cutlass_min_m or pick_weight_only(m, w_fmt, k, n, x_dtype) is BF16_DENSE):
            return CUTLASS_GEMM
        wide = n > k
        if m <= 16:
            return BF16_M16_WIDE if n >= k else BF16_M16_NARROW
        if m <= 32:
            return BF16_M32
        if m <= 64:
            return BF16_M64_WIDE if wide else BF16_M64_NARROW
        if m <= BF16_MM_MAX_M and wide:
            return BF16_M128_WIDE
        return BF16_DENSE
    return pick_decode(m, w_fmt, k, n, device)


Buckets = tuple[tuple[int, Optional[int]], ...]


def buckets(x_dtype: torch.dtype, w_fmt: int) -> Buckets:
    """The M ranges (lo, hi) a symbolic M is split into for weight-only MX."""
    return _BF16_BUCKETS if bf16_decodes(x_dtype, w_fmt) else _BUCKETS


def split_at(ranges: Buckets, edges: tuple[int, ...]) -> Buckets:
    """`ranges` with each range holding an edge e below its end split into (.., e) and (e + 1, ..): the host
    branch's leaves then end where the CUTLASS GEMM's M range starts and ends (`_branch_on_m`)."""
    out = list(ranges)
    for e in edges:
        for i, (lo, hi) in enumerate(out):
            if e >= lo and (hi is None or e < hi):
                out[i : i + 1] = [(lo, e), (e + 1, hi)]
                break
    return tuple(out)


def decode_rule(m: int, w_fmt: int, k: int, n: int) -> Optional[DecodeConfig]:
    """The decode config for weight-only w_fmt at M = m (static), or None for the current kernels."""
    if w_fmt not in (E2M1, E4M3) or m < 1 or m > DECODE_MAX_M:
        return None
    side = (n > k) - (n < k)
    if m == 1:
        return _m1(w_fmt, k, n)
    if m == 2:
        return HF_M2[w_fmt, side]
    if m <= 4:
        return HF_M4[w_fmt, side]
    return DEC_MM_FP4 if w_fmt == E2M1 else DEC_MM_FP8


def pick_decode(m: int, w_fmt: int, k: int, n: int, device: Optional[str] = None) -> Optional[DecodeConfig]:
    """The device's table (`DECODE_TUNED`; `device` a name, None: the current one) at a measured point, else
    `decode_rule`; BITS-decoded under TRITON_INTERPRET."""
    bucket = m if m <= 2 else 4 if m <= 4 else DECODE_MAX_M
    key = (w_fmt, bucket, k, n)
    table = DECODE_TUNED.entries(device)
    cfg = table[key] if key in table and 1 <= m <= DECODE_MAX_M else decode_rule(m, w_fmt, k, n)
    if cfg is not None and interpreted():
        cfg = replace(cfg, decode=BITS)
    return cfg


def _decode_words(a: torch.Tensor, w: torch.Tensor, a_fmt: int, w_fmt: int) -> Optional[torch.Tensor]:
    """The weight as int32 words when the decode kernels may serve this call, else None."""
    if a_fmt != FLOAT or w_fmt not in (E2M1, E4M3) or a.dtype not in (torch.bfloat16, torch.float16):
        return None
    k = w.shape[1] * (2 if w_fmt == E2M1 else 1)
    if not is_static(k) or int(k) % 32 or not w.is_contiguous():  # contiguous: Inductor's view keeps it
        return None
    return as_words(w)


_gate = m_range_gate  # the bucket gate (launch_args.py), by the name tests use


def _scale_args(s: Optional[torch.Tensor], swizzled: bool, k: int) -> tuple[Any, int, int, int]:
    """(tensor, stride_rows, stride_cols, padded cols) of a scale operand (swizzled: the flat tensor)."""
    if s is None:
        return None, 0, 0, 0
    if swizzled:
        return s.reshape(-1), 0, 0, (k // 32 + 3) // 4 * 4
    return s, s.stride(0), s.stride(1), 0


def launch(
    cfg: MXConfig,
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out: torch.Tensor,
    a_fmt: int,
    w_fmt: int,
    a_swizzled: bool,
    w_swizzled: bool,
    gate: Any = 1,
    dot_dtype: Optional[torch.dtype] = None,
    special: Special = SPEC,
) -> None:
    """One kernel launch writing `out` [M, N]; `gate` (1, 0 or a 0/1 SymInt) scales the grid.

    `dot_dtype` of the upcast tile path: fp16 when the activation is fp16, else bf16 (exact for MX values).
    """
    m, n = out.shape
    k = w.shape[1] * (2 if w_fmt == E2M1 else 1)
    as_t, s_asm, s_ask, as_pad = _scale_args(a_scale, a_swizzled, k)
    ws_t, s_wsn, s_wsk, ws_pad = _scale_args(w_scale, w_swizzled, k)
    as_t = ws_t if as_t is None else as_t
    b = bias if bias is not None else ws_t
    args = (
        a, as_t, w, ws_t, b, out, m, n, k,
        a.stride(0), a.stride(1), s_asm, s_ask, as_pad,
        w.stride(0), w.stride(1), s_wsn, s_wsk, ws_pad,
        out.stride(0), out.stride(1),
    )  # fmt: skip
    common = dict(
        A_FMT=a_fmt, W_FMT=w_fmt, A_SWZ=a_swizzled, W_SWZ=w_swizzled, A_SPECIAL=special.a, W_SPECIAL=special.w,
        HAS_BIAS=bias is not None,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if cfg.kernel == "gemv":
        wrap_triton(mx_gemv_kernel)[(cdiv(n, cfg.block_n) * gate, m)](*args, **common)
        return
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * gate,)
    wrap_triton(mx_mm_kernel)[grid](
        *args, FP8_MMA=fp8_mma(a_fmt, w_fmt), DOT_BF16=(dot_dtype or a.dtype) != torch.float16,
        BLOCK_M=cfg.block_m, GROUP_M=cfg.group_m, **common,
    )  # fmt: skip


@triton_op("qlower::mx_linear", mutates_args=())
def mx_linear(
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    a_fmt: int,
    w_fmt: int,
    a_swizzled: bool,
    w_swizzled: bool,
    out_dtype: torch.dtype,
    host_branch: bool = False,
    a_special: int = 0,
    w_special: int = 0,
    w_blocks: Optional[torch.Tensor] = None,
    cutlass_min_m: int = 0,
    cutlass_max_m: int = 0,
) -> torch.Tensor:
    """A [M, K] (float, or MX bytes with codes) @ W [N, K] (MX bytes, codes).T [+ bias] -> [M, N] out_dtype.

    Quantized tensors are uint8: fp8 bytes [R, K], packed e2m1 [R, K / 2], e8m0 codes [R, K / 32] (any
    strides) or the flat swizzled tensor. A symbolic M picks its kernel per M bucket: `host_branch` (no CUDA
    graphs, AOTInductor) with `torch.cond` on M (`_branch_on_m`: one launch per call), else with gated grids.
    `a_special` / `w_special`: how each operand's e8m0 codes 0 and 255 decode (`Special`; 0: the OCP spec).
    `w_blocks` (MXFP4 weights, bf16 x): the weight's block scales as qlower's CUTLASS MXFP4 GEMM reads them
    (`kernels/cutlass/mxfp4.py`), which then runs from M = `cutlass_min_m` to `cutlass_max_m` (0: no end),
    and dequantize + cuBLAS above (`pick_weight_only`): the gated path's `launch.mxfp4_dense` picks per call,
    the host branch's leaves end at the range's ends and call the CUTLASS op itself (C++ wrappers included).
    """
    m, n = a.shape[0], w.shape[0]
    fmts = (a_fmt, w_fmt, a_swizzled, w_swizzled)
    sp = Special(a_special, w_special)
    if w_blocks is None:
        cutlass_min_m = 0
    if host_branch and not is_static(m):
        cutlass = (w_blocks, cutlass_min_m, cutlass_max_m)
        return _branch_on_m(a, a_scale, w, w_scale, bias, fmts, out_dtype, sp, cutlass)
    words = _decode_words(a, w, a_fmt, w_fmt)
    if words is not None:
        cutlass = (w_blocks, cutlass_min_m, cutlass_max_m)
        return _decode_or_current(m, a, words, w, w_scale, bias, out_dtype, fmts, sp, cutlass)
    out = torch.empty((m, n), dtype=out_dtype, device=w.device)
    if is_static(m):
        launch(pick_config(int(m), a_fmt, w_fmt), a, a_scale, w, w_scale, bias, out, *fmts, special=sp)
        return out
    small = pick_config(1, a_fmt, w_fmt)
    large = pick_config(1 << 20, a_fmt, w_fmt)
    on_small = torch.sym_max(0, torch.sym_min(1, GEMV_MAX_M + 1 - m))  # 1 iff m <= GEMV_MAX_M, no guard
    launch(small, a, a_scale, w, w_scale, bias, out, *fmts, gate=on_small, special=sp)
    launch(large, a, a_scale, w, w_scale, bias, out, *fmts, gate=1 - on_small, special=sp)
    return out


def _branch_on_m(
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    fmts: tuple[int, int, bool, bool],
    out_dtype: torch.dtype,
    sp: Special = SPEC,
    cutlass: Cutlass = NO_CUTLASS,
) -> torch.Tensor:
    """The gated paths' buckets as leaves of `branch_on_m` (host `if`s on M), each one ungated launch."""
    a_fmt, w_fmt, _, w_swz = fmts
    w_blocks, cutlass_min_m, cutlass_max_m = cutlass
    m = a.shape[0]
    Body = Callable[..., None]  # (a, a_scale, w, w_scale, bias, out) -> None, one bucket's launch

    def leaf(body: Body) -> Callable[..., torch.Tensor]:
        def run(a_: Any, as_: Any, w_: Any, ws_: Any, b_: Any, bl_: Any = None) -> torch.Tensor:
            out = torch.empty((a_.shape[0], w_.shape[0]), dtype=out_dtype, device=w_.device)
            body(a_, as_, w_, ws_, b_, out)
            return out

        return run

    leaves: list[Leaf] = []
    if _decode_words(a, w, a_fmt, w_fmt) is not None:
        k = w.shape[1] * (2 if w_fmt == E2M1 else 1)
        n = int(w.shape[0]) if is_static(w.shape[0]) else -1
        ranges = buckets(a.dtype, w_fmt)
        if cutlass_min_m:
            ranges = split_at(ranges, (cutlass_min_m - 1, *((cutlass_max_m,) if cutlass_max_m else ())))
        for lo, hi in ranges:
            if _gate(m, lo, hi) is None:
                continue
            rep = lo if hi is None else hi
            cur = pick_config(rep, a_fmt, w_fmt) if hi is not None else pick_config(1 << 20, a_fmt, w_fmt)
            cfg = pick_weight_only(rep, w_fmt, k, n, a.dtype, cutlass_min_m=cutlass_min_m)
            if cfg is CUTLASS_GEMM and cutlass_max_m and lo > cutlass_max_m:
                cfg = BF16_DENSE  # above the CUTLASS GEMM's range (leaves split at its end)
            if cfg is not None and cfg.kernel in DENSE_KERNELS:

                def dense(a_, as_, w_, ws_, b_, bl_=None, cfg=cfg) -> torch.Tensor:
                    if cfg.kernel == "cutlass":  # a leaf inside the GEMM's M range: the op itself
                        out = cutlass_gemm(a_, w_, bl_, b_)
                    else:
                        words = _decode_words(a_, w_, a_fmt, w_fmt)
                        out = dense_bf16(cfg, a_, words, ws_, b_, w_swz, w_special=sp.w)
                    return out if out.dtype == out_dtype else out.to(out_dtype)

                leaves.append((hi, dense))
                continue

            def body(a_, as_, w_, ws_, b_, out, cfg=cfg, cur=cur) -> None:
                # rows: M itself (the gated path's M = 1 bucket passes rows=1 to keep its gated-off launch
                # static; a leaf runs only at its own M, so its grid also empties at M = 0)
                if cfg is None:
                    launch(cur, a_, None, w_, ws_, b_, out, *fmts, special=sp)
                else:
                    words = _decode_words(a_, w_, a_fmt, w_fmt)
                    launch_decode(cfg, a_, words, ws_, b_, out, w_fmt, w_swz, w_special=sp.w)

            leaves.append((hi, leaf(body)))
    else:
        for hi, cfg in (
            (GEMV_MAX_M, pick_config(1, a_fmt, w_fmt)),
            (None, pick_config(1 << 20, a_fmt, w_fmt)),
        ):

            def body(a_, as_, w_, ws_, b_, out, cfg=cfg) -> None:
                launch(cfg, a_, as_, w_, ws_, b_, out, *fmts, special=sp)

            leaves.append((hi, leaf(body)))
    return branch_on_m(leaves, (a, a_scale, w, w_scale, bias, w_blocks))


def _decode_or_current(
    m: Any,
    a: torch.Tensor,
    words: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    fmts: tuple[int, int, bool, bool],
    sp: Special = SPEC,
    cutlass: Cutlass = NO_CUTLASS,
) -> torch.Tensor:
    """Weight-only MX: per M bucket the weight-only config (`pick_weight_only`) or the current kernel.

    Static M: one config. Symbolic M: one launch per bucket with a 0/1 gated grid (no guard, no
    recompile); a bucket provably empty is skipped. The M == 1 bucket launches with rows=1 (static grid
    and split-K scratch); the others take the symbolic M (the kernels mask rows against it). A dequantize +
    cuBLAS bucket ("bf16dq") runs with K gated to 0 below its range and gives the output the others overwrite.
    """
    a_fmt, w_fmt, _, w_swz = fmts
    w_blocks, cutlass_min_m, cutlass_max_m = cutlass
    k, n = words.shape[1] * (8 if w_fmt == E2M1 else 4), int(w.shape[0]) if is_static(w.shape[0]) else -1

    def run(cfg: Optional[DecodeConfig], cur: MXConfig, out: torch.Tensor, gate: Any, rows: Any) -> None:
        if cfg is None:
            launch(cur, a, None, w, w_scale, bias, out, *fmts, gate=gate, special=sp)
        else:
            launch_decode(
                cfg, a, words, w_scale, bias, out, w_fmt, w_swz, gate=gate, rows=rows, w_special=sp.w
            )

    def dense(cfg: DecodeConfig, gate: Any) -> torch.Tensor:
        if cfg.kernel == "cutlass":
            out = torch.ops.qlower.mxfp4_dense(
                a, w, w_blocks, w_scale, bias, w_swz, sp.w, cutlass_max_m, gate
            )
        elif not is_static(gate) and w_fmt == E2M1 and python_wrapper():
            # the gate as an argument (no view of x narrowed to K * gate: a guard on M in Inductor's passes)
            out = torch.ops.qlower.mxfp4_dense(a, w, None, w_scale, bias, w_swz, sp.w, 0, gate)
        else:
            out = dense_bf16(cfg, a, words, w_scale, bias, w_swz, gate, w_special=sp.w)
        return out if out.dtype == out_dtype else out.to(out_dtype)

    if is_static(m):
        mi = int(m)
        cfg = pick_weight_only(max(mi, 1), w_fmt, k, n, a.dtype, cutlass_min_m=cutlass_min_m)
        if mi > 0 and cfg is not None and cfg.kernel in DENSE_KERNELS:
            return dense(cfg, 1)
        out = torch.empty((mi, w.shape[0]), dtype=out_dtype, device=w.device)
        if mi > 0:
            run(cfg, pick_config(mi, a_fmt, w_fmt), out, 1, None)
        return out
    large = pick_config(1 << 20, a_fmt, w_fmt)  # as the generic dynamic path: the large tile above
    plan = []
    for lo, hi in buckets(a.dtype, w_fmt):
        gate = _gate(m, lo, hi)
        if gate is not None:
            rep = lo if hi is None else hi  # the bucket's configs are the same at every M in it
            plan.append(
                (
                    pick_weight_only(rep, w_fmt, k, n, a.dtype, cutlass_min_m=cutlass_min_m),
                    pick_config(rep, a_fmt, w_fmt) if hi is not None else large,
                    gate,
                    hi,
                )
            )
    # Every dequantize + cuBLAS bucket (N <= K: M 65-128 and above 128) shares one dense output, gated on where
    # M is in any of them: their gates are 0/1 over disjoint ranges, so their sum is too. (Only the first
    # bucket's gate once reached it: M > 128 got all zeros under CUDA graphs on sm_90; the configs differ
    # in the dequantize tile at most, and every tile computes the same bf16 weight.) The sum is capped at 1,
    # which it never exceeds, so that M's range proves the gated K within K (no guard on M).
    base = [p for p in plan if p[0] is not None and p[0].kernel in DENSE_KERNELS]
    out = (
        dense(base[0][0], torch.sym_min(1, sum(p[2] for p in base)) if len(base) > 1 else base[0][2])
        if base
        else torch.empty((m, w.shape[0]), dtype=out_dtype, device=w.device)
    )
    for cfg, cur, gate, hi in plan:
        if cfg is None or cfg.kernel not in DENSE_KERNELS:
            run(cfg, cur, out, gate, 1 if hi == 1 else None)
    return out


def launch_config(
    cfg: MXConfig,
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    a_fmt: int,
    w_fmt: int,
    a_swizzled: bool = False,
    w_swizzled: bool = False,
    out_dtype: Optional[torch.dtype] = None,
    dot_dtype: Optional[torch.dtype] = None,
    special: Special = SPEC,
) -> torch.Tensor:
    """Eager launch with an explicit config (kernel tests, tuning sweeps).

    Launches the kernel directly, as the triton_op does in eager mode: through the wrap_triton HOP every
    launch costs ~0.2 ms of dispatch, which swamped the first sweep's GEMV timings.
    """
    from torch._library.triton import set_wrap_triton_enabled

    out = torch.empty((a.shape[0], w.shape[0]), dtype=out_dtype or torch.bfloat16, device=w.device)
    with set_wrap_triton_enabled(False):
        fmts = (a_fmt, w_fmt, a_swizzled, w_swizzled)
        launch(cfg, a, a_scale, w, w_scale, bias, out, *fmts, dot_dtype=dot_dtype, special=special)
    return out
