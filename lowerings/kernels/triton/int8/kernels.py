"""The Triton kernels: an FMA GEMV for woq-int8 at tiny M, and one tiled tensor-core kernel for both families.

Why two: at M <= a few rows a linear is a pass over the int8 weight, and the cheapest way through it is
multiply-add on CUDA cores (no padding to a 16-row MMA tile, no layout change for the tensor cores). From ~8
rows on, the tensor cores are needed; `qlinear_mm_kernel` serves woq-int8 (bf16/fp16 activations, int8 weight
converted in the main loop) and dynamic-int8 (int8 x int8 -> int32) with one epilogue: per-channel weight
scale, optional per-token activation scale, bias, cast. `SWAP_AB` computes out^T = W x^T so a skinny M
becomes the MMA's N dimension (wgmma needs 64 rows in M, allows 8 in N).

Importing this module imports Triton: only `qlower.lowerings.kernels.triton.int8.ops` does, and only when used.
"""

from __future__ import annotations

import triton
import triton.language as tl

from qlower.lowerings.kernels.triton import one_line


@triton.jit
def _int8_to_f32(w, FAST_CVT: tl.constexpr):
    """int8 -> fp32, exactly.

    FAST_CVT: (2^23 + 128 + v) has the bits 0x4B000080 + v, so one integer add and one float subtract replace
    the I2F instruction, whose throughput (16/clk/SM on sm_80/sm_90) caps a GEMV over the weight.
    """
    if FAST_CVT:
        bits = w.to(tl.int32) + 0x4B000080
        return bits.to(tl.float32, bitcast=True) - 8388736.0
    else:
        return w.to(tl.float32)


def _ptx_int8_to_bf16(pairs: int) -> str:
    """int8 -> bf16, exact, for `pairs` bf16 pairs (1: two int8 in a 16-bit register; 2: four in a 32-bit one).

    Each 16-bit lane gets the exponent byte 0x43 above its int8 byte (one prmt per pair): bf16 0x43 | b is
    128 + (b & 0x7F) once the sign bit is masked off (and), and 0x43 | (b & 0x80) is 128 + 128 * sign (lop3);
    their difference (one bf16x2 fma) is the int8 value. 4 instructions per pair.
    """
    src = "$2" if pairs == 2 else "t"
    lines = [".reg .b32 t, c, m, p0, p1, a, b;", "mov.b32 c, 0x43434343;", "mov.b32 m, 0xBF80BF80;"]
    lines += ["cvt.u32.u16 t, $1;"] if pairs == 1 else []
    lines += [f"prmt.b32 p{i}, {src}, c, {0x4140 + 0x202 * i:#x};" for i in range(pairs)]  # input read first
    for i in range(pairs):
        lines += [
            f"and.b32 a, p{i}, 0xFF7FFF7F;",
            f"lop3.b32 b, p{i}, 0x00800080, 0x43004300, 0xEA;",
            f"fma.rn.bf16x2 ${i}, b, m, a;",
        ]
    return one_line("{\n" + "\n".join(lines) + "\n}")


def _ptx_int8_to_f16(pairs: int) -> str:
    """int8 -> fp16, exact: fp16 0x64 | (b ^ 0x80) is 1024 + 128 + v; one xor, a prmt and an f16x2 sub per pair."""
    lines = [".reg .b32 t, c, m, p;", "mov.b32 c, 0x64646464;", "mov.b32 m, 0x64806480;"]
    lines += ["cvt.u32.u16 t, $1;", "xor.b32 t, t, 0x8080;"] if pairs == 1 else ["xor.b32 t, $2, 0x80808080;"]
    for i in range(pairs):
        lines += [f"prmt.b32 p, t, c, {0x4140 + 0x202 * i:#x};", f"sub.f16x2 ${i}, p, m;"]
    return one_line("{\n" + "\n".join(lines) + "\n}")


_ASM_I8X4_BF16 = tl.constexpr(_ptx_int8_to_bf16(2))
_ASM_I8X2_BF16 = tl.constexpr(_ptx_int8_to_bf16(1))
_ASM_I8X4_F16 = tl.constexpr(_ptx_int8_to_f16(2))
_ASM_I8X2_F16 = tl.constexpr(_ptx_int8_to_f16(1))


