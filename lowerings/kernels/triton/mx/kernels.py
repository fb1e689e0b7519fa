"""Triton kernels for MX linears on GPUs without MX tensor cores (Hopper and older): y = A @ W.T [+ bias].

All quantized inputs arrive as uint8 (fp8 bytes, packed e2m1 bytes, e8m0 codes) and are bitcast here, so the
kernels see no dtype Triton or Inductor may not know. Formats (constexpr): 0 float activation, 1 e4m3,
2 e5m2, 3 e2m1 (two per byte, even element in the low nibble). Scales: plain (any strides) or swizzled
(cuBLAS 128x4 tiles, `patterns/mx_format.swizzle_offsets`).

e2m1 -> e4m3 costs four integer ops and is exact up to a factor 2**6 (applied to a sum, or to an element
before its scale; never folded into the scale, which overflowed at codes >= 249): the
e2m1 bits s.e1e0.m moved to e4m3's s.0e1e0.m00 read as (e4m3 value) = (e2m1 value) / 64 for every code,
subnormal 0.5 included. So fp4 rides the fp8 tensor cores and the hardware fp8 converts.

- `mx_gemv_kernel`: memory-bound, small M. One program = BLOCK_N weight rows of one output row; products in
  fp32, reduced per 32-block, times the block scale.
- `mx_mm_kernel`: tiles. FP8_MMA: both operands fp8-coded, one fp8 tensor-core dot per 32-wide K chunk,
  scaled in fp32 (scales are powers of two: exact). Otherwise (weight-only, or mixed formats): operands
  decoded to bf16/fp16 with their scales applied (exact: 3-bit mantissas times powers of two) and one dot
  per BLOCK_K.

e8m0 codes 0 and 255 decode as the matched graph's decode does (constexpr A_SPECIAL / W_SPECIAL, bits
SPECIAL_ZERO / SPECIAL_INF: `_scale_f32`). A kernel that multiplies a block sum (not each element) by its scale
(the GEMV, the FP8_MMA tiles) differs from the graph where a scale is +inf: the graph's 0 * inf is NaN, and
+inf and -inf products cancel to NaN, where inf * (a finite sum) is +-inf. With SPECIAL_INF such a kernel
recomputes, scaling each element, any tile whose result is not finite (every tile a +inf scale reaches);
other tiles cost one reduction of the result.
"""

import triton
import triton.language as tl

FLOAT, E4M3, E5M2, E2M1 = 0, 1, 2, 3
# e8m0 decode flags, one constexpr per scaled operand (`qlower::mx_linear`'s a_special / w_special): where the
# matched graph's decode departs from the OCP spec (patterns/mx_format.E8M0_SPECIAL_ALTERNATIVES). SPECIAL_ZERO:
# code 0 is 0.0 (spec: 2**-127); SPECIAL_INF: code 255 is +inf (spec: NaN). Both are what `code << 23` reads as.
SPECIAL_ZERO, SPECIAL_INF = 1, 2


