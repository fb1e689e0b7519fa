"""woq-int8 on the int8 tensor cores: the activation split exactly into three int8 limbs, the weight used as is.

Why: the woq tile kernel (`kernels.qlinear_mm_kernel`) converts every int8 weight element to bf16 in its
main loop. Without the inline-PTX conversion that is about 5 instructions per element (SASS counts), and at M
16..256 on sm_90 that form reached only 0.6-0.7x bf16 F.linear. (No tuned entry or rule picks this kernel,
`configs.woq_int8_config`: the inline-PTX conversion, `kernels._int8_to`, 2 instructions per element,
beat it where both were timed except at M = 64, 4096->28672 (55.1 vs 50.0 us), where this kernel turns a row
holding inf into a NaN row. It stays for sweeps.) The int8 weight can feed the int8 tensor cores untouched if
the activation is int8 too. Each activation row becomes X = round(x * 2**(21 - e)), with e the exponent of the
row's amax, so |X| < 2**22, written as X = d2 * 2**16 + d1 * 2**8 + d0 with int8 digits d0, d1 in [-128, 127],
d2 in [-64, 64]. The GEMM runs three int8 x int8 -> int32 dots per tile against the same weight tile; int8
MMAs run at twice the bf16 rate, and the weight costs no conversion instructions. The epilogue combines them:
y = (P2 * 2**16 + P1 * 2**8 + P0) * 2**(e - 21) * w_scale + bias.

Numerics: an element at least 2**-14 (bf16) or 2**-11 (fp16) times its row's amax is represented exactly.
Smaller ones round to a multiple of 2**(e - 21): error <= 2**-22 times the row's amax each, below the
fp32 accumulation error of bf16 products. The int32 sums are exact for K <= 2**16 (|P| <= K * 2**14); P2
converts to fp32 with one rounding (2**-24 relative). A row holding inf or NaN gives a NaN output row.

Two launches: `x_limbs_kernel` (one program per row: amax pass, then the digits) into a [3, M, K] int8
scratch and a [M] fp32 row scale, then `woq_limb_mm_kernel` (swap-AB: acc^T [BN, BM] = W [BN, BK] @ d^T).
"""

from __future__ import annotations

import triton
import triton.language as tl

from qlower.lowerings.kernels.triton.int8.kernels import grouped_tile, load_scale

MAX_K = 1 << 16  # int32 sums stay exact: K * 128 * 128 < 2**31


@triton.jit
def _round_half_even(v):
    """fp32 with |v| < 2**22 -> the nearest integer (ties to even) as int32: adding and subtracting 1.5 * 2**23
    rounds in the fp32 adder, which works in Triton's interpreter and on every GPU alike."""
    magic = 12582912.0  # 1.5 * 2**23
    return ((v + magic) - magic).to(tl.int32)


@triton.jit
def x_limbs_kernel(x_ptr, limbs_ptr, rs_ptr, M, K, stride_xm, stride_xk, BLOCK: tl.constexpr):
    """Row m of x -> limbs[l, m, :] (int8, l = 0, 1, 2 from the least significant) and rs[m] = 2**(e - 21)."""
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    row = x_ptr + tl.cast(m, tl.int64) * stride_xm
    amax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        v = tl.load(row + (k0 + offs) * stride_xk, mask=k0 + offs < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.where(v == v, tl.abs(v), float("inf")))  # NaN counts as not finite
    top = tl.max(amax, axis=0)
    bits = top.to(tl.int32, bitcast=True)
    e_biased = (bits >> 23) & 0xFF
    finite = e_biased < 255
    # scale so |X| < 2**22; the clamp keeps both powers of two normal fp32 (rows with amax < 2**-105 round to
    # multiples of 2**-126: an absolute error far below anything bf16 can hold next to a normal value)
    eb = tl.minimum(tl.maximum(e_biased, 22), 254)
    up = ((148 + 127 - eb) << 23).to(tl.float32, bitcast=True)  # 2**(21 - (eb - 127))
    down = ((eb - 21) << 23).to(tl.float32, bitcast=True)  # 2**((eb - 127) - 21)
    tl.store(rs_ptr + m, tl.where(finite, down, float("nan")))
    out = limbs_ptr + tl.cast(m, tl.int64) * K
    plane = tl.cast(M, tl.int64) * K
    for k0 in range(0, K, BLOCK):
        in_k = k0 + offs < K
        v = tl.load(row + (k0 + offs) * stride_xk, mask=in_k, other=0.0).to(tl.float32)
        v = tl.where(finite, v, 0.0)
        x_int = _round_half_even(v * up)
        d0 = ((x_int + 128) & 255) - 128
        x1 = (x_int - d0) >> 8
        d1 = ((x1 + 128) & 255) - 128
        d2 = (x1 - d1) >> 8
        tl.store(out + k0 + offs, d0.to(tl.int8), mask=in_k)
        tl.store(out + plane + k0 + offs, d1.to(tl.int8), mask=in_k)
        tl.store(out + 2 * plane + k0 + offs, d2.to(tl.int8), mask=in_k)


