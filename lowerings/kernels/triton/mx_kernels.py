"""Triton kernels for MX linears on GPUs without MX tensor cores (Hopper and older): y = A @ W.T [+ bias].

All quantized inputs arrive as uint8 (fp8 bytes, packed e2m1 bytes, e8m0 codes) and are bitcast here, so the
kernels see no dtype Triton or Inductor may not know. Formats (constexpr): 0 float activation, 1 e4m3,
2 e5m2, 3 e2m1 (two per byte, even element in the low nibble). Scales: plain (any strides) or swizzled
(cuBLAS 128x4 tiles, `patterns/mx_format.swizzle_offsets`).

e2m1 -> e4m3 costs four integer ops and is exact up to a factor 2**6 (folded into the block scale): the
e2m1 bits s.e1e0.m moved to e4m3's s.0e1e0.m00 read as (e4m3 value) = (e2m1 value) / 64 for every code,
subnormal 0.5 included. So fp4 rides the fp8 tensor cores and the hardware fp8 converts.

- `mx_gemv_kernel`: memory-bound, small M. One program = BLOCK_N weight rows of one output row; products in
  fp32, reduced per 32-block, times the block scale.
- `mx_mm_kernel`: tiles. FP8_MMA: both operands fp8-coded, one fp8 tensor-core dot per 32-wide K chunk,
  scaled in fp32 (scales are powers of two: exact). Otherwise (weight-only, or mixed formats): operands
  decoded to bf16/fp16 with their scales applied (exact: 3-bit mantissas times powers of two) and one dot
  per BLOCK_K.
"""

import triton
import triton.language as tl

FLOAT, E4M3, E5M2, E2M1 = 0, 1, 2, 3


