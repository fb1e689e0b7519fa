"""Hopper (sm_90) int8 x int8 -> int32 GEMM with the dynamic-int8 epilogue, fed by the TMA copy engine.

Why a second int8 kernel: `kernels.qlinear_mm_kernel` builds every tile's addresses with pointer
arithmetic and one program per output tile. On sm_90 at M=4096, 4096->14336 it reaches ~1090 int8 TOP/s (55% of
peak; the TMA kernel here 1407, BENCHMARKS.md, "CUDA, dynamic_int8"). The kernels here move the operand tiles
with TMA (one thread issues a bulk copy, no address registers, swizzled shared memory that wgmma reads
directly) and can run persistently: a grid of one program per SM walks the output tiles in grouped order, so
the next tile's loads start while this tile's epilogue runs (`FLATTEN` lets Triton's pipeliner cross the tile
boundary) and no wave quantization tail is left.

The entry point, `int8_mm_tma_dev_kernel`, takes plain pointers and builds the descriptors on the device
(`tl.make_tensor_descriptor`); Triton then needs a global scratch buffer per launch, obtained through
`triton.set_allocator` (Inductor installs one when it launches kernels; eager callers must set one). The
body, `_mm_tiles`, also served a host-descriptor entry point (`TensorDescriptor` built on the host) in the
TMA sweep; torch 2.11 cannot trace one through a triton_op (Inductor: "'<=' not supported between instances
of 'TensorDescriptor' and 'int'"), so the op builds its descriptors on the device.

Epilogue, same as `kernels._epilogue`: out = acc_int32 * w_scale[n] * x_scale[m] (+ bias[n]), cast once.
`EPI_TMA` stores through a descriptor (`EPI_SPLIT` 1 or 2: the tile or its two N halves, so the staging
buffer in shared memory is half as large and a deeper pipeline fits); otherwise a masked `tl.store`.

TMA needs 16-byte aligned bases and row strides: K % 16 == 0, and N % 8 == 0 for a bf16 TMA store; the
launcher checks and falls back. Loads past M/N/K read zeros (descriptor padding), stores past M/N are clipped.
"""

from __future__ import annotations

import triton
import triton.language as tl