@triton.jit
def _int8_to(w, dtype: tl.constexpr, FAST_CVT: tl.constexpr):
    """int8 -> `dtype` (a dot operand), exactly. FAST_CVT 1: through fp32 by the magic number (integers
    |v| <= 128 are exact in bf16); 2 / 3: straight to bf16 / fp16 by inline PTX, 2 instructions per element,
    on 4 / 2 elements per asm call (CUDA only; fp32 takes 1). 3 suits the swap-AB wgmma, whose register
    operand holds the weight as 2-byte pieces: 4 per call makes Triton pack bytes first."""
    if FAST_CVT == 2 and dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(
            _ASM_I8X4_BF16, "=r,=r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=4
        )
    elif FAST_CVT == 2 and dtype == tl.float16:
        return tl.inline_asm_elementwise(
            _ASM_I8X4_F16, "=r,=r,r", [w], dtype=tl.float16, is_pure=True, pack=4
        )
    elif FAST_CVT == 3 and dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_ASM_I8X2_BF16, "=r,h", [w], dtype=tl.bfloat16, is_pure=True, pack=2)
    elif FAST_CVT == 3 and dtype == tl.float16:
        return tl.inline_asm_elementwise(_ASM_I8X2_F16, "=r,h", [w], dtype=tl.float16, is_pure=True, pack=2)
    elif FAST_CVT:
        return _int8_to_f32(w, True).to(dtype)
    else:
        return w.to(dtype)


