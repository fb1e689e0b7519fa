"""MXFP4 weights (e2m1, e8m0 scales per 32) decoded straight to scaled bf16, for bf16 activations on GPUs
without MX tensor cores: `mx_bf16_mm_kernel` (tensor-core tiles, optional split-K) and
`mx_bf16_dequant_kernel` (the whole weight in bf16, for cuBLAS at large M).

Why: the CVT decode of `decode.py` goes through the hardware fp8 converts (e2m1 -> e4m3 -> f16 -> f32, then
times the scale and back to bf16): two convert instructions per element, and the convert units (16 per SM per
clock) bound it (MXFP4 M = 16 4096->14336: 46 us against bf16's 33 us on sm_90). Here an element costs
integer ops and one bf16x2 FMA, and lands in a bf16 dot operand as the user's dequantize-then-cast computes it
(`_bf16_pairs_ptx`).

Inputs: x [M, K] bf16; w_words int32 [N, K/8] (a `.view(torch.int32)` of the packed uint8 weight, element
2i in the low nibble of byte i); scale codes uint8 plain [N, K/32] (any strides) or flat swizzled (128x4 tiles).
"""

# ruff: noqa: UP045

import triton
import triton.language as tl

from qlower.lowerings.kernels.triton import one_line
from qlower.lowerings.kernels.triton.mx.kernels import _scale_offsets


def _bf16_pairs_ptx() -> str:
    """PTX: one e2m1 word ($8) and its block scale as a bf16x2 pair ($9) -> 8 scaled bf16 bit patterns ($0-$7).

    Elements i and i + 4 sit 16 bits apart in the word, so one shift pair builds both halves of a bf16x2
    register: the sign to bit 15 (31), the magnitude bits e1e0m to bits 8..6 (24..22). Read as bf16 that is
    the e2m1 value * 2**-126 for every code (0.5 is the bf16 subnormal 0x0040). `fma.rn.bf16x2` by 2**126
    (+ -0.0) makes it exact; a second by the block scale rounds code * 2**(E - 127) once to bf16, as the user's
    dequantize-then-cast does (one rounding of an exact product; overflow to inf and NaN scales included)."""
    lines = ["{", ".reg .b32 ts, te, d, c126, nz;", "mov.b32 c126, 0x7E807E80;", "mov.b32 nz, 0x80008000;"]
    for i in range(4):
        sign_shift, mag_shift = 12 - 4 * i, 6 - 4 * i
        lines.append(f"shl.b32 ts, $8, {sign_shift};" if sign_shift else "mov.b32 ts, $8;")
        lines.append(f"shl.b32 te, $8, {mag_shift};" if mag_shift > 0 else f"shr.u32 te, $8, {-mag_shift};")
        lines += [
            "and.b32 te, te, 0x01C001C0;",
            "lop3.b32 d, ts, te, nz, 0xE4;",  # (ts & nz) | (te & ~nz)
            "fma.rn.bf16x2 d, d, c126, nz;",
            "fma.rn.bf16x2 d, d, $9, nz;",
            f"mov.b32 {{${i}, ${i + 4}}}, d;",
        ]
    return one_line("\n".join(lines + ["}"]))


_ASM_E2M1_BF16 = tl.constexpr(_bf16_pairs_ptx())


@triton.jit
def _decode(w, sp):
    """int32 words and their scale pairs -> tuple of 8 bf16 tensors (element e of each word), scaled."""
    r = tl.inline_asm_elementwise(
        _ASM_E2M1_BF16, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [w, sp], dtype=(tl.int16,) * 8, is_pure=True, pack=1
    )
    return (r[0].to(tl.bfloat16, bitcast=True), r[1].to(tl.bfloat16, bitcast=True),
            r[2].to(tl.bfloat16, bitcast=True), r[3].to(tl.bfloat16, bitcast=True),
            r[4].to(tl.bfloat16, bitcast=True), r[5].to(tl.bfloat16, bitcast=True),
            r[6].to(tl.bfloat16, bitcast=True), r[7].to(tl.bfloat16, bitcast=True))  # fmt: skip


@triton.jit
def _join8(v):
    """Tuple of 8 [R, C] tensors (element e of each word) -> [R, C * 8] in K order."""
    t = tl.join(
        tl.join(tl.join(v[0], v[4]), tl.join(v[2], v[6])),
        tl.join(tl.join(v[1], v[5]), tl.join(v[3], v[7])),
    )
    return tl.reshape(t, (v[0].shape[0], v[0].shape[1] * 8))


