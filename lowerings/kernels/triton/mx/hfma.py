"""Weight-only MX GEMV for M <= 4 on packed half-precision FMAs (f16x2), not fp32 conversions.

Why: the word-wise decode GEMV of `decode.py` is bound by conversion instructions, not by HBM. Per 8 e2m1
elements it issues 4 `cvt.f16x2.e4m3x2` and 8 `cvt.f32.f16`; Hopper retires 16 conversions per SM per clock,
which predicts 27 us for MXFP4 4096->14336 at M=1 (24.9 us measured) against an 8 us HBM bound. This kernel
decodes e2m1 with 4 integer ops per element pair straight into an f16x2 register (the nibble's bits placed
under the f16 sign/exponent/mantissa fields: value * 2**-14, 0.5 becomes an f16 subnormal, exact) and
multiplies on `fma.rn.f16x2`; e4m3 words go through `cvt.rn.f16x2.e4m3x2` (one per two elements). One
`cvt.f32.f16` per word remains.

Numerics: each 32-element block of x is scaled by a power of two into f16 range (its amax to [2**T, 2**(T+1)),
exact for bf16/fp16 inputs), the products of one word are summed in f16 (at most 8 terms, far below f16
overflow by the choice of T), the word sums in fp32, and the block sum times 2**(exponent) of the x block and
the weight block's e8m0 scale accumulates in fp32. Error per word sum <= a few f16 ulps (2**-11 relative),
below the bf16 rounding of the output.

e8m0 codes 0 and 255 decode as the graph's decode does (constexpr SPECIAL, `kernels._scale_f32`). The block
sum, not each element, is multiplied by the scale, which differs from the graph's dequantize-then-multiply only
where a scale is +inf (0 * inf is NaN there; +inf and -inf products cancel to NaN): with SPECIAL_INF, a program
whose result is not finite recomputes its rows scaling each element (`_exact_row`, fp32).

Under TRITON_INTERPRET (no inline PTX) `USE_ASM=False` computes the same word sums in fp32 from an exact
bit decode, so CPU tests cover the indexing, masks, x scaling and block scales.

Inputs as `decode.py`: x [M, K] bf16/fp16; w_words int32 [N, K/8] (e2m1) or [N, K/4] (e4m3); scale codes
uint8 plain [N, K/32] (any strides) or flat swizzled. Output [M, N] (or fp32 split-K partials).
"""

from __future__ import annotations

import triton
import triton.language as tl

from qlower.lowerings.kernels.triton import one_line
from qlower.lowerings.kernels.triton.mx.decode import _bits_elem, _block_scales, _load_w
from qlower.lowerings.kernels.triton.mx.kernels import _any_nonfinite


def _asm_e2m1() -> str:
    """$0: the fp32 sum of one word's 8 products; $1: the word; $2..$5: f16x2 x pairs (elements i, i+4).

    Pair i needs nibble i's sign at bit 15 and its 3 magnitude bits at 9..11 (nibble i+4: 31, 25..27), i.e.
    the sign moved 3 bits further than the magnitude. Two merged words do that once for two pairs each:
    `ve` puts the even nibbles' signs 3 bits up (bit select with 0x40404040), `vo` the odd nibbles'
    magnitudes 3 bits down (0x0E0E0E0E); each pair is then one shift and one mask (none for pair 3). 11
    integer ops per word instead of 16; bit-identical to the per-pair form (checked on 2**17 words).
    """
    mask = "0x8E008E00"
    lines = ["{", ".reg .b32 t, ve, vo, p0, p1, p2, p3, a;", ".reg .b16 lo, hi, h;"]
    lines += ["shl.b32 t, $1, 3;", "lop3.b32 ve, t, $1, 0x40404040, 0xE4;"]  # (c & a) | (~c & b)
    lines += ["shr.b32 t, $1, 3;", "lop3.b32 vo, t, $1, 0x0E0E0E0E, 0xE4;"]
    lines += [
        "shl.b32 p0, ve, 9;",
        f"and.b32 p0, p0, {mask};",
        "shl.b32 p1, vo, 8;",
        f"and.b32 p1, p1, {mask};",
    ]
    lines += ["shl.b32 p2, ve, 1;", f"and.b32 p2, p2, {mask};", f"and.b32 p3, vo, {mask};"]
    lines += ["mul.rn.f16x2 a, p0, $2;", "fma.rn.f16x2 a, p1, $3, a;", "fma.rn.f16x2 a, p2, $4, a;"]
    lines += ["fma.rn.f16x2 a, p3, $5, a;"]
    lines += ["mov.b32 {lo, hi}, a;", "add.rn.f16 h, lo, hi;", "cvt.f32.f16 $0, h;", "}"]
    return one_line("\n".join(lines))