@triton.jit
def woq_limb_mm_kernel(
    l_ptr, rs_ptr, w_ptr, ws_ptr, b_ptr, out_ptr,
    M, N, K,
    stride_wn, stride_wk, stride_ws, stride_b, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, ROUND_WS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """out[M, N] = x @ (w int8 [N, K] * ws[N]).T + b from x's limbs [3, M, K] (contiguous) and row scales rs[M].

    Grid (cdiv(M, BM) * cdiv(N, BN),); weight tiles are shared by GROUP_M row tiles visited together.
    """
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M  # rows past M / N re-read valid memory; the epilogue masks them
    rn = offs_n % N
    plane = tl.cast(M, tl.int64) * K
    w_ptrs = w_ptr + rn[:, None] * stride_wn + offs_k[None, :] * stride_wk
    d_ptrs = l_ptr + rm[None, :] * K + offs_k[:, None]  # digit plane 0, transposed: [BK, BM]
    acc0 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    acc1 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            w = tl.load(w_ptrs + k0 * stride_wk)
            d0 = tl.load(d_ptrs + k0)
            d1 = tl.load(d_ptrs + plane + k0)
            d2 = tl.load(d_ptrs + 2 * plane + k0)
        else:
            in_k = offs_k < K - k0
            w = tl.load(w_ptrs + k0 * stride_wk, mask=in_k[None, :], other=0)
            d0 = tl.load(d_ptrs + k0, mask=in_k[:, None], other=0)
            d1 = tl.load(d_ptrs + plane + k0, mask=in_k[:, None], other=0)
            d2 = tl.load(d_ptrs + 2 * plane + k0, mask=in_k[:, None], other=0)
        acc0 = tl.dot(w, d0, acc0, out_dtype=tl.int32)
        acc1 = tl.dot(w, d1, acc1, out_dtype=tl.int32)
        acc2 = tl.dot(w, d2, acc2, out_dtype=tl.int32)
    # (P2 * 2**16 + P1 * 2**8) + P0 in fp32: P2 * 2**16 and P1 * 2**8 are exact scalings of one rounding each
    acc_t = (acc2.to(tl.float32) * 65536.0 + acc1.to(tl.float32) * 256.0) + acc0.to(tl.float32)
    acc = tl.trans(acc_t)  # [BM, BN]
    mask_m = offs_m < M
    mask_n = offs_n < N
    rs = tl.load(rs_ptr + rm)
    ws = load_scale(ws_ptr + rn * stride_ws, mask_n, ROUND_WS)
    val = acc * rs[:, None] * ws[None, :]
    if HAS_BIAS:
        val = val + tl.load(b_ptr + rn * stride_b).to(tl.float32)[None, :]
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(ptrs, val.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


__all__ = ["MAX_K", "woq_limb_mm_kernel", "x_limbs_kernel"]