@triton.jit
def _scale_pairs(s_ptr, rn, n_mask, kb, nkb, stride_sn, stride_sk, s_cols_pad, SWIZZLED: tl.constexpr,
                 SPECIAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr):  # fmt: skip
    """[BLOCK_N, BLOCK_KW] int32: each word's block scale 2**(code - 127) as a bf16x2 pair (0 -> the bf16
    subnormal 2**-127, or 0.0 with SPECIAL_ZERO; 255 -> NaN, or +inf with SPECIAL_INF: `kernels.SPECIAL_*`),
    4 words per 32-element block. The PTX scales each element (+inf times a zero element is NaN, as in the
    graph's dequantization)."""
    offs = _scale_offsets(rn[:, None], kb[None, :], stride_sn, stride_sk, s_cols_pad, SWIZZLED)
    c = tl.load(s_ptr + offs, mask=n_mask[:, None] & (kb < nkb)[None, :], other=127).to(tl.int32)
    bits = c << 7  # 0 -> 0x0000 (0.0), 255 -> 0x7F80 (+inf)
    if (SPECIAL & 1) == 0:
        bits = tl.where(c == 0, 0x40, bits)
    if (SPECIAL & 2) == 0:
        bits = tl.where(c == 255, 0x7FC0, bits)
    pair = bits | (bits << 16)
    return tl.reshape(tl.broadcast_to(pair[:, :, None], (BLOCK_N, BLOCK_KW // 4, 4)), (BLOCK_N, BLOCK_KW))


@triton.jit
def _tile(w_ptr, s_ptr, rn, n_mask, kw0, kw_end, KW, stride_wn, stride_sn, stride_sk, s_cols_pad,
          SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_KW: tl.constexpr):  # fmt: skip
    """The decoded weight tile [BLOCK_N, BLOCK_KW] words as 8 bf16 planes (masked words decode to 0)."""
    kw = kw0 + tl.arange(0, BLOCK_KW)
    if EVEN_K:
        mask = n_mask[:, None]
    else:
        mask = n_mask[:, None] & (kw < kw_end)[None, :]
    w = tl.load(
        w_ptr + rn[:, None] * stride_wn + kw[None, :], mask=mask, other=0, eviction_policy="evict_first"
    )
    kb = kw0 // 4 + tl.arange(0, BLOCK_KW // 4)
    sp = _scale_pairs(
        s_ptr, rn, n_mask, kb, KW // 4, stride_sn, stride_sk, s_cols_pad, SWIZZLED, SPECIAL, BLOCK_N, BLOCK_KW
    )
    return _decode(w, sp)


@triton.jit
def mx_bf16_mm_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,
    M, N, KW, KW_SPLIT,
    stride_xm, stride_xk, stride_wn, stride_sn, stride_sk, s_cols_pad,
    stride_ps, stride_om, stride_on,
    SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr, SWAP_AB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_KW: tl.constexpr,
):  # fmt: skip
    """out[M, N] (SPLIT: fp32 partials [splits, M, N], no bias) = x @ dequant(w).T [+ bias].

    Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), splits); split s covers words [s * KW_SPLIT, (s + 1) * KW_SPLIT).
    SWAP_AB: out^T = W x^T, the decoded weight (in registers) as the dot's first operand, which Hopper's
    wgmma may take from registers; x^T the second."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    k_lo = pid_k * KW_SPLIT
    k_hi = tl.minimum(KW, k_lo + KW_SPLIT)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kw0 in range(k_lo, k_hi, BLOCK_KW):
        v = _tile(w_ptr, s_ptr, rn, n_mask, kw0, k_hi, KW, stride_wn, stride_sn, stride_sk, s_cols_pad,
                  SWIZZLED, SPECIAL, EVEN_K, BLOCK_N, BLOCK_KW)  # fmt: skip
        kk = kw0 * 8 + tl.arange(0, BLOCK_KW * 8)
        xt = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                     mask=m_mask[:, None] & (kk < k_hi * 8)[None, :], other=0.0)  # fmt: skip
        if SWAP_AB:
            acc = tl.dot(_join8(v), tl.trans(xt), acc)
        else:
            acc = tl.dot(xt, tl.trans(_join8(v)), acc)
    if SWAP_AB:
        acc = tl.trans(acc)
    mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        p_ptrs = out_ptr + pid_k * stride_ps + rm[:, None] * N + rn[None, :]
        tl.store(p_ptrs, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)[None, :]
        o_ptrs = out_ptr + rm[:, None] * stride_om + rn[None, :] * stride_on
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mx_bf16_dequant_kernel(
    w_ptr, s_ptr, out_ptr, N, KW,
    stride_wn, stride_sn, stride_sk, s_cols_pad, stride_on,
    SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_KW: tl.constexpr,
):  # fmt: skip
    """out [N, K] bf16 = dequant(w) (the user's rounding, once per element); grid (cdiv(N, BN), cdiv(KW, BKW))."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kw0 = tl.program_id(1) * BLOCK_KW
    n_mask = rn < N
    v = _join8(_tile(w_ptr, s_ptr, rn, n_mask, kw0, KW, KW, stride_wn, stride_sn, stride_sk, s_cols_pad,
                     SWIZZLED, SPECIAL, EVEN_K, BLOCK_N, BLOCK_KW))  # fmt: skip
    kk = kw0 * 8 + tl.arange(0, BLOCK_KW * 8)
    tl.store(
        out_ptr + rn[:, None] * stride_on + kk[None, :], v, mask=n_mask[:, None] & (kk < KW * 8)[None, :]
    )