def _asm_e4m3() -> str:
    """$0: the fp32 sum of one word's 4 products; $1: the word; $2, $3: f16x2 x pairs (bytes 0,1 and 2,3)."""
    lines = ["{", ".reg .b32 p0, p1, a;", ".reg .b16 b0, b1, lo, hi, h;"]
    lines += ["mov.b32 {b0, b1}, $1;", "cvt.rn.f16x2.e4m3x2 p0, b0;", "cvt.rn.f16x2.e4m3x2 p1, b1;"]
    lines += ["mul.rn.f16x2 a, p0, $2;", "fma.rn.f16x2 a, p1, $3, a;"]
    lines += ["mov.b32 {lo, hi}, a;", "add.rn.f16 h, lo, hi;", "cvt.f32.f16 $0, h;", "}"]
    return one_line("\n".join(lines))


_E2M1_ASM = tl.constexpr(_asm_e2m1())
_E4M3_ASM = tl.constexpr(_asm_e4m3())
_E2M1_CONSTRAINTS = tl.constexpr("=r,r,r,r,r,r")  # out; word, 4 x pairs
_E4M3_CONSTRAINTS = tl.constexpr("=r,r,r,r")  # out; word, 2 x pairs


# ------------------------------------------------------------------------------------------------ x side
@triton.jit
def _pack_f16x2(lo, hi):
    """Two fp16 tensors -> int32 f16x2 (lo in the low half), in plain Triton ops."""
    lo16 = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi16 = hi.to(tl.int16, bitcast=True).to(tl.int32) << 16
    return lo16 | hi16