@triton.jit
def _scale_f32(code):
    """e8m0 code -> 2 ** (code - 127) as fp32 (0 -> 2**-127, 255 -> NaN), from the bits."""
    c = code.to(tl.int32)
    bits = tl.where(c == 0, 0x00400000, tl.where(c == 255, 0x7FC00000, c << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _scale_offsets(rows, kb, stride_r, stride_c, cols_pad, SWIZZLED: tl.constexpr):
    if SWIZZLED:
        return (
            ((rows // 128) * (cols_pad // 4) + kb // 4) * 512
            + (rows % 32) * 16
            + (rows % 128 // 32) * 4
            + kb % 4
        )
    else:
        return rows * stride_r + kb * stride_c


@triton.jit
def _e2m1_pair_to_e4m3(b):
    """Packed bytes -> (low-nibble, high-nibble) elements as e4m3 bytes worth value / 64."""
    b = b.to(tl.int32)
    lo = ((b & 7) << 2) | ((b & 8) << 4)
    hi = ((b >> 2) & 0x1C) | (b & 0x80)
    return lo.to(tl.uint8), hi.to(tl.uint8)


@triton.jit
def _as_fp8(b, FMT: tl.constexpr):
    if FMT == 2:
        return b.to(tl.float8e5, bitcast=True)
    else:
        return b.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _load_fp8_tile(ptr, rows, row_mask, k0, K, stride_r, stride_k, FMT: tl.constexpr, BK: tl.constexpr):
    """[R, BK] elements of rows `rows`, K offset k0, as an fp8 tensor (e2m1 decoded to e4m3 / 64)."""
    if FMT == 3:
        HALF: tl.constexpr = BK // 2
        j = k0 // 2 + tl.arange(0, HALF)
        mask = row_mask[:, None] & (j < K // 2)[None, :]
        b = tl.load(ptr + rows[:, None] * stride_r + j[None, :] * stride_k, mask=mask, other=0)
        lo, hi = _e2m1_pair_to_e4m3(b)
        x = tl.reshape(tl.join(lo, hi), (rows.shape[0], BK))
        return x.to(tl.float8e4nv, bitcast=True)
    else:
        kk = k0 + tl.arange(0, BK)
        mask = row_mask[:, None] & (kk < K)[None, :]
        b = tl.load(ptr + rows[:, None] * stride_r + kk[None, :] * stride_k, mask=mask, other=0)
        return _as_fp8(b, FMT)


@triton.jit
def _fold(FMT: tl.constexpr):
    """The factor an fp8-coded element of format FMT must be multiplied by (2**6 for e2m1 as e4m3)."""
    if FMT == 3:
        return 64.0
    else:
        return 1.0


@triton.jit
def _load_scales(ptr, rows, row_mask, kb, nkb, stride_r, stride_c, cols_pad, SWIZZLED: tl.constexpr):
    """fp32 block scales [R, len(kb)] (times nothing: the e2m1 fold is applied by the caller)."""
    offs = _scale_offsets(rows[:, None], kb[None, :], stride_r, stride_c, cols_pad, SWIZZLED)
    code = tl.load(ptr + offs, mask=row_mask[:, None] & (kb < nkb)[None, :], other=127)
    return _scale_f32(code)


@triton.jit
def _load_dequant_tile(
    ptr, s_ptr, rows, row_mask, k0, K, stride_r, stride_k, stride_sr, stride_sc, s_cols_pad,
    FMT: tl.constexpr, SWIZZLED: tl.constexpr, DOT_DTYPE: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    """[R, BK] true values in DOT_DTYPE: a float tile loaded as is, an MX tile decoded and scaled (exact)."""
    if FMT == 0:
        kk = k0 + tl.arange(0, BK)
        mask = row_mask[:, None] & (kk < K)[None, :]
        return tl.load(ptr + rows[:, None] * stride_r + kk[None, :] * stride_k, mask=mask, other=0).to(
            DOT_DTYPE
        )
    else:
        NB: tl.constexpr = BK // 32
        v = _load_fp8_tile(ptr, rows, row_mask, k0, K, stride_r, stride_k, FMT, BK).to(tl.float32)
        kb = k0 // 32 + tl.arange(0, NB)
        s = _load_scales(s_ptr, rows, row_mask, kb, K // 32, stride_sr, stride_sc, s_cols_pad, SWIZZLED)
        s = s * _fold(FMT)
        v = tl.reshape(tl.reshape(v, (rows.shape[0], NB, 32)) * s[:, :, None], (rows.shape[0], BK))
        return v.to(DOT_DTYPE)


@triton.jit
def _load_act_vec(
    a_ptr, as_ptr, m, kk, K, stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    A_FMT: tl.constexpr, A_SWZ: tl.constexpr,
):  # fmt: skip
    """True fp32 values of activation row m at positions kk (any order)."""
    mask = kk < K
    if A_FMT == 0:
        return tl.load(a_ptr + m * stride_am + kk * stride_ak, mask=mask, other=0).to(tl.float32)
    else:
        if A_FMT == 3:
            b = tl.load(a_ptr + m * stride_am + (kk // 2) * stride_ak, mask=mask, other=0).to(tl.int32)
            nib = (b >> ((kk % 2) * 4)) & 15
            e4 = ((nib & 7) << 2) | ((nib & 8) << 4)
            v = e4.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0
        else:
            b = tl.load(a_ptr + m * stride_am + kk * stride_ak, mask=mask, other=0)
            v = _as_fp8(b, A_FMT).to(tl.float32)
        offs = _scale_offsets(m, kk // 32, stride_asm, stride_ask, as_cols_pad, A_SWZ)
        return v * _scale_f32(tl.load(as_ptr + offs, mask=mask, other=127))


@triton.jit
def mx_gemv_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
    stride_om, stride_on,
    A_FMT: tl.constexpr, W_FMT: tl.constexpr, A_SWZ: tl.constexpr, W_SWZ: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    NB: tl.constexpr = BLOCK_K // 32
    acc = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if W_FMT == 3:
            HALF: tl.constexpr = BLOCK_K // 2
            j = tl.arange(0, HALF)
            kk = k0 + 2 * j
            x_even = _load_act_vec(a_ptr, as_ptr, m, kk, K, stride_am, stride_ak, stride_asm, stride_ask,
                                   as_cols_pad, A_FMT, A_SWZ)  # fmt: skip
            x_odd = _load_act_vec(a_ptr, as_ptr, m, kk + 1, K, stride_am, stride_ak, stride_asm, stride_ask,
                                  as_cols_pad, A_FMT, A_SWZ)  # fmt: skip
            jj = k0 // 2 + j
            mask = n_mask[:, None] & (jj < K // 2)[None, :]
            b = tl.load(w_ptr + rn[:, None] * stride_wn + jj[None, :] * stride_wk, mask=mask, other=0)
            lo, hi = _e2m1_pair_to_e4m3(b)
            lo = lo.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            hi = hi.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            prod = lo * x_even[None, :] + hi * x_odd[None, :]
            part = tl.sum(tl.reshape(prod, (BLOCK_N, NB, 16)), axis=2)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            x = _load_act_vec(a_ptr, as_ptr, m, kk, K, stride_am, stride_ak, stride_asm, stride_ask,
                              as_cols_pad, A_FMT, A_SWZ)  # fmt: skip
            mask = n_mask[:, None] & (kk < K)[None, :]
            b = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :] * stride_wk, mask=mask, other=0)
            prod = _as_fp8(b, W_FMT).to(tl.float32) * x[None, :]
            part = tl.sum(tl.reshape(prod, (BLOCK_N, NB, 32)), axis=2)
        kb = k0 // 32 + tl.arange(0, NB)
        acc += part * _load_scales(
            ws_ptr, rn, n_mask, kb, K // 32, stride_wsn, stride_wsk, ws_cols_pad, W_SWZ
        )
    out = tl.sum(acc, axis=1) * _fold(W_FMT)
    if HAS_BIAS:
        out += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rn * stride_on, out.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def mx_mm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
    stride_om, stride_on,
    A_FMT: tl.constexpr, W_FMT: tl.constexpr, A_SWZ: tl.constexpr, W_SWZ: tl.constexpr,
    HAS_BIAS: tl.constexpr, FP8_MMA: tl.constexpr, DOT_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = rm < M
    n_mask = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    DOT_DTYPE: tl.constexpr = tl.bfloat16 if DOT_BF16 else tl.float16
    for k0 in range(0, K, BLOCK_K):
        if FP8_MMA:
            for j in tl.static_range(BLOCK_K // 32):
                kc = k0 + j * 32
                a = _load_fp8_tile(a_ptr, rm, m_mask, kc, K, stride_am, stride_ak, A_FMT, 32)
                w = _load_fp8_tile(w_ptr, rn, n_mask, kc, K, stride_wn, stride_wk, W_FMT, 32)
                p = tl.dot(a, tl.trans(w))
                kb = kc // 32
                sa_off = _scale_offsets(rm, kb, stride_asm, stride_ask, as_cols_pad, A_SWZ)
                sw_off = _scale_offsets(rn, kb, stride_wsn, stride_wsk, ws_cols_pad, W_SWZ)
                sa_mask = m_mask & ((rm * 0 + kb) < K // 32)
                sw_mask = n_mask & ((rn * 0 + kb) < K // 32)
                sa = _scale_f32(tl.load(as_ptr + sa_off, mask=sa_mask, other=127))
                sw = _scale_f32(tl.load(ws_ptr + sw_off, mask=sw_mask, other=127))
                acc += p * sa[:, None] * sw[None, :]
        else:
            a = _load_dequant_tile(a_ptr, as_ptr, rm, m_mask, k0, K, stride_am, stride_ak, stride_asm, stride_ask,
                                   as_cols_pad, A_FMT, A_SWZ, DOT_DTYPE, BLOCK_K)  # fmt: skip
            w = _load_dequant_tile(w_ptr, ws_ptr, rn, n_mask, k0, K, stride_wn, stride_wk, stride_wsn, stride_wsk,
                                   ws_cols_pad, W_FMT, W_SWZ, DOT_DTYPE, BLOCK_K)  # fmt: skip
            acc = tl.dot(a, tl.trans(w), acc)
    if FP8_MMA:
        acc = acc * (_fold(A_FMT) * _fold(W_FMT))
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)[None, :]
    offs = rm[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