@triton.jit
def _scale_f32(code, SPECIAL: tl.constexpr):
    """e8m0 code -> 2 ** (code - 127) as fp32, from the bits: 0 -> 2**-127 (0.0 with SPECIAL_ZERO), 255 -> NaN
    (+inf with SPECIAL_INF)."""
    c = code.to(tl.int32)
    bits = c << 23
    if (SPECIAL & 1) == 0:
        bits = tl.where(c == 0, 0x00400000, bits)
    if (SPECIAL & 2) == 0:
        bits = tl.where(c == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _any_nonfinite(x):
    """Whether any element of the 2-D fp32 tensor x is NaN or +-inf (one scalar for the whole program)."""
    bad = ((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32)
    return tl.max(tl.max(bad, axis=1), axis=0) > 0


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
def _load_scales(ptr, rows, row_mask, kb, nkb, stride_r, stride_c, cols_pad, SWIZZLED: tl.constexpr,
                 SPECIAL: tl.constexpr):  # fmt: skip
    """fp32 block scales [R, len(kb)] (times nothing: the e2m1 fold is applied by the caller)."""
    offs = _scale_offsets(rows[:, None], kb[None, :], stride_r, stride_c, cols_pad, SWIZZLED)
    code = tl.load(ptr + offs, mask=row_mask[:, None] & (kb < nkb)[None, :], other=127)
    return _scale_f32(code, SPECIAL)


@triton.jit
def _load_dequant_tile(
    ptr, s_ptr, rows, row_mask, k0, K, stride_r, stride_k, stride_sr, stride_sc, s_cols_pad,
    FMT: tl.constexpr, SWIZZLED: tl.constexpr, SPECIAL: tl.constexpr, DOT_DTYPE: tl.constexpr, BK: tl.constexpr,
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
        s = _load_scales(
            s_ptr, rows, row_mask, kb, K // 32, stride_sr, stride_sc, s_cols_pad, SWIZZLED, SPECIAL
        )
        # the true value first (exact), then the scale: the graph's own product. Folding 2**6 into the scale
        # instead overflowed it at codes >= 249 (tests/lowerings/kernels/test_mx_triton_special.py, the
        # high-code row).
        v = v * _fold(FMT)
        v = tl.reshape(tl.reshape(v, (rows.shape[0], NB, 32)) * s[:, :, None], (rows.shape[0], BK))
        return v.to(DOT_DTYPE)


@triton.jit
def _load_act_vec(
    a_ptr, as_ptr, m, kk, K, stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    A_FMT: tl.constexpr, A_SWZ: tl.constexpr, A_SPECIAL: tl.constexpr,
):  # fmt: skip
    """True fp32 values of activation row m at positions kk (any order), each scaled."""
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
        return v * _scale_f32(tl.load(as_ptr + offs, mask=mask, other=127), A_SPECIAL)


@triton.jit
def _gemv_row(
    a_ptr, as_ptr, w_ptr, ws_ptr, m, rn, n_mask, K,
    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
    A_FMT: tl.constexpr, W_FMT: tl.constexpr, A_SWZ: tl.constexpr, W_SWZ: tl.constexpr,
    A_SPECIAL: tl.constexpr, W_SPECIAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EACH: tl.constexpr,
):  # fmt: skip
    """[BLOCK_N] fp32: activation row m times weight rows rn. Products in fp32, summed per 32-block, the sum
    times the block scale; EACH: each weight element times its scale before its product (the graph's order)."""
    NB: tl.constexpr = BLOCK_K // 32
    acc = tl.zeros((BLOCK_N, NB), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kb = k0 // 32 + tl.arange(0, NB)
        if EACH:
            s = _load_scales(
                ws_ptr, rn, n_mask, kb, K // 32, stride_wsn, stride_wsk, ws_cols_pad, W_SWZ, W_SPECIAL
            )
        if W_FMT == 3:
            HALF: tl.constexpr = BLOCK_K // 2
            j = tl.arange(0, HALF)
            kk = k0 + 2 * j
            x_even = _load_act_vec(a_ptr, as_ptr, m, kk, K, stride_am, stride_ak, stride_asm, stride_ask,
                                   as_cols_pad, A_FMT, A_SWZ, A_SPECIAL)  # fmt: skip
            x_odd = _load_act_vec(a_ptr, as_ptr, m, kk + 1, K, stride_am, stride_ak, stride_asm, stride_ask,
                                  as_cols_pad, A_FMT, A_SWZ, A_SPECIAL)  # fmt: skip
            jj = k0 // 2 + j
            mask = n_mask[:, None] & (jj < K // 2)[None, :]
            b = tl.load(w_ptr + rn[:, None] * stride_wn + jj[None, :] * stride_wk, mask=mask, other=0)
            lo, hi = _e2m1_pair_to_e4m3(b)
            lo = lo.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            hi = hi.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            if EACH:  # true value (exact: * 64), then the scale: the graph's fp32 product
                s16 = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, NB, 16)), (BLOCK_N, HALF))
                lo = lo * 64.0 * s16
                hi = hi * 64.0 * s16
            prod = lo * x_even[None, :] + hi * x_odd[None, :]
            part = tl.sum(tl.reshape(prod, (BLOCK_N, NB, 16)), axis=2)
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            x = _load_act_vec(a_ptr, as_ptr, m, kk, K, stride_am, stride_ak, stride_asm, stride_ask,
                              as_cols_pad, A_FMT, A_SWZ, A_SPECIAL)  # fmt: skip
            mask = n_mask[:, None] & (kk < K)[None, :]
            b = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :] * stride_wk, mask=mask, other=0)
            wv = _as_fp8(b, W_FMT).to(tl.float32)
            if EACH:
                wv = wv * tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, NB, 32)), (BLOCK_N, BLOCK_K))
            prod = wv * x[None, :]
            part = tl.sum(tl.reshape(prod, (BLOCK_N, NB, 32)), axis=2)
        if EACH:
            acc += part
        else:  # the scales loaded after the products: GEMV_FP4 in 128 registers, not 195 (sm_90 ptxas)
            acc += part * _load_scales(
                ws_ptr, rn, n_mask, kb, K // 32, stride_wsn, stride_wsk, ws_cols_pad, W_SWZ, W_SPECIAL
            )
    if EACH:
        return tl.sum(acc, axis=1)
    else:
        return tl.sum(acc, axis=1) * _fold(W_FMT)