from qlower.lowerings.kernels.triton.int8.kernels import _int8_to, load_scale


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped order: GROUP_M row-tiles share each weight column-tile while it is hot in L2."""
    in_group = GROUP_M * num_pid_n
    first_m = (tile_id // in_group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % in_group) % size_m
    pid_n = (tile_id % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def _rescale_store(
    acc,
    o,
    ws_ptr,
    xs_ptr,
    b_ptr,
    M,
    N,
    off_m,
    off_n,
    stride_om,
    stride_ws,
    stride_xs,
    stride_b,
    HAS_XS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EPI_TMA: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROUND_WS: tl.constexpr,
):
    """acc [BM, BN] int32 -> acc * ws[n] (* xs[m]) (+ b[n]) in o's dtype; `o` is a descriptor or a pointer."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    ws = load_scale(ws_ptr + offs_n * stride_ws, mask_n, ROUND_WS)
    val = acc.to(tl.float32) * ws[None, :]
    if HAS_XS:
        xs = tl.load(xs_ptr + offs_m * stride_xs, mask=mask_m, other=0.0).to(tl.float32)
        val = val * xs[:, None]
    if HAS_BIAS:
        b = tl.load(b_ptr + offs_n * stride_b, mask=mask_n, other=0.0).to(tl.float32)
        val = val + b[None, :]
    if EPI_TMA:
        out = val.to(o.dtype)
        if EPI_SPLIT == 2:
            halves = tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            lo, hi = tl.split(halves)
            o.store([off_m, off_n], lo)
            o.store([off_m, off_n + BLOCK_N // 2], hi)
        else:
            o.store([off_m, off_n], out)
    else:
        ptrs = o + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(ptrs, val.to(o.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _mm_tiles(
    a_desc,
    w_desc,
    o,
    ws_ptr,
    xs_ptr,
    b_ptr,
    M,
    N,
    K,
    stride_om,
    stride_ws,
    stride_xs,
    stride_b,
    HAS_XS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EPI_TMA: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
    WARP_SPEC: tl.constexpr,
    INT8_A: tl.constexpr = True,
    FAST_CVT: tl.constexpr = 0,
    ROUND_WS: tl.constexpr = 0,
):
    """Program p computes tiles p, p + P, p + 2P, ... (P = the grid): P = #SMs is persistent, P = #tiles is not.

    The epilogue recomputes its tile coordinates from a second counter (`tile_c`) rather than reusing the
    loop's: with FLATTEN the pipeliner may hoist the next tile's coordinates above this tile's epilogue.
    INT8_A False (woq-int8): a is bf16/fp16 and each weight tile is converted in registers (`FAST_CVT`, see
    `kernels._int8_to`) as the MMA's B operand. (A swap-AB variant, the converted weight as wgmma's
    register operand, was 1.07-1.9x slower than the pointer tile at every point of the sm_90 sweep, so there is
    none; `configs.tma` refuses `swap`.)
    """
    start = tl.program_id(0)
    step = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_c = start - step
    for tile_id in tl.range(start, num_tiles, step, flatten=FLATTEN, warp_specialize=WARP_SPEC):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32 if INT8_A else tl.float32)
        for kt in range(k_tiles):
            off_k = kt * BLOCK_K
            a = a_desc.load([off_m, off_k])
            w = w_desc.load([off_n, off_k])
            if INT8_A:
                acc = tl.dot(a, w.T, acc, out_dtype=tl.int32)
            else:
                acc = tl.dot(a, _int8_to(w, a.dtype, FAST_CVT).T, acc)
        tile_c += step
        pid_mc, pid_nc = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        _rescale_store(
            acc, o, ws_ptr, xs_ptr, b_ptr, M, N, pid_mc * BLOCK_M, pid_nc * BLOCK_N,
            stride_om, stride_ws, stride_xs, stride_b,
            HAS_XS, HAS_BIAS, EPI_TMA, EPI_SPLIT, BLOCK_M, BLOCK_N, ROUND_WS,
        )  # fmt: skip


@triton.jit
def int8_mm_tma_dev_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    ws_ptr,
    xs_ptr,
    b_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_om,
    stride_ws,
    stride_xs,
    stride_b,
    HAS_XS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EPI_TMA: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
    WARP_SPEC: tl.constexpr,
    ROUND_WS: tl.constexpr,
):
    """out[M, N] = (a[M, K] int8 @ w[N, K].T int8) rescaled; descriptors built on the device (needs an allocator).

    a, w and out must have unit inner stride. Grid: (P,), P = min(#SMs, #tiles) for a persistent launch.
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [N, K], [stride_wn, 1], [BLOCK_N, BLOCK_K])
    if EPI_TMA:
        o = tl.make_tensor_descriptor(out_ptr, [M, N], [stride_om, 1], [BLOCK_M, BLOCK_N // EPI_SPLIT])
    else:
        o = out_ptr
    _mm_tiles(
        a_desc, w_desc, o, ws_ptr, xs_ptr, b_ptr, M, N, K, stride_om, stride_ws, stride_xs, stride_b,
        HAS_XS, HAS_BIAS, EPI_TMA, EPI_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLATTEN, WARP_SPEC,
        True, 0, ROUND_WS,
    )  # fmt: skip


@triton.jit
def woq_mm_tma_dev_kernel(
    a_ptr,
    w_ptr,
    out_ptr,
    ws_ptr,
    b_ptr,
    M,
    N,
    K,
    stride_am,
    stride_wn,
    stride_om,
    stride_ws,
    stride_b,
    HAS_BIAS: tl.constexpr,
    FAST_CVT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
    ROUND_WS: tl.constexpr,
):
    """out[M, N] = a[M, K] (bf16/fp16) @ (w[N, K] int8 * ws[N]).T (+ bias): woq-int8 with TMA-fed operands.

    Same walk and epilogue as `int8_mm_tma_dev_kernel`, with a masked `tl.store` (the form the sm_90 sweep
    behind `configs.WOQ_TMA` timed).
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, [M, K], [stride_am, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, [N, K], [stride_wn, 1], [BLOCK_N, BLOCK_K])
    _mm_tiles(
        a_desc, w_desc, out_ptr, ws_ptr, ws_ptr, b_ptr, M, N, K, stride_om, stride_ws, 0, stride_b,
        False, HAS_BIAS, False, 1, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLATTEN, False, False, FAST_CVT,
        ROUND_WS,
    )  # fmt: skip
