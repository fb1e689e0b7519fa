"""Candidate decode-time MX weight-only kernels (Hopper has no MX tensor cores): out = x @ dequant(W).T.

Why a second set of kernels: at M=1 the MX GEMV is memory-bound in theory but instruction-bound in practice
(MXFP4 4096->14336 needs ~34 decoded elements per SM per clock to reach HBM speed; the byte-wise decode of
`kernels.mx_gemv_kernel` spends ~10 instructions per element). What these do differently:

- Weights are read as int32 words (8 e2m1 or 4 fp8 elements each, 16-byte vector loads, evict_first), so
  the decode works on whole words instead of unpacking bytes one register at a time.
- Decoders (constexpr DECODE):
  1 BITS: pure Triton. The element's sign/exponent/mantissa bits are moved straight into an fp32 bit
    pattern with exponent field = the element's own (e2m1 `em << 22`, e4m3 `bits << 20`). That reads as
    value * 2**-DSH (e2m1 0.5 becomes an fp32 denormal: exact, since Triton's fma does not flush). x is
    pre-multiplied by 2**XSH and the block scale by 2**(DSH - XSH), so products stay normal and no
    per-element fix-up multiply is needed. Runs in TRITON_INTERPRET.
  2 CVT: inline PTX, one call per word: e2m1 -> e4m3 / 64 with 4-lane SIMD-in-a-register bit ops
    (~9 ops per 8 elements), then the hardware `cvt.rn.f16x2.e4m3x2` and `cvt.f32.f16`. fp8: the cvts only.
  3 F16BITS (e2m1 only): inline PTX building f16x2 pairs (elements i, i+4 of a word) with 4 ops per pair
    (value * 2**-14, f16 subnormal for 0.5), then `cvt.f32.f16`. No fp8 convert unit involved.
- Products are summed per word in an fp32 fma chain, per 32-block, then times the block's scale (one
  multiply per 32 elements); the scale tile [BLOCK_N, BLOCK_K/32] is loaded once per iteration.
- `mx_decode_mm_kernel`: M up to 16-64: decoded, scaled weights cast to bf16 (exact) into `tl.dot`.

Inputs: x [M, K] float; w_words int32 [N, K/8] (e2m1) or [N, K/4] (fp8) — a `.view(torch.int32)` of the
uint8 weight (`as_words`); scale codes uint8 plain [N, K/32] (any strides) or flat swizzled (128x4 tiles).
"""

# ruff: noqa: UP045

from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from qlower.lowerings.kernels.triton import one_line
from qlower.lowerings.kernels.triton.mx.kernels import E2M1, E4M3, E5M2, _scale_f32, _scale_offsets

BITS, CVT, F16BITS = 1, 2, 3


# ------------------------------------------------------------------------------------------------ decoders
@triton.jit
def _bits_elem(w, e: tl.constexpr, W_FMT: tl.constexpr):
    """Element e of each word as an fp32 whose bits are the element's own: true value * 2**-DSH."""
    if W_FMT == 3:
        sh: tl.constexpr = 4 * e
        mag = ((w >> sh) & 7) << 22
        sgn = ((w >> (sh + 3)) & 1) << 31
        return (mag | sgn).to(tl.float32, bitcast=True)
    else:
        # fp8 codes with an all-ones exponent are not numbers of the shifted pattern: e4m3 S.1111.111 is NaN;
        # e5m2 S.11111.00 is +-Inf and S.11111.xx NaN (OCP FP8 spec; torch's float8 casts agree).
        sh8: tl.constexpr = 8 * e
        b7 = (w >> sh8) & 0x7F
        sgn = ((w >> (sh8 + 7)) & 1) << 31
        if W_FMT == 1:
            v = ((b7 << 20) | sgn).to(tl.float32, bitcast=True)
            return tl.where(b7 == 0x7F, float("nan"), v)
        else:
            v = ((b7 << 21) | sgn).to(tl.float32, bitcast=True)
            inf = (sgn | 0x7F800000).to(tl.float32, bitcast=True)
            return tl.where(b7 >= 0x7C, tl.where(b7 == 0x7C, inf, float("nan")), v)