@triton.jit
def mx_gemv_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
    stride_om, stride_on,
    A_FMT: tl.constexpr, W_FMT: tl.constexpr, A_SWZ: tl.constexpr, W_SWZ: tl.constexpr,
    A_SPECIAL: tl.constexpr, W_SPECIAL: tl.constexpr,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program = BLOCK_N outputs of output row m (activation scales apply per element in `_load_act_vec`;
    weight scales per block sum, recomputed per element where a +inf weight scale may be in the sum)."""
    pid_n = tl.program_id(0)
    m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    out = _gemv_row(a_ptr, as_ptr, w_ptr, ws_ptr, m, rn, n_mask, K,
                    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
                    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
                    A_FMT, W_FMT, A_SWZ, W_SWZ, A_SPECIAL, W_SPECIAL, BLOCK_N, BLOCK_K, False)  # fmt: skip
    if (W_SPECIAL & 2) != 0:
        TK: tl.constexpr = 64 if BLOCK_K > 64 else BLOCK_K  # narrower: GEMV_FP4 / GEMV_FP8 keep 128 registers
        if _any_nonfinite(out[:, None]):
            out = _gemv_row(a_ptr, as_ptr, w_ptr, ws_ptr, m, rn, n_mask, K,
                            stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
                            stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
                            A_FMT, W_FMT, A_SWZ, W_SWZ, A_SPECIAL, W_SPECIAL, BLOCK_N, TK, True)  # fmt: skip
    if HAS_BIAS:
        out += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rn * stride_on, out.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _upcast_tile_acc(
    a_ptr, as_ptr, w_ptr, ws_ptr, rm, rn, m_mask, n_mask, K,
    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
    A_FMT: tl.constexpr, W_FMT: tl.constexpr, A_SWZ: tl.constexpr, W_SWZ: tl.constexpr,
    A_SPECIAL: tl.constexpr, W_SPECIAL: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """[BLOCK_M, BLOCK_N] fp32: both operands decoded with their scales applied (exact), one dot per BLOCK_K."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = _load_dequant_tile(a_ptr, as_ptr, rm, m_mask, k0, K, stride_am, stride_ak, stride_asm, stride_ask,
                               as_cols_pad, A_FMT, A_SWZ, A_SPECIAL, DOT_DTYPE, BLOCK_K)  # fmt: skip
        w = _load_dequant_tile(w_ptr, ws_ptr, rn, n_mask, k0, K, stride_wn, stride_wk, stride_wsn, stride_wsk,
                               ws_cols_pad, W_FMT, W_SWZ, W_SPECIAL, DOT_DTYPE, BLOCK_K)  # fmt: skip
        acc = tl.dot(a, tl.trans(w), acc)
    return acc


@triton.jit
def mx_mm_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
    stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
    stride_om, stride_on,
    A_FMT: tl.constexpr, W_FMT: tl.constexpr, A_SWZ: tl.constexpr, W_SWZ: tl.constexpr,
    A_SPECIAL: tl.constexpr, W_SPECIAL: tl.constexpr,
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
    DOT_DTYPE: tl.constexpr = tl.bfloat16 if DOT_BF16 else tl.float16
    if FP8_MMA:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
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
                sa = _scale_f32(tl.load(as_ptr + sa_off, mask=sa_mask, other=127), A_SPECIAL)
                sw = _scale_f32(tl.load(ws_ptr + sw_off, mask=sw_mask, other=127), W_SPECIAL)
                acc += p * sa[:, None] * sw[None, :]
        acc = acc * (_fold(A_FMT) * _fold(W_FMT))
        if ((A_SPECIAL | W_SPECIAL) & 2) != 0:  # scales per chunk sum: a +inf one needs them per element
            # (32-wide K steps: MM_FP8_SMALL / LARGE spill about as much as without the recompute, sm_90 ptxas)
            if _any_nonfinite(acc):
                acc = _upcast_tile_acc(a_ptr, as_ptr, w_ptr, ws_ptr, rm, rn, m_mask, n_mask, K,
                                       stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
                                       stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
                                       A_FMT, W_FMT, A_SWZ, W_SWZ, A_SPECIAL, W_SPECIAL, DOT_DTYPE,
                                       BLOCK_M, BLOCK_N, 32)  # fmt: skip
    else:
        acc = _upcast_tile_acc(a_ptr, as_ptr, w_ptr, ws_ptr, rm, rn, m_mask, n_mask, K,
                               stride_am, stride_ak, stride_asm, stride_ask, as_cols_pad,
                               stride_wn, stride_wk, stride_wsn, stride_wsk, ws_cols_pad,
                               A_FMT, W_FMT, A_SWZ, W_SWZ, A_SPECIAL, W_SPECIAL, DOT_DTYPE,
                               BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_mask, other=0).to(tl.float32)[None, :]
    offs = rm[:, None] * stride_om + rn[None, :] * stride_on
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