@triton.jit
def _x_block(x_ptr, row, M, kw, KW, stride_xm, stride_xk, EPW: tl.constexpr, NBK: tl.constexpr,
             WPB: tl.constexpr, T: tl.constexpr, WSH: tl.constexpr, BLOCK_KW: tl.constexpr):  # fmt: skip
    """One x row over a tile of words: (f16x2 pairs as int32 [BLOCK_KW] each, the fp32 [NBK] factor that
    undoes the per-block x scaling and the decode's 2**-WSH, the fp16 x elements for the fallback)."""
    mask = (kw < KW) & ((kw * 0 + row) < M)
    base = x_ptr + row * stride_xm + kw * EPW * stride_xk
    x0 = tl.load(base + 0 * stride_xk, mask=mask, other=0).to(tl.float32)
    x1 = tl.load(base + 1 * stride_xk, mask=mask, other=0).to(tl.float32)
    x2 = tl.load(base + 2 * stride_xk, mask=mask, other=0).to(tl.float32)
    x3 = tl.load(base + 3 * stride_xk, mask=mask, other=0).to(tl.float32)
    amax = tl.maximum(tl.maximum(tl.abs(x0), tl.abs(x1)), tl.maximum(tl.abs(x2), tl.abs(x3)))
    if EPW == 8:
        x4 = tl.load(base + 4 * stride_xk, mask=mask, other=0).to(tl.float32)
        x5 = tl.load(base + 5 * stride_xk, mask=mask, other=0).to(tl.float32)
        x6 = tl.load(base + 6 * stride_xk, mask=mask, other=0).to(tl.float32)
        x7 = tl.load(base + 7 * stride_xk, mask=mask, other=0).to(tl.float32)
        amax = tl.maximum(
            amax, tl.maximum(tl.maximum(tl.abs(x4), tl.abs(x5)), tl.maximum(tl.abs(x6), tl.abs(x7)))
        )
    else:
        x4 = x0
        x5 = x0
        x6 = x0
        x7 = x0
    bmax = tl.max(tl.reshape(amax, (NBK, WPB)), axis=1)
    # biased exponent of the block amax, clamped so both factors below are normal fp32 powers of two
    f = tl.minimum(tl.maximum((bmax.to(tl.int32, bitcast=True) >> 23) & 0xFF, T + 1), 254)
    up = ((254 + T - f) << 23).to(tl.float32, bitcast=True)  # 2**(T - e)
    down = ((f - T + WSH) << 23).to(tl.float32, bitcast=True)  # 2**(e - T + WSH)
    up_w = tl.reshape(tl.broadcast_to(up[:, None], (NBK, WPB)), (BLOCK_KW,))
    h0 = (x0 * up_w).to(tl.float16)
    h1 = (x1 * up_w).to(tl.float16)
    h2 = (x2 * up_w).to(tl.float16)
    h3 = (x3 * up_w).to(tl.float16)
    h4 = (x4 * up_w).to(tl.float16)
    h5 = (x5 * up_w).to(tl.float16)
    h6 = (x6 * up_w).to(tl.float16)
    h7 = (x7 * up_w).to(tl.float16)
    if EPW == 8:  # e2m1 pairs: elements (i, i + 4) of a word
        pairs = (_pack_f16x2(h0, h4), _pack_f16x2(h1, h5), _pack_f16x2(h2, h6), _pack_f16x2(h3, h7))
    else:  # e4m3 pairs: bytes (0, 1) and (2, 3); the tuple keeps the e2m1 arity (the last two are unused)
        p01 = _pack_f16x2(h0, h1)
        p23 = _pack_f16x2(h2, h3)
        pairs = (p01, p23, p01, p23)
    return pairs, down, (h0, h1, h2, h3, h4, h5, h6, h7)


@triton.jit
def _word_sums_ref(w, hs, W_FMT: tl.constexpr):
    """Fallback (interpreter): sum over a word's elements of decoded * 2**-WSH * x' in fp32, exactly decoded."""
    if W_FMT == 3:  # _bits_elem e2m1 = true * 2**-126; the asm's f16 decode is true * 2**-14
        c = 5192296858534827628530496329220096.0  # 2**112 (x' * c <= 2**127: no overflow, no denormals)
        s = _bits_elem(w, 0, W_FMT) * (hs[0].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 1, W_FMT) * (hs[1].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 2, W_FMT) * (hs[2].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 3, W_FMT) * (hs[3].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 4, W_FMT) * (hs[4].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 5, W_FMT) * (hs[5].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 6, W_FMT) * (hs[6].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 7, W_FMT) * (hs[7].to(tl.float32) * c)[None, :]
        return s
    else:  # e4m3 = true * 2**-120; the asm's cvt gives the true value
        c = 1329227995784915872903807060280344576.0  # 2**120
        s = _bits_elem(w, 0, W_FMT) * (hs[0].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 1, W_FMT) * (hs[1].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 2, W_FMT) * (hs[2].to(tl.float32) * c)[None, :]
        s += _bits_elem(w, 3, W_FMT) * (hs[3].to(tl.float32) * c)[None, :]
        return s