_ASM_E2M1_CVT = tl.constexpr(
    one_line("""
{
.reg .b32 wl, wh, wt, wa;
.reg .b16 p0, p1, q0, q1, f0, f1;
and.b32 wl, $8, 0x07070707;
shl.b32 wl, wl, 2;
and.b32 wt, $8, 0x08080808;
shl.b32 wt, wt, 4;
or.b32 wl, wl, wt;
shr.b32 wh, $8, 2;
and.b32 wh, wh, 0x1C1C1C1C;
and.b32 wt, $8, 0x80808080;
or.b32 wh, wh, wt;
mov.b32 {p0, p1}, wl;
mov.b32 {q0, q1}, wh;
cvt.rn.f16x2.e4m3x2 wa, p0;
mov.b32 {f0, f1}, wa;
cvt.f32.f16 $0, f0;
cvt.f32.f16 $2, f1;
cvt.rn.f16x2.e4m3x2 wa, p1;
mov.b32 {f0, f1}, wa;
cvt.f32.f16 $4, f0;
cvt.f32.f16 $6, f1;
cvt.rn.f16x2.e4m3x2 wa, q0;
mov.b32 {f0, f1}, wa;
cvt.f32.f16 $1, f0;
cvt.f32.f16 $3, f1;
cvt.rn.f16x2.e4m3x2 wa, q1;
mov.b32 {f0, f1}, wa;
cvt.f32.f16 $5, f0;
cvt.f32.f16 $7, f1;
}
""")
)

_ASM_E2M1_F16 = tl.constexpr(
    one_line(
        "\n".join(
            ["{", ".reg .b32 wt, wu, wr;", ".reg .b16 f0, f1;"]
            + [
                line
                for i in range(4)
                for line in (
                    (f"shl.b32 wt, $8, {12 - 4 * i};" if i < 3 else "mov.b32 wt, $8;"),
                    "and.b32 wu, wt, 0x80008000;",
                    "shr.b32 wr, wt, 3;",
                    "and.b32 wr, wr, 0x0E000E00;",
                    "or.b32 wr, wr, wu;",
                    "mov.b32 {f0, f1}, wr;",
                    f"cvt.f32.f16 ${i}, f0;",
                    f"cvt.f32.f16 ${i + 4}, f1;",
                )
            ]
            + ["}"]
        )
    )
)

_ASM_E4M3_CVT = tl.constexpr(
    one_line("""
{
.reg .b32 wa;
.reg .b16 p0, p1, f0, f1;
mov.b32 {p0, p1}, $4;
cvt.rn.f16x2.e4m3x2 wa, p0;
mov.b32 {f0, f1}, wa;
cvt.f32.f16 $0, f0;
cvt.f32.f16 $1, f1;
cvt.rn.f16x2.e4m3x2 wa, p1;
mov.b32 {f0, f1}, wa;
cvt.f32.f16 $2, f0;
cvt.f32.f16 $3, f1;
}
""")
)


@triton.jit
def _decode_words(w, W_FMT: tl.constexpr, DECODE: tl.constexpr):
    """int32 words -> tuple of EPW fp32 tensors (element e of each word), each true value * 2**-DSH."""
    if DECODE == 1 or W_FMT == 2:
        if W_FMT == 3:
            return (_bits_elem(w, 0, W_FMT), _bits_elem(w, 1, W_FMT), _bits_elem(w, 2, W_FMT),
                    _bits_elem(w, 3, W_FMT), _bits_elem(w, 4, W_FMT), _bits_elem(w, 5, W_FMT),
                    _bits_elem(w, 6, W_FMT), _bits_elem(w, 7, W_FMT))  # fmt: skip
        else:
            return (_bits_elem(w, 0, W_FMT), _bits_elem(w, 1, W_FMT), _bits_elem(w, 2, W_FMT),
                    _bits_elem(w, 3, W_FMT))  # fmt: skip
    elif W_FMT == 3:
        if DECODE == 2:
            r = tl.inline_asm_elementwise(
                _ASM_E2M1_CVT, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.int32,) * 8, is_pure=True, pack=1
            )
        else:
            r = tl.inline_asm_elementwise(
                _ASM_E2M1_F16, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w], dtype=(tl.int32,) * 8, is_pure=True, pack=1
            )
        return (r[0].to(tl.float32, bitcast=True), r[1].to(tl.float32, bitcast=True),
                r[2].to(tl.float32, bitcast=True), r[3].to(tl.float32, bitcast=True),
                r[4].to(tl.float32, bitcast=True), r[5].to(tl.float32, bitcast=True),
                r[6].to(tl.float32, bitcast=True), r[7].to(tl.float32, bitcast=True))  # fmt: skip
    else:
        r = tl.inline_asm_elementwise(
            _ASM_E4M3_CVT, "=r,=r,=r,=r,r", [w], dtype=(tl.int32,) * 4, is_pure=True, pack=1
        )
        return (r[0].to(tl.float32, bitcast=True), r[1].to(tl.float32, bitcast=True),
                r[2].to(tl.float32, bitcast=True), r[3].to(tl.float32, bitcast=True))  # fmt: skip


