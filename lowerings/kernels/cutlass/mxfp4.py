"""`qlower::mxfp4_cutlass`: the CUTLASS MXFP4 weight-only GEMM (csrc/cuda/mxfp4_sm90.cu) as a torch op.

out[M, N] = x[M, K] @ dequant(w).T + bias in bf16, w the e2m1 codes [N, K/2] (element 2i in the low nibble of
byte i), its block scales given as `block_scales` lays them out: [K/128, N, 4] bf16, the four scales of each
128-element K tile of each row side by side, which the kernel's scale TMA loads once per K tile. The graph
decodes the e8m0 codes to those bf16 values (`emit.cutlass.emit_mxfp4_cutlass`, with the graph's own meaning of
the codes 0 and 255), so the kernel holds no special-value rules: every e8m0 value is a power of two or NaN,
which bf16 holds exactly (2^-127 as a subnormal).

The configuration is chosen on the host per call from M (`choose`), as for `qlower::woq_int8_cutlass`, whose
library (`build.py`) holds these objects too. Off CUDA the op computes the same product in torch (`reference`:
the weight decoded and rounded to bf16 once, as the kernel does), so the graph side of the lowering is tested on
any machine (tests/lowerings/kernels/test_cutlass_mxfp4.py).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from qlower.lowerings.kernels.cutlass import configs, w8a16

TILE_K = configs.MXFP4_K_MULTIPLE  # K per scale entry, csrc/cuda/mxfp4_sm90.h's QLOWER_MXFP4_TILE_K
BLOCK = 32


class Args(ctypes.Structure):
    """csrc/cuda/mxfp4_sm90.h's QlowerMxfp4Args, field for field."""

    _fields_ = [
        *[(f, ctypes.c_void_p) for f in ("x", "w", "scales", "bias", "out", "workspace", "stream")],
        *[(f, ctypes.c_int64) for f in ("m", "n", "k", "ldx", "ldw", "ldout", "workspace_bytes")],
        *[(f, ctypes.c_int32) for f in ("splits", "device", "sm_count")],
    ]


@functools.cache
def _entry(name: str):
    fn = getattr(w8a16.library_handle(), f"qlower_mxfp4_sm90_{name}")
    fn.argtypes = [ctypes.POINTER(Args)]
    fn.restype = ctypes.c_int
    return fn


def block_scales(scale: torch.Tensor) -> torch.Tensor:
    """Decoded block scales [N, K/32] (any float dtype) -> the kernel's [K/128, N, 4] bf16 (contiguous).
    The graph emits the same three ops (`emit.cutlass.emit_mxfp4_cutlass`)."""
    n, blocks = scale.shape
    quads = scale.to(torch.bfloat16).reshape(n, blocks // 4, 4)
    return quads.permute(1, 0, 2).contiguous()


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def reference(
    x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The op's product in torch: each weight element e2m1 * its block's bf16 scale, rounded to bf16 once
    (the kernel's conversion), then x @ w.T accumulated in fp32, plus bias, rounded to bf16."""
    n, k = w.shape[0], 2 * w.shape[1]
    nibbles = torch.stack([w & 15, w >> 4], dim=-1).reshape(n, k).long()
    table = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=w.device)
    values = table[nibbles & 7] * torch.where(nibbles >= 8, -1.0, 1.0)
    block = scales.permute(1, 0, 2).reshape(n, k // BLOCK).float()
    wd = (values.view(n, k // BLOCK, BLOCK) * block[..., None]).view(n, k).to(torch.bfloat16)
    out = x.float() @ wd.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(torch.bfloat16)


# The configuration for M and the weight's shape (configs.py holds the rule, which the C shim's C++ is generated
# from without importing this module).
choose = configs.choose_mxfp4


def operand_blocker(
    x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> str | None:
    """Why the kernel cannot take these operands (None: it can)."""
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        return f"x is {x.dtype} {x.dim()}-D (the kernel takes 2-D bf16)"
    if w.dtype != torch.uint8 or w.dim() != 2:
        return f"w is {w.dtype} {w.dim()}-D (the kernel takes [N, K/2] uint8 e2m1 codes)"
    n, k = w.shape[0], 2 * w.shape[1]
    if x.shape[1] != k:
        return f"x has K={x.shape[1]}, w holds {k}"
    if k % TILE_K or n % configs.MXFP4_N_MULTIPLE or n == 0:
        return f"needs K % {TILE_K} == 0 and N % {configs.MXFP4_N_MULTIPLE} == 0 (K={k}, N={n})"
    if scales.dtype != torch.bfloat16 or tuple(scales.shape) != (k // TILE_K, n, TILE_K // BLOCK):
        return f"scales {tuple(scales.shape)} {scales.dtype} (needs {(k // TILE_K, n, TILE_K // BLOCK)} bf16)"
    if bias is not None and (bias.dtype != torch.bfloat16 or bias.numel() != n):
        return f"bias of {bias.numel()} {bias.dtype} values (needs {n} bf16)"
    return None


def launch(
    x: torch.Tensor,
    w: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    choice: configs.Choice | None = None,
) -> None:
    """Run one GEMM into `out` with `choice` (default: `choose`). The operands are as the op hands them over:
    K-contiguous 16-byte-aligned rows of x and w, contiguous scales and bias."""
    m, k = x.shape
    n = w.shape[0]
    choice = choice or choose(m, n, k)
    args = Args(
        x=x.data_ptr(), w=w.data_ptr(), scales=scales.data_ptr(),
        bias=bias.data_ptr() if bias is not None else None, out=out.data_ptr(), workspace=None,
        stream=torch.cuda.current_stream(x.device).cuda_stream,
        m=m, n=n, k=k, ldx=x.stride(0), ldw=w.stride(0), ldout=out.stride(0), workspace_bytes=0,
        splits=choice.splits, device=x.device.index, sm_count=w8a16.sm_count(x.device.index),
    )  # fmt: skip
    status = w8a16.run_entry(_entry(choice.config), args, x.device)
    if status != w8a16.OK:
        raise RuntimeError(
            f"qlower::mxfp4_cutlass: {w8a16.STATUS.get(status, status)} (configuration {choice.config}, "
            f"M={m}, N={n}, K={k})"
        )


@torch.library.custom_op("qlower::mxfp4_cutlass", mutates_args=())
def mxfp4_cutlass(
    x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] bf16 @ dequant(w [N, K/2] e2m1, scales [K/128, N, 4] bf16).T + bias [N], bf16, on sm_90."""
    why = operand_blocker(x, w, scales, bias)
    if why:
        raise ValueError(f"qlower::mxfp4_cutlass: {why}")
    if not x.is_cuda:
        return reference(x, w, scales, bias)
    m, n = x.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if x.shape[1] == 0:  # a gated-off K (`triton/mx/launch.py: dense_cutlass`): only the bias
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    launch(w8a16.rows_ok(x), w8a16.rows_ok(w), scales.contiguous(), w8a16.aligned_vector(bias), out)
    return out


@mxfp4_cutlass.register_fake
def _(
    x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))