@triton.jit
def _word_sums(w, pa, pb, pc, pd, hs, W_FMT: tl.constexpr, USE_ASM: tl.constexpr):
    """One row: fp32 [BLOCK_N, BLOCK_KW] sums of each word's products (pa..pd: that row's x pairs)."""
    if not USE_ASM:
        return _word_sums_ref(w, hs, W_FMT)
    if W_FMT == 3:
        return tl.inline_asm_elementwise(
            _E2M1_ASM, _E2M1_CONSTRAINTS, [w, pa[None, :], pb[None, :], pc[None, :], pd[None, :]],
            dtype=tl.float32, is_pure=True, pack=1,
        )  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            _E4M3_ASM,
            _E4M3_CONSTRAINTS,
            [w, pa[None, :], pb[None, :]],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )


@triton.jit
def mx_hfma_gemv_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,
    M, N, KW, KW_SPLIT,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_sk, s_cols_pad,
    stride_os, stride_om, stride_on,
    W_FMT: tl.constexpr, SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr, EVICT: tl.constexpr, PREFETCH: tl.constexpr, USE_ASM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
):  # fmt: skip
    """Programs (n tile, m tile, K split); BLOCK_M in {1, 2, 4}: rows sharing one load of the weight words.

    With a K split the fp32 partials go to out_ptr[pid_k] (bias and the cast are the reduce kernel's).
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    EPW: tl.constexpr = 8 if W_FMT == 3 else 4
    WPB: tl.constexpr = 32 // EPW
    NBK: tl.constexpr = BLOCK_KW // WPB

    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    rn3 = rn[None, :, None]
    row0 = pid_m * BLOCK_M
    acc0 = tl.zeros((BLOCK_N, NBK), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, NBK), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, NBK), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, NBK), dtype=tl.float32)
    kw_lo = pid_k * KW_SPLIT
    kw_end = kw_lo + KW_SPLIT
    lim = tl.minimum(kw_end, KW)
    ar3 = tl.arange(0, BLOCK_KW)[None, None, :]
    if PREFETCH:
        w_next = _load_w(w_ptr, rn3, n_mask, kw_lo + ar3, lim, stride_wn, True, EVICT)
    for kw0 in range(kw_lo, kw_end, BLOCK_KW):
        kw = kw0 + tl.arange(0, BLOCK_KW)
        if PREFETCH:
            w3 = w_next
            w_next = _load_w(w_ptr, rn3, n_mask, kw0 + BLOCK_KW + ar3, lim, stride_wn, True, EVICT)
        else:
            w3 = _load_w(w_ptr, rn3, n_mask, kw[None, None, :], lim, stride_wn, not EVEN_K, EVICT)
        w = tl.reshape(w3, (BLOCK_N, BLOCK_KW))
        kb = kw0 // WPB + tl.arange(0, NBK)
        s = _block_scales(
            s_ptr, rn, n_mask, kb, KW // WPB, stride_sn, stride_sk, s_cols_pad, 1.0, SWIZZLED, SPECIAL
        )
        acc0 += _row_partial(w, s, x_ptr, row0, M, kw, lim, stride_xm, stride_xk, W_FMT, USE_ASM, BLOCK_KW)
        if BLOCK_M >= 2:
            acc1 += _row_partial(
                w, s, x_ptr, row0 + 1, M, kw, lim, stride_xm, stride_xk, W_FMT, USE_ASM, BLOCK_KW
            )
        if BLOCK_M == 4:
            acc2 += _row_partial(
                w, s, x_ptr, row0 + 2, M, kw, lim, stride_xm, stride_xk, W_FMT, USE_ASM, BLOCK_KW
            )
            acc3 += _row_partial(
                w, s, x_ptr, row0 + 3, M, kw, lim, stride_xm, stride_xk, W_FMT, USE_ASM, BLOCK_KW
            )
    o0 = tl.sum(acc0, axis=1)
    o1 = tl.sum(acc1, axis=1)
    o2 = tl.sum(acc2, axis=1)
    o3 = tl.sum(acc3, axis=1)
    if (SPECIAL & 2) != 0:  # a +inf scale makes its rows' sums non-finite: recompute those programs exactly
        if _any_nonfinite((o0 + o1 + o2 + o3)[:, None]):
            o0 = _exact_row(w_ptr, s_ptr, x_ptr, row0, M, rn, n_mask, kw_lo, kw_end, lim, KW, stride_wn,
                            stride_xm, stride_xk, stride_sn, stride_sk, s_cols_pad, W_FMT, SWIZZLED, SPECIAL,
                            BLOCK_N, BLOCK_KW)  # fmt: skip
            if BLOCK_M >= 2:
                o1 = _exact_row(w_ptr, s_ptr, x_ptr, row0 + 1, M, rn, n_mask, kw_lo, kw_end, lim, KW, stride_wn,
                                stride_xm, stride_xk, stride_sn, stride_sk, s_cols_pad, W_FMT, SWIZZLED, SPECIAL,
                                BLOCK_N, BLOCK_KW)  # fmt: skip
            if BLOCK_M == 4:
                o2 = _exact_row(w_ptr, s_ptr, x_ptr, row0 + 2, M, rn, n_mask, kw_lo, kw_end, lim, KW, stride_wn,
                                stride_xm, stride_xk, stride_sn, stride_sk, s_cols_pad, W_FMT, SWIZZLED, SPECIAL,
                                BLOCK_N, BLOCK_KW)  # fmt: skip
                o3 = _exact_row(w_ptr, s_ptr, x_ptr, row0 + 3, M, rn, n_mask, kw_lo, kw_end, lim, KW, stride_wn,
                                stride_xm, stride_xk, stride_sn, stride_sk, s_cols_pad, W_FMT, SWIZZLED, SPECIAL,
                                BLOCK_N, BLOCK_KW)  # fmt: skip
    o_base = out_ptr + pid_k * stride_os + rn * stride_on
    _store_row(o0, o_base, row0, M, stride_om, n_mask, bias_ptr, rn, HAS_BIAS)
    if BLOCK_M >= 2:
        _store_row(o1, o_base, row0 + 1, M, stride_om, n_mask, bias_ptr, rn, HAS_BIAS)
    if BLOCK_M == 4:
        _store_row(o2, o_base, row0 + 2, M, stride_om, n_mask, bias_ptr, rn, HAS_BIAS)
        _store_row(o3, o_base, row0 + 3, M, stride_om, n_mask, bias_ptr, rn, HAS_BIAS)


@triton.jit
def _row_partial(w, s, x_ptr, row, M, kw, lim, stride_xm, stride_xk, W_FMT: tl.constexpr, USE_ASM: tl.constexpr,
                 BLOCK_KW: tl.constexpr):  # fmt: skip
    """[BLOCK_N, NBK] fp32: one x row's block sums over this tile of words, scaled to true values."""
    EPW: tl.constexpr = 8 if W_FMT == 3 else 4
    WPB: tl.constexpr = 32 // EPW
    NBK: tl.constexpr = BLOCK_KW // WPB
    # x block amax goes to [2**T, 2**(T+1)): e2m1 products (<= 6 * 2**-14 * 2**(T+1)) summed 8 per word stay
    # < 96, e4m3 products (<= 448 * 2**(T+1)) summed 4 per word < 65504 (f16 max). The f16 decode is the true
    # value * 2**-WSH (e2m1 bits under the f16 fields) or the true value (e4m3 cvt).
    T: tl.constexpr = 14 if W_FMT == 3 else 4
    WSH: tl.constexpr = 14 if W_FMT == 3 else 0
    p, down, hs = _x_block(x_ptr, row, M, kw, lim, stride_xm, stride_xk, EPW, NBK, WPB, T, WSH, BLOCK_KW)
    r = _word_sums(w, p[0], p[1], p[2], p[3], hs, W_FMT, USE_ASM)
    # Both factors are powers of two. (s * down) first: r holds x scaled up to 2**T, so (r * s) overflowed at
    # high codes under a small x. Where s * down itself overflows (x's block amax times the scale reaches
    # 2**128) the products may still be finite (zeros, small elements): there r is scaled in two steps
    # (tests/lowerings/kernels/test_mx_triton_special.py, the high-code rows).
    sums = tl.sum(tl.reshape(r, (w.shape[0], NBK, WPB)), axis=2)
    d = down[None, :]
    sd = s * d
    two_steps = (sd == float("inf")) & (s < float("inf"))
    return tl.where(two_steps, (sums * s) * d, sums * sd)