@triton.jit
def _block_scales(s_ptr, rn, n_mask, kb, nkb, stride_sn, stride_sk, s_cols_pad, factor,
                  SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr):  # fmt: skip
    """[BLOCK_N, NBK] fp32: 2**(code - 127) * factor (factor folds the decoder's 2**(DSH - XSH); codes 0 and
    255 as `kernels._scale_f32` decodes them under SPECIAL)."""
    offs = _scale_offsets(rn[:, None], kb[None, :], stride_sn, stride_sk, s_cols_pad, SWIZZLED)
    code = tl.load(s_ptr + offs, mask=n_mask[:, None] & (kb < nkb)[None, :], other=127)
    return (_scale_f32(code, SPECIAL) * factor).to(tl.float32)  # Inductor passes a Python float as fp64


# ------------------------------------------------------------------------------------------------ kernels
@triton.jit
def _load_w(w_ptr, rn3, n_mask, kw3, lim, stride_wn, CHECK_K: tl.constexpr, EVICT: tl.constexpr):
    """[1, BLOCK_N, BLOCK_KW] int32 weight words; CHECK_K masks words at or past `lim` (K end, prefetch)."""
    mask = n_mask[None, :, None]
    if CHECK_K:
        mask = mask & (kw3 < lim)
    ptrs = w_ptr + rn3 * stride_wn + kw3
    if EVICT:
        return tl.load(ptrs, mask=mask, other=0, eviction_policy="evict_first")
    else:
        return tl.load(ptrs, mask=mask, other=0)


@triton.jit
def _join_words(vals, EPW: tl.constexpr):
    """Tuple of EPW [R, C] tensors (element e of each word) -> [R, C * EPW] in K order."""
    if EPW == 8:
        t = tl.join(
            tl.join(tl.join(vals[0], vals[4]), tl.join(vals[2], vals[6])),
            tl.join(tl.join(vals[1], vals[5]), tl.join(vals[3], vals[7])),
        )
    else:
        t = tl.join(tl.join(vals[0], vals[2]), tl.join(vals[1], vals[3]))
    return tl.reshape(t, (vals[0].shape[0], vals[0].shape[1] * EPW))