@triton.jit
def load_scale(ptrs, mask, ROUND_WS: tl.constexpr):
    """The weight scale as fp32. ROUND_WS 1 / 2: the fp32 scale is first rounded to bf16 / fp16 (to nearest
    even, as the graph's fp32 -> dtype convert rounds; Triton's default for a float downcast), so a kernel
    given torchao's fp32 scale computes with the very bf16/fp16 scale the graph's cast would have made
    (`ops.round_code`; tests/lowerings/kernels/test_scale_cast.py)."""
    s = tl.load(ptrs, mask=mask, other=0.0)
    if ROUND_WS == 1:
        s = s.to(tl.bfloat16)
    elif ROUND_WS == 2:
        s = s.to(tl.float16)
    return s.to(tl.float32)


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Program id -> (row tile, column tile), visiting GROUP_M row tiles per column tile in turn, so a weight
    tile is reused from L2 by the row tiles that need it while it is hot."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(
    acc,
    offs_m,
    offs_n,
    M,
    N,
    pid_k,
    ws_ptr,
    stride_ws,
    xs_ptr,
    stride_xs,
    b_ptr,
    stride_b,
    out_ptr,
    stride_om,
    stride_on,
    HAS_XS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    ROUND_WS: tl.constexpr,
):
    """acc [BLOCK_M, BLOCK_N] fp32 -> out = acc * w_scale[n] (* x_scale[m]) (+ bias[n]), cast once."""
    mask_m = offs_m < M
    mask_n = offs_n < N
    ws = load_scale(ws_ptr + offs_n * stride_ws, mask_n, ROUND_WS)
    val = acc * ws[None, :]
    if HAS_XS:
        xs = tl.load(xs_ptr + offs_m * stride_xs, mask=mask_m, other=0.0).to(tl.float32)
        val = val * xs[:, None]
    if HAS_BIAS:
        b = tl.load(b_ptr + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)
        if SPLIT_K > 1:
            b = b * (pid_k == 0).to(tl.float32)  # only the first K slice adds the bias
        val = val + b[None, :]
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K > 1:
        tl.atomic_add(ptrs, val, mask=mask)  # out is an fp32 buffer of zeros
    else:
        tl.store(ptrs, val.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def woq_int8_gemv_kernel(
    x_ptr,
    w_ptr,
    ws_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_ws,
    stride_b,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    FAST_CVT: tl.constexpr,
    ROUND_WS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[M, N] = x[M, K] @ (w[N, K] int8).T * ws[N] + b[N]; grid (cdiv(N, BN), cdiv(M, BM), SPLIT_K).

    Each program streams a [BLOCK_N, K] slab of the weight (K contiguous: 16-byte loads) and keeps
    [BLOCK_M, BLOCK_N, BLOCK_K] partial sums in registers, reduced over K once at the end.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M  # rows past M/N re-read valid memory; the epilogue masks them
    rn = offs_n % N
    x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + rn[:, None] * stride_wn + offs_k[None, :] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kt in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K):
        k0 = kt * BLOCK_K
        if EVEN_K:
            x = tl.load(x_ptrs + k0 * stride_xk)
            w = tl.load(w_ptrs + k0 * stride_wk)
        else:
            in_k = offs_k < K - k0
            x = tl.load(x_ptrs + k0 * stride_xk, mask=in_k[None, :], other=0.0)
            w = tl.load(w_ptrs + k0 * stride_wk, mask=in_k[None, :], other=0)
        wf = _int8_to_f32(w, FAST_CVT)
        acc += x.to(tl.float32)[:, None, :] * wf[None, :, :]
    out = tl.sum(acc, axis=2)
    _epilogue(
        out,
        offs_m,
        offs_n,
        M,
        N,
        pid_k,
        ws_ptr,
        stride_ws,
        ws_ptr,
        0,
        b_ptr,
        stride_b,
        out_ptr,
        stride_om,
        stride_on,
        False,
        HAS_BIAS,
        SPLIT_K,
        ROUND_WS,
    )


@triton.jit
def qlinear_mm_kernel(
    a_ptr,
    w_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_wn,
    stride_wk,
    stride_ws,
    stride_xs,
    stride_b,
    stride_om,
    stride_on,
    INT8_A: tl.constexpr,
    HAS_XS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SWAP_AB: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr,
    FAST_CVT: tl.constexpr,
    ROUND_WS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out[M, N] = a[M, K] @ (w[N, K] int8).T, rescaled; grid (cdiv(M, BM) * cdiv(N, BN), SPLIT_K).

    INT8_A: a is int8, the dot accumulates in int32 (dynamic-int8); else a is bf16/fp16 and the weight tile is
    converted to a's dtype in registers (woq-int8). Programs are visited in groups of GROUP_M row-tiles so a
    weight tile is reused from L2 while it is hot.
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M
    rn = offs_n % N
    acc_dtype = tl.int32 if INT8_A else tl.float32
    k_tiles = tl.cdiv(K, BLOCK_K)
    if SWAP_AB:
        # acc^T [BN, BM] = W [BN, BK] @ a^T [BK, BM]
        w_ptrs = w_ptr + rn[:, None] * stride_wn + offs_k[None, :] * stride_wk
        a_ptrs = a_ptr + rm[None, :] * stride_am + offs_k[:, None] * stride_ak
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=acc_dtype)
        for kt in range(pid_k, k_tiles, SPLIT_K):
            k0 = kt * BLOCK_K
            if EVEN_K:
                w = tl.load(w_ptrs + k0 * stride_wk)
                a = tl.load(a_ptrs + k0 * stride_ak)
            else:
                in_k = offs_k < K - k0
                w = tl.load(w_ptrs + k0 * stride_wk, mask=in_k[None, :], other=0)
                a = tl.load(a_ptrs + k0 * stride_ak, mask=in_k[:, None], other=0)
            if INT8_A:
                acc_t = tl.dot(w, a, acc_t, out_dtype=tl.int32)
            else:
                acc_t = tl.dot(_int8_to(w, a.dtype, FAST_CVT), a, acc_t)
        acc = tl.trans(acc_t.to(tl.float32))
    else:
        # acc [BM, BN] = a [BM, BK] @ W^T [BK, BN]
        a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
        w_ptrs = w_ptr + rn[None, :] * stride_wn + offs_k[:, None] * stride_wk
        acc_mn = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_dtype)
        for kt in range(pid_k, k_tiles, SPLIT_K):
            k0 = kt * BLOCK_K
            if EVEN_K:
                a = tl.load(a_ptrs + k0 * stride_ak)
                w = tl.load(w_ptrs + k0 * stride_wk)
            else:
                in_k = offs_k < K - k0
                a = tl.load(a_ptrs + k0 * stride_ak, mask=in_k[None, :], other=0)
                w = tl.load(w_ptrs + k0 * stride_wk, mask=in_k[:, None], other=0)
            if INT8_A:
                acc_mn = tl.dot(a, w, acc_mn, out_dtype=tl.int32)
            else:
                acc_mn = tl.dot(a, _int8_to(w, a.dtype, FAST_CVT), acc_mn)
        acc = acc_mn.to(tl.float32)
    _epilogue(
        acc,
        offs_m,
        offs_n,
        M,
        N,
        pid_k,
        ws_ptr,
        stride_ws,
        xs_ptr,
        stride_xs,
        b_ptr,
        stride_b,
        out_ptr,
        stride_om,
        stride_on,
        HAS_XS,
        HAS_BIAS,
        SPLIT_K,
        ROUND_WS,
    )


@triton.jit
def woq_dequant_kernel(
    w_ptr, s_ptr, out_ptr, N, K,
    stride_wn, stride_wk, stride_s, stride_on, stride_ok,
    ROUND_WS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """out[N, K] = (w int8 * s[N]) in out's dtype: the weight of a dynamic-M woq launcher's cuBLAS range (M above
    the Triton kernels' crossover), built only when that range runs (its grid is gated by M)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rn[:, None] < N) & (rk[None, :] < K)
    w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk, mask=mask, other=0)
    s = load_scale(s_ptr + rn * stride_s, rn < N, ROUND_WS)
    v = w.to(tl.float32) * s[:, None]
    tl.store(
        out_ptr + rn[:, None] * stride_on + rk[None, :] * stride_ok, v.to(out_ptr.dtype.element_ty), mask=mask
    )