@triton.jit
def _exact_elem(w, e: tl.constexpr, W_FMT: tl.constexpr):
    """Element e of each int32 word as its true fp32 value, through the e4m3 convert (no fp32 subnormals)."""
    if W_FMT == 3:
        nib = (w >> (4 * e)) & 15
        e4 = ((nib & 7) << 2) | ((nib & 8) << 4)  # e2m1 bits as e4m3 worth value / 64 (kernels)
        return e4.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0
    else:
        return ((w >> (8 * e)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _exact_row(w_ptr, s_ptr, x_ptr, row, M, rn, n_mask, kw_lo, kw_end, lim, KW, stride_wn, stride_xm, stride_xk,
               stride_sn, stride_sk, s_cols_pad, W_FMT: tl.constexpr, SWIZZLED: tl.constexpr,
               SPECIAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr):  # fmt: skip
    """[BLOCK_N] fp32: one x row times the weight rows rn over words [kw_lo, lim), each element times its scale
    before its product, in the graph's order ((value * scale) * x, fp32). Tiles of at most 16 words: a
    BLOCK_KW-wide one raised the kernel's registers (sm_90 ptxas, n16 kw128: 145 against 80 without the tail);
    at 16 words the production configs compile within about +-30 of their count without it."""
    EPW: tl.constexpr = 8 if W_FMT == 3 else 4
    WPB: tl.constexpr = 32 // EPW
    TKW: tl.constexpr = BLOCK_KW if BLOCK_KW < 16 else 16  # divides BLOCK_KW, hence every split's range
    NBK: tl.constexpr = TKW // WPB
    acc = tl.zeros((BLOCK_N, TKW), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_end, TKW):
        kw = kw0 + tl.arange(0, TKW)
        inside = n_mask[:, None] & (kw < lim)[None, :]
        w = tl.load(w_ptr + rn[:, None] * stride_wn + kw[None, :], mask=inside, other=0)
        kb = kw0 // WPB + tl.arange(0, NBK)
        s = _block_scales(
            s_ptr, rn, n_mask, kb, KW // WPB, stride_sn, stride_sk, s_cols_pad, 1.0, SWIZZLED, SPECIAL
        )
        s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, NBK, WPB)), (BLOCK_N, TKW))
        x_base = x_ptr + row * stride_xm + kw * EPW * stride_xk
        x_mask = (kw < lim) & ((kw * 0 + row) < M)
        part = tl.zeros((BLOCK_N, TKW), dtype=tl.float32)
        for e in tl.static_range(EPW):
            x_e = tl.load(x_base + e * stride_xk, mask=x_mask, other=0).to(tl.float32)
            part += _exact_elem(w, e, W_FMT) * s * x_e[None, :]
        acc += tl.where(inside, part, 0.0)  # a masked word's 0 times a +inf scale is NaN: not this range's
    return tl.sum(acc, axis=1)


@triton.jit
def _store_row(out, o_base, row, M, stride_om, n_mask, bias_ptr, rn, HAS_BIAS: tl.constexpr):
    if HAS_BIAS:
        out += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)
    tl.store(o_base + row * stride_om, out.to(o_base.dtype.element_ty), mask=n_mask & ((rn * 0 + row) < M))


__all__ = ["mx_hfma_gemv_kernel"]