@triton.jit
def mx_decode_mm_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,
    M, N, KW, x_mul, s_mul,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_sk, s_cols_pad,
    stride_om, stride_on,
    W_FMT: tl.constexpr, SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr, DECODE: tl.constexpr,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, EVICT: tl.constexpr, DOT_BF16: tl.constexpr,
    X_PRESCALE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
):  # fmt: skip
    """Small-M tiles: the decoded weight tile times its block scales (exact in bf16) into tl.dot. Each element
    is scaled before the dot, as the graph's dequantization does (+inf scales included: 0 * inf is NaN)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    EPW: tl.constexpr = 8 if W_FMT == 3 else 4
    WPB: tl.constexpr = 32 // EPW
    NBK: tl.constexpr = BLOCK_KW // WPB
    BK: tl.constexpr = BLOCK_KW * EPW
    DOT_DTYPE: tl.constexpr = tl.bfloat16 if DOT_BF16 else tl.float16
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kw0 in range(0, KW, BLOCK_KW):
        kw = kw0 + tl.arange(0, BLOCK_KW)
        w_ptrs = w_ptr + rn[:, None] * stride_wn + kw[None, :]
        if EVEN_K:
            w_mask = n_mask[:, None]
        else:
            w_mask = n_mask[:, None] & (kw < KW)[None, :]
        if EVICT:
            w = tl.load(w_ptrs, mask=w_mask, other=0, eviction_policy="evict_first")
        else:
            w = tl.load(w_ptrs, mask=w_mask, other=0)
        # decoded * 2**(DSH - XSH) (exact: a power of two), then the scale: folded into the scale instead, the
        # factor overflowed it at high codes (2**6 from code 249,
        # tests/lowerings/kernels/test_mx_triton_special.py)
        v = _join_words(_decode_words(w, W_FMT, DECODE), EPW) * s_mul
        kb = kw0 // WPB + tl.arange(0, NBK)
        s = _block_scales(
            s_ptr, rn, n_mask, kb, KW // WPB, stride_sn, stride_sk, s_cols_pad, 1.0, SWIZZLED, SPECIAL
        )
        v = tl.reshape(tl.reshape(v, (BLOCK_N, NBK, 32)) * s[:, :, None], (BLOCK_N, BK)).to(DOT_DTYPE)
        kk = kw0 * EPW + tl.arange(0, BK)
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                     mask=m_mask[:, None] & (kk < KW * EPW)[None, :], other=0)  # fmt: skip
        if X_PRESCALE:
            xt = xt.to(tl.float32) * x_mul
        acc = tl.dot(xt.to(DOT_DTYPE), tl.trans(v), acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)[None, :]
    o_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


# ------------------------------------------------------------------------------------------------ host side
@dataclass(frozen=True)
class DecodeConfig:
    """One launch shape. kernel 'gemv' (fp32 fma; block_m activation rows per program), 'hfma' (f16x2 fma,
    `hfma.py`; block_m 1 or 2; decode unused) or 'mm' (tl.dot)."""

    kernel: str
    decode: int
    block_n: int
    block_kw: int
    num_warps: int
    num_stages: int
    block_m: int = 1
    split_k: int = 1
    evict: bool = True
    prefetch: bool = False  # gemv: register double buffer of the weight words
    swap_ab: bool = False  # bf16mm: out^T = W x^T

    def short(self) -> str:
        d = {BITS: "bits", CVT: "cvt", F16BITS: "f16"}[self.decode]
        s = f"{self.kernel}/{d} m{self.block_m} n{self.block_n} kw{self.block_kw} w{self.num_warps} s{self.num_stages}"
        s += f" sk{self.split_k}" if self.split_k > 1 else ""
        return (
            s
            + ("" if self.evict else " noevict")
            + (" pf" if self.prefetch else "")
            + (" swap" if self.swap_ab else "")
        )


def effective_decode(w_fmt: int, decode: int) -> int:
    """e5m2 always decodes by BITS; F16BITS is e2m1-only (fp8 gets CVT)."""
    if w_fmt == E5M2:
        return BITS
    if w_fmt != E2M1 and decode == F16BITS:
        return CVT
    return decode


def fmt_consts(w_fmt: int, decode: int) -> tuple[int, int, int, int]:
    """(elements per word, words per 32-block, DSH, XSH): decoded = true * 2**-DSH, x is taken * 2**XSH."""
    d = effective_decode(w_fmt, decode)
    if w_fmt == E2M1:
        return (8, 4) + {BITS: (126, 63), CVT: (6, 0), F16BITS: (14, 0)}[d]
    if w_fmt == E4M3:
        return (4, 8) + {BITS: (120, 60), CVT: (0, 0)}[d]
    return (4, 8, 112, 56)


def elems_per_word(w_fmt: int) -> int:
    return 8 if w_fmt == E2M1 else 4


def as_words(w: torch.Tensor) -> Optional[torch.Tensor]:
    """The uint8 weight [N, K/2 or K] as int32 words [N, K/8 or K/4], or None when it cannot be viewed so."""
    if w.dim() != 2 or w.stride(1) != 1 or w.shape[1] % 4 or w.stride(0) % 4 or w.storage_offset() % 4:
        return None
    return w.view(torch.int32)


__all__ = [
    "BITS", "CVT", "F16BITS", "E2M1", "E4M3", "E5M2", "DecodeConfig", "as_words", "elems_per_word",
    "mx_decode_mm_kernel",
]  # fmt: skip
