"""Decode-size (M <= 16) weight-only int8 kernel. `ops.woq_int8_linear` launches `woq_decode_kernel` where
`configs.WOQ_INT8_TABLE` / its decode rule pick a "decode" config. (The M <= 16 kernel sweeps also timed split-K
forms of it; no config picked them, so they are not kept.)

At decode sizes a woq-int8 linear is one pass over the int8 weight, so the kernel must keep enough bytes in
flight per SM to run near HBM bandwidth, spend few instructions per weight byte, and leave no half-empty
last wave on 132 SMs. One kernel, `woq_decode_kernel`, covers the variants those sweeps timed:

- USE_DOT=False: FMA on CUDA cores (M <= 4): a [BLOCK_N, BLOCK_K] int8 tile, 16-byte loads along K, reduced
  along K every step (BLOCK_K <= 512 keeps that inside a warp) or, for one row, kept as a 2-D accumulator
  reduced once (ACC3); x is read as a row broadcast to the tile's shape so it shares the tile's register
  layout (else Triton moves the converted tile through shared memory each step); optional register prefetch
  of the next tile (PREFETCH) so a warp's next loads are in flight while it computes.
- USE_DOT=True: swap-AB tensor cores, acc^T [BLOCK_N, BLOCK_M] = W [BLOCK_N, BLOCK_K] @ x^T; the weight is
  read once for all M <= BLOCK_M rows.
- CVT: int8 -> fp32 by I2F (0), by the 0x4B000080 magic in Triton ops (1), or by inline PTX (2): one xor per
  4 bytes, one prmt per byte (byte into the low mantissa under exponent 0x4B), one fsub. The dot path also
  takes 3: int8 -> bf16/fp16 directly by inline PTX (two bf16 pairs per 4 bytes, 2 instructions per element);
  the FMA path, which works in fp32, reads 3 as 2.

Grid (cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), 1): M enters only as a kernel argument and a grid size, so the
launch works with a symbolic M inside a `torch.library.triton_op`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from qlower.lowerings.kernels.triton import one_line
from qlower.lowerings.kernels.triton.int8.kernels import _int8_to, load_scale

# 4 int8 (one 32-bit register, byte i = element i) -> 4 fp32, exact: (0x4B0000 << 8 | (v ^ 0x80)) - (2^23 + 128)
_ASM_I8_F32 = tl.constexpr(
    one_line(
        "{\n"
        ".reg .b32 t, m;\n"
        "xor.b32 t, $4, 0x80808080;\n"
        "mov.b32 m, 0x4B000000;\n"
        "prmt.b32 $0, t, m, 0x7540;\n"
        "prmt.b32 $1, t, m, 0x7541;\n"
        "prmt.b32 $2, t, m, 0x7542;\n"
        "prmt.b32 $3, t, m, 0x7543;\n"
        "sub.f32 $0, $0, 0f4B000080;\n"
        "sub.f32 $1, $1, 0f4B000080;\n"
        "sub.f32 $2, $2, 0f4B000080;\n"
        "sub.f32 $3, $3, 0f4B000080;\n"
        "}"
    )
)


@triton.jit
def _w_f32(w, CVT: tl.constexpr):
    """int8 -> fp32 exactly; CVT picks the instruction sequence (see the module docstring; 3 reads as 2)."""
    if CVT >= 2:
        return tl.inline_asm_elementwise(
            _ASM_I8_F32, "=r,=r,=r,=r,r", [w], dtype=tl.float32, is_pure=True, pack=4
        )
    elif CVT == 1:
        bits = w.to(tl.int32) + 0x4B000080
        return bits.to(tl.float32, bitcast=True) - 8388736.0
    else:
        return w.to(tl.float32)


@triton.jit
def _w_to(w, dtype: tl.constexpr, CVT: tl.constexpr):
    """int8 -> a dot operand dtype; CVT 1/2 go through exact fp32 (integers |v| <= 128 are exact in bf16),
    3 converts straight to bf16/fp16 by inline PTX (`kernels._int8_to`, 2 instructions per element)."""
    if CVT == 0:
        return w.to(dtype)
    elif CVT == 3:
        return _int8_to(w, dtype, 2)
    else:
        return _w_f32(w, CVT).to(dtype)


@triton.jit
def _finish(
    acc,
    offs_m,
    offs_n,
    M,
    N,
    ws_ptr,
    stride_ws,
    b_ptr,
    stride_b,
    out_ptr,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
    ROUND_WS: tl.constexpr,
):
    """acc [BM, BN] fp32 (the full K sum) -> out = acc * ws[n] + b[n], cast to out's dtype."""
    mask_n = offs_n < N
    ws = load_scale(ws_ptr + offs_n * stride_ws, mask_n, ROUND_WS)
    val = acc * ws[None, :]
    if HAS_BIAS:
        b = tl.load(b_ptr + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)
        val = val + b[None, :]
    mask = (offs_m < M)[:, None] & mask_n[None, :]
    ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(ptrs, val.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_ahead(w_ptrs, offs_k, k1, k_hi, K, stride_wk, EVEN_K: tl.constexpr, EVICT: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """The weight tile at k1, for register prefetch. EVEN_K: no mask (a mask not uniform over 16 bytes would
    break the vector loads); k1 past the range is clamped to the last tile, a cache hit."""
    if EVEN_K:
        k_safe = tl.maximum(tl.minimum(k1, k_hi - BLOCK_K), 0)
        return tl.load(w_ptrs + k_safe * stride_wk, eviction_policy=EVICT)
    else:
        ok = (offs_k < K - k1)[None, :] & ((tl.zeros((BLOCK_N, BLOCK_K), tl.int32) + k1) < k_hi)
        return tl.load(w_ptrs + k1 * stride_wk, mask=ok, other=0, eviction_policy=EVICT)


@triton.jit
def woq_decode_kernel(
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
    USE_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    CVT: tl.constexpr,
    EVICT: tl.constexpr,
    ACC3: tl.constexpr,
    PREFETCH: tl.constexpr,
    ROUND_WS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[M, N] = x[M, K] @ (w[N, K] int8).T * ws[N] + b[N]; program (n tile, m tile), the whole K."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rm = offs_m % M  # rows past M / N re-read valid memory; stores are masked
    rn = offs_n % N
    k_lo = 0
    k_hi = K
    w_ptrs = w_ptr + rn[:, None] * stride_wn + offs_k[None, :] * stride_wk
    if USE_DOT:
        x_ptrs = x_ptr + rm[None, :] * stride_xm + offs_k[:, None] * stride_xk  # x^T [BK, BM]
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_ptrs + k0 * stride_wk, eviction_policy=EVICT)
                xt = tl.load(x_ptrs + k0 * stride_xk)
            else:
                in_k = offs_k < K - k0
                w = tl.load(w_ptrs + k0 * stride_wk, mask=in_k[None, :], other=0, eviction_policy=EVICT)
                xt = tl.load(x_ptrs + k0 * stride_xk, mask=in_k[:, None], other=0.0)
            acc_t = tl.dot(_w_to(w, xt.dtype, CVT), xt, acc_t)
        acc = tl.trans(acc_t)
    else:
        # x is loaded as a [BN, BK] tile (the row broadcast over N) so that it gets the weight tile's
        # register layout: with a [1, BK] load Triton picked x's layout and moved the whole converted
        # weight tile through shared memory every step. Repeated addresses within a thread are one load.
        x_row = x_ptr + offs_k[None, :] * stride_xk + tl.zeros((BLOCK_N, 1), dtype=tl.int32)
        cols = tl.arange(0, BLOCK_M)
        if ACC3 and BLOCK_M == 1:  # one row: [BN, BK] partial sums, reduced once at the end (ACC3 needs BM 1)
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        else:
            acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if PREFETCH:  # the next tile is loaded one step ahead; past the range re-read the last valid tile
            w_nxt = _load_ahead(w_ptrs, offs_k, k_lo, k_hi, K, stride_wk, EVEN_K, EVICT, BLOCK_N, BLOCK_K)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            if PREFETCH:
                w = w_nxt
                w_nxt = _load_ahead(w_ptrs, offs_k, k0 + BLOCK_K, k_hi, K, stride_wk, EVEN_K, EVICT, BLOCK_N,
                                    BLOCK_K)  # fmt: skip
            else:
                if EVEN_K:
                    w = tl.load(w_ptrs + k0 * stride_wk, eviction_policy=EVICT)
                else:
                    in_k = offs_k < K - k0
                    w = tl.load(w_ptrs + k0 * stride_wk, mask=in_k[None, :], other=0, eviction_policy=EVICT)
            wf = _w_f32(w, CVT)
            for mm in tl.static_range(BLOCK_M):  # the converted tile serves every row
                row = (pid_m * BLOCK_M + mm) % M
                if EVEN_K:
                    xm = tl.load(x_row + row * stride_xm + k0 * stride_xk)
                else:
                    xm = tl.load(x_row + row * stride_xm + k0 * stride_xk, mask=(offs_k < K - k0)[None, :],
                                 other=0.0)  # fmt: skip
                if ACC3 and BLOCK_M == 1:
                    acc2 += wf * xm.to(tl.float32)
                else:
                    part_sum = tl.sum(wf * xm.to(tl.float32), axis=1)
                    if BLOCK_M == 1:
                        acc_t += part_sum[:, None]
                    else:
                        acc_t += tl.where(cols[None, :] == mm, part_sum[:, None], 0.0)
        if ACC3 and BLOCK_M == 1:
            acc_t = tl.sum(acc2, axis=1)[:, None]
        acc = tl.trans(acc_t)

    _finish(acc, offs_m, offs_n, M, N, ws_ptr, stride_ws, b_ptr, stride_b, out_ptr, stride_om, stride_on,
            HAS_BIAS, ROUND_WS)  # fmt: skip
