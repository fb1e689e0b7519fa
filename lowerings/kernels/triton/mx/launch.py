"""Launchers of the MX decode kernels (`decode.py`'s and `hfma.py`'s): which kernel runs a `DecodeConfig`, and
its grid. A module of its own so that the kernels' modules import each other in one direction only."""

# ruff: noqa: UP045

from typing import Any, Optional

import torch

from qlower.lowerings.kernels.triton import interpreted
from qlower.lowerings.kernels.triton.launch_args import cdiv
from qlower.lowerings.kernels.triton.mx.bf16 import mx_bf16_dequant_kernel, mx_bf16_mm_kernel
from qlower.lowerings.kernels.triton.mx.decode import (
    CVT,
    DecodeConfig,
    as_words,
    effective_decode,
    elems_per_word,
    fmt_consts,
    mx_decode_mm_kernel,
)
from qlower.lowerings.kernels.triton.mx.hfma import mx_hfma_gemv_kernel
from qlower.lowerings.kernels.triton.splitk import reduce_into


def launch_decode(
    cfg: DecodeConfig,
    x: torch.Tensor,
    w_words: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out: torch.Tensor,
    w_fmt: int,
    w_swizzled: bool = False,
    gate: Any = 1,
    direct: bool = False,
    rows: Any = None,
    w_special: int = 0,
) -> None:
    """Launch cfg writing out [M, N]. `direct` calls the kernels without wrap_triton (eager timing).

    Under a triton_op `direct` must be False (the launches go through wrap_triton); `gate` scales the grid
    as in ops.launch, so a symbolic M can pick between configs without a guard. `rows` (default M) is
    the M the launch covers: a gated launch that only runs when M == 1 passes rows=1, so its grid and
    split-K scratch are static (a symbolic M would size the scratch by M even when gated off). `w_special`:
    how e8m0 codes 0 and 255 decode (`kernels.SPECIAL_ZERO | SPECIAL_INF`; 0: the OCP spec's values).
    """
    from torch.library import wrap_triton

    def k(fn: Any) -> Any:
        return fn if direct else wrap_triton(fn)

    m, n = out.shape
    m = m if rows is None else rows
    kw = w_words.shape[1]
    if cfg.block_kw % (32 // elems_per_word(w_fmt)):
        raise ValueError(f"block_kw={cfg.block_kw} is not a whole number of 32-element blocks")
    k_elems = kw * elems_per_word(w_fmt)
    if w_swizzled:
        s_t, s_sn, s_sk, s_pad = w_scale.reshape(-1), 0, 0, (k_elems // 32 + 3) // 4 * 4
    else:
        s_t, s_sn, s_sk, s_pad = w_scale, w_scale.stride(0), w_scale.stride(1), 0
    b = bias if bias is not None else s_t
    _, _, dsh, xsh = fmt_consts(w_fmt, cfg.decode)
    if cfg.kernel == "mm" and x.dtype == torch.float16:
        xsh = 0  # an fp16 dot cannot hold x * 2**XSH; the weights then carry the whole 2**DSH
    x_mul, s_mul = 2.0**xsh, 2.0 ** (dsh - xsh)
    common = dict(
        W_FMT=w_fmt, SWIZZLED=w_swizzled, SPECIAL=w_special, DECODE=effective_decode(w_fmt, cfg.decode),
        HAS_BIAS=bias is not None, EVICT=cfg.evict,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_KW=cfg.block_kw,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if cfg.kernel == "mm":
        grid = (cdiv(m, cfg.block_m) * gate, cdiv(n, cfg.block_n))
        k(mx_decode_mm_kernel)[grid](
            x, w_words, s_t, b, out, m, n, kw, x_mul, s_mul,
            x.stride(0), x.stride(1), w_words.stride(0), s_sn, s_sk, s_pad,
            out.stride(0), out.stride(1),
            EVEN_K=kw % cfg.block_kw == 0, DOT_BF16=x.dtype != torch.float16, X_PRESCALE=xsh != 0, **common,
        )  # fmt: skip
        return
    split = cfg.split_k
    kw_split = cdiv(cdiv(kw, split), cfg.block_kw) * cfg.block_kw
    even = kw % cfg.block_kw == 0 and kw_split * split == kw
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=out.device)
    p_strides = (0, out.stride(0), out.stride(1)) if split == 1 else part.stride()
    common.update(EVEN_K=even, PREFETCH=cfg.prefetch, HAS_BIAS=bias is not None and split == 1)
    if cfg.kernel == "bf16mm":
        for key in ("DECODE", "W_FMT", "EVICT", "PREFETCH"):
            common.pop(key)
        k(mx_bf16_mm_kernel)[(cdiv(m, cfg.block_m) * gate, cdiv(n, cfg.block_n), split)](
            x, w_words, s_t, b, part, m, n, kw, kw_split,
            x.stride(0), x.stride(1), w_words.stride(0), s_sn, s_sk, s_pad, p_strides[0], out.stride(0),
            out.stride(1), SPLIT=split > 1, SWAP_AB=cfg.swap_ab, **common,
        )  # fmt: skip
    elif cfg.kernel == "hfma":
        common.pop("DECODE")
        k(mx_hfma_gemv_kernel)[(cdiv(n, cfg.block_n), cdiv(m, cfg.block_m) * gate, split)](
            x, w_words, s_t, b, part, m, n, kw, kw_split,
            x.stride(0), x.stride(1), w_words.stride(0), s_sn, s_sk, s_pad, *p_strides,
            USE_ASM=not interpreted(), **common,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown MX decode kernel {cfg.kernel!r} (hfma, mm, bf16mm)")
    if split == 1:
        return
    reduce_into(out, part, gate, bias, k)


def dense_bf16(
    cfg: DecodeConfig,
    x: torch.Tensor,
    w_words: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    w_swizzled: bool = False,
    gate: Any = 1,
    direct: bool = False,
    w_special: int = 0,
) -> torch.Tensor:
    """x @ dequant(w).T [+ bias] for MXFP4 weights and bf16 x at large M: `mx_bf16_dequant_kernel` writes the
    weight in bf16 (the user's dequantize-then-cast, once per element), cuBLAS multiplies (what F.linear on
    that weight runs). `gate` (1, or a 0/1 SymInt) multiplies K and the dequantization grid: gated off, no
    weight is built and cuBLAS only fills the output (bias or zeros), which gated launches then overwrite.
    `w_special`: as in `launch_decode`."""
    from torch.library import wrap_triton

    n, kw = w_words.shape
    k_elems = kw * 8
    ungated = isinstance(gate, int) and gate == 1
    kg = k_elems if ungated else k_elems * gate
    if w_swizzled:
        s_t, s_sn, s_sk, s_pad = w_scale.reshape(-1), 0, 0, (k_elems // 32 + 3) // 4 * 4
    else:
        s_t, s_sn, s_sk, s_pad = w_scale, w_scale.stride(0), w_scale.stride(1), 0
    wd = torch.empty((n, kg), dtype=torch.bfloat16, device=x.device)
    kern = mx_bf16_dequant_kernel if direct else wrap_triton(mx_bf16_dequant_kernel)
    kern[(cdiv(n, cfg.block_n) * gate, cdiv(kw, cfg.block_kw))](
        w_words, s_t, wd, n, kw, w_words.stride(0), s_sn, s_sk, s_pad, kg,
        SWIZZLED=w_swizzled, SPECIAL=w_special, EVEN_K=kw % cfg.block_kw == 0, BLOCK_N=cfg.block_n,
        BLOCK_KW=cfg.block_kw,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    x_k = x if ungated else x.narrow(1, 0, kg)
    return torch.mm(x_k, wd.t()) if bias is None else torch.addmm(bias.to(x.dtype), x_k, wd.t())


# The dequantize tile: 16 rows x 64 words wrote a 4096->14336 / 14336->4096 weight in 40.3 / 40.8 us on sm_90,
# 32 x 32 in 41.8 / 41.9 (six tiles timed; the HBM bound, e2m1 and scales in, bf16 out, is 31.0)
BF16_DENSE = DecodeConfig("bf16dq", CVT, block_n=16, block_kw=64, num_warps=4, num_stages=1)


@torch.library.custom_op("qlower::mxfp4_dense", mutates_args=())
def mxfp4_dense(
    x: torch.Tensor,
    w: torch.Tensor,
    blocks: Optional[torch.Tensor],
    codes: torch.Tensor,
    bias: Optional[torch.Tensor],
    codes_swizzled: bool,
    special: int,
    cutlass_max_m: int,
    gate: int,
) -> torch.Tensor:
    """x [M, K] bf16 @ dequant(w).T [+ bias] -> bf16, MXFP4 w [N, K/2] with its e8m0 `codes` and the same scales
    as qlower's CUTLASS MXFP4 GEMM reads them (`blocks`), for the whole-output buckets of a symbolic M: the
    CUTLASS GEMM up to `cutlass_max_m` (0: at every M), dequantize + cuBLAS (`dense_bf16`) above, or at every M
    where `blocks` is None (no CUTLASS GEMM). Opaque to the compiler, so the choice is made on the M each call
    (or CUDA graph recording) has, and no operand is a view sized by the gate (Inductor's post-grad passes
    turned those sizes into guards on M: tests/lowerings/emit/test_no_guards_on_m.py); `gate` 0 (M outside
    the buckets, a 0/1 SymInt at trace time) only fills the output with the bias (or zeros) for the tile
    kernels to overwrite."""
    m, n = x.shape[0], w.shape[0]
    if gate == 0 or m == 0:
        out = torch.zeros((m, n), dtype=x.dtype, device=x.device)
        return out if bias is None else out.add_(bias.to(x.dtype))
    if blocks is None or (cutlass_max_m and m > cutlass_max_m):
        return dense_bf16(
            BF16_DENSE, x, as_words(w), codes, bias, codes_swizzled, direct=True, w_special=special
        )
    return cutlass_gemm(x, w, blocks, bias)


def cutlass_gemm(
    x: torch.Tensor, w: torch.Tensor, blocks: torch.Tensor, bias: Optional[torch.Tensor]
) -> torch.Tensor:
    """qlower's CUTLASS MXFP4 GEMM (`qlower::mxfp4_cutlass`) with the bias in its epilogue where it is bf16, else
    added after in its own dtype's promotion: for `mxfp4_dense` and the host branch's leaves (`ops._branch_on_m`)."""
    from qlower.lowerings.kernels.cutlass import mxfp4  # noqa: F401  (registers qlower::mxfp4_cutlass)

    fused = bias is None or bias.dtype == torch.bfloat16
    out = torch.ops.qlower.mxfp4_cutlass(x, w, blocks, bias if fused else None)
    return out if fused else out + bias.to(out.dtype)


@mxfp4_dense.register_fake
def _(x, w, blocks, codes, bias, codes_swizzled, special, cutlass_max_m, gate) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))
