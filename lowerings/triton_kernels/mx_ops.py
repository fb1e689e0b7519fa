"""`qlower::mx_linear`: the MX Triton kernels as one triton_op, and which kernel/config runs for which shape.

Inputs are uint8 views (elements, packed e2m1 bytes, e8m0 codes) plus format codes; the op picks the GEMV
kernel for small M and the tiled kernel above (a dynamic M launches both with gated grids: no guard, no
recompile). Configs were chosen on an H200 (scripts/bench_mx.py sweeps them); other GPUs get the same.

Not using `from __future__ import annotations` (nor `X | None`): `triton_op` infers the schema from live
annotations, on the oldest torch qlower supports too.
"""

# ruff: noqa: UP045

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.library import triton_op, wrap_triton

from .mx_kernels import E2M1, E4M3, E5M2, FLOAT, mx_gemv_kernel, mx_mm_kernel

ELEM_CODE = {"float": FLOAT, "e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}


@dataclass(frozen=True)
class MXConfig:
    kernel: str  # "gemv" or "mm"
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    block_m: int = 1
    group_m: int = 8


# Largest M served by the GEMV kernel (weights streamed once per output row; tiles above).
GEMV_MAX_M = 4
# Configs measured on the H200 (2026-11-29, BENCHMARKS.md "MX"): the compiled model with these ran MXFP8
# weight-only M=1 at 1.30x bf16, MXFP4 weight-only M=1 at 0.95x, MXFP8 dynamic M=4096 at 0.15x (the per-32
# chunk fp8 tile kernel is far from the tensor cores' rate: see mx_lowering.py for what AUTO does with that).
GEMV_FP4 = MXConfig("gemv", block_n=32, block_k=256, num_warps=4, num_stages=3)
GEMV_FP8 = MXConfig("gemv", block_n=8, block_k=1024, num_warps=4, num_stages=2)
MM_FP8_LARGE = MXConfig("mm", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4)
MM_FP8_SMALL = MXConfig("mm", block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=3)
MM_UPCAST_LARGE = MXConfig("mm", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)
MM_UPCAST_SMALL = MXConfig("mm", block_m=32, block_n=128, block_k=128, num_warps=4, num_stages=3)


def fp8_mma(a_fmt: int, w_fmt: int) -> bool:
    """Both operands fp8-coded and of one fp8 type (e2m1 decodes to e4m3): per-chunk fp8 tensor-core dots."""
    e4 = (E4M3, E2M1)
    return (a_fmt in e4 and w_fmt in e4) or (a_fmt == E5M2 and w_fmt == E5M2)


def pick_config(m: int, a_fmt: int, w_fmt: int) -> MXConfig:
    if m <= GEMV_MAX_M:
        return GEMV_FP4 if w_fmt == E2M1 else GEMV_FP8
    if fp8_mma(a_fmt, w_fmt):
        return MM_FP8_LARGE if m > 256 else MM_FP8_SMALL
    return MM_UPCAST_LARGE if m > 256 else MM_UPCAST_SMALL


def _cdiv(a: Any, b: int) -> Any:
    return (a + b - 1) // b


def _is_static(x: Any) -> bool:
    return isinstance(x, int) or (isinstance(x, torch.SymInt) and x.node.is_constant())


def _scale_args(s: Optional[torch.Tensor], swizzled: bool, k: int) -> tuple[Any, int, int, int]:
    """(tensor, stride_rows, stride_cols, padded cols) of a scale operand (swizzled: the flat tensor)."""
    if s is None:
        return None, 0, 0, 0
    if swizzled:
        return s.reshape(-1), 0, 0, (k // 32 + 3) // 4 * 4
    return s, s.stride(0), s.stride(1), 0


def launch(
    cfg: MXConfig,
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out: torch.Tensor,
    a_fmt: int,
    w_fmt: int,
    a_swizzled: bool,
    w_swizzled: bool,
    gate: Any = 1,
    dot_dtype: Optional[torch.dtype] = None,
) -> None:
    """One kernel launch writing `out` [M, N]; `gate` (1, 0 or a 0/1 SymInt) scales the grid.

    `dot_dtype` of the upcast tile path: fp16 when the activation is fp16, else bf16 (exact for MX values).
    """
    m, n = out.shape
    k = w.shape[1] * (2 if w_fmt == E2M1 else 1)
    as_t, s_asm, s_ask, as_pad = _scale_args(a_scale, a_swizzled, k)
    ws_t, s_wsn, s_wsk, ws_pad = _scale_args(w_scale, w_swizzled, k)
    as_t = ws_t if as_t is None else as_t
    b = bias if bias is not None else ws_t
    args = (
        a, as_t, w, ws_t, b, out, m, n, k,
        a.stride(0), a.stride(1), s_asm, s_ask, as_pad,
        w.stride(0), w.stride(1), s_wsn, s_wsk, ws_pad,
        out.stride(0), out.stride(1),
    )  # fmt: skip
    common = dict(
        A_FMT=a_fmt, W_FMT=w_fmt, A_SWZ=a_swizzled, W_SWZ=w_swizzled, HAS_BIAS=bias is not None,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if cfg.kernel == "gemv":
        wrap_triton(mx_gemv_kernel)[(_cdiv(n, cfg.block_n) * gate, m)](*args, **common)
        return
    grid = (_cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n) * gate,)
    wrap_triton(mx_mm_kernel)[grid](
        *args, FP8_MMA=fp8_mma(a_fmt, w_fmt), DOT_BF16=(dot_dtype or a.dtype) != torch.float16,
        BLOCK_M=cfg.block_m, GROUP_M=cfg.group_m, **common,
    )  # fmt: skip


@triton_op("qlower::mx_linear", mutates_args=())
def mx_linear(
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    a_fmt: int,
    w_fmt: int,
    a_swizzled: bool,
    w_swizzled: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """A [M, K] (float, or MX bytes with codes) @ W [N, K] (MX bytes, codes).T [+ bias] -> [M, N] out_dtype.

    Quantized tensors are uint8: fp8 bytes [R, K], packed e2m1 [R, K / 2], e8m0 codes [R, K / 32] (any
    strides) or the flat swizzled tensor.
    """
    m, n = a.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=w.device)
    fmts = (a_fmt, w_fmt, a_swizzled, w_swizzled)
    if _is_static(m):
        launch(pick_config(int(m), a_fmt, w_fmt), a, a_scale, w, w_scale, bias, out, *fmts)
        return out
    small = pick_config(1, a_fmt, w_fmt)
    large = pick_config(1 << 20, a_fmt, w_fmt)
    on_small = torch.sym_max(0, torch.sym_min(1, GEMV_MAX_M + 1 - m))  # 1 iff m <= GEMV_MAX_M, no guard
    launch(small, a, a_scale, w, w_scale, bias, out, *fmts, gate=on_small)
    launch(large, a, a_scale, w, w_scale, bias, out, *fmts, gate=1 - on_small)
    return out


def launch_config(
    cfg: MXConfig,
    a: torch.Tensor,
    a_scale: Optional[torch.Tensor],
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    a_fmt: int,
    w_fmt: int,
    a_swizzled: bool = False,
    w_swizzled: bool = False,
    out_dtype: Optional[torch.dtype] = None,
    dot_dtype: Optional[torch.dtype] = None,
) -> torch.Tensor:
    """Eager launch with an explicit config (kernel tests, tuning sweeps).

    Launches the kernel directly, as the triton_op does in eager mode: through the wrap_triton HOP every
    launch costs ~0.2 ms of dispatch, which swamped the first H200 sweep's GEMV timings.
    """
    from torch._library.triton import set_wrap_triton_enabled

    out = torch.empty((a.shape[0], w.shape[0]), dtype=out_dtype or torch.bfloat16, device=w.device)
    with set_wrap_triton_enabled(False):
        launch(
            cfg, a, a_scale, w, w_scale, bias, out, a_fmt, w_fmt, a_swizzled, w_swizzled, dot_dtype=dot_dtype
        )
    return out
