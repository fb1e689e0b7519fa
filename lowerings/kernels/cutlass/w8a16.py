"""`qlower::woq_int8_cutlass`: the CUTLASS W8A16 GEMM (csrc/cuda/w8a16_sm90.cu) as a torch op.

out[M, N] = (x[M, K] @ w[N, K].T) * scale + bias in x's dtype (bf16/fp16), scale [N] or [1]. The
configuration is chosen on the host per call from M (`configs.choose`), so a symbolic M needs no guard and a
CUDA graph captures the launch of the M it was recorded with. The library is called through its C entry
points (`QlowerW8A16Args`, csrc/cuda/w8a16_sm90.h) with ctypes: it holds no torch code, so nvcc builds it
without torch's headers and any CUDA torch can load it.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from qlower.lowerings.kernels.cutlass import build, configs

OK, NEEDS_WORKSPACE = 0, 2
STATUS = {
    1: "CUTLASS's can_implement refused the problem (shape, stride or alignment)",
    3: "CUTLASS's initialize failed",
    4: "the launch failed",
    5: "unsupported dtype",
    6: "the library was not built for sm_90a",
}
DTYPE_CODE = {torch.bfloat16: 0, torch.float16: 1}
K_MULTIPLE, N_MULTIPLE = configs.K_MULTIPLE, configs.N_MULTIPLE


class Args(ctypes.Structure):
    """csrc/cuda/w8a16_sm90.h's QlowerW8A16Args, field for field."""

    _fields_ = [
        *[(f, ctypes.c_void_p) for f in ("x", "w", "scale", "bias", "out", "workspace", "stream")],
        *[(f, ctypes.c_int64) for f in ("m", "n", "k", "ldx", "ldw", "ldout", "workspace_bytes")],
        *[(f, ctypes.c_int32) for f in ("dtype", "scale_per_channel", "splits", "device", "sm_count")],
    ]


@functools.cache
def library_handle() -> ctypes.CDLL:
    """The CUTLASS library (W8A16 and MXFP4 objects), loaded once per process."""
    path = build.library()
    if isinstance(path, str):
        raise RuntimeError(f"qlower: no CUTLASS library: {path}")
    return ctypes.CDLL(str(path))


@functools.cache
def _entry(name: str):
    fn = getattr(library_handle(), f"qlower_w8a16_sm90_{name}")
    fn.argtypes = [ctypes.POINTER(Args)]
    fn.restype = ctypes.c_int
    return fn


@functools.cache
def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def operand_blocker(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> str | None:
    """Why the kernel cannot take these operands (None: it can). Shared by the op and the lowering's checks."""
    if x.dtype not in DTYPE_CODE:
        return f"x dtype {x.dtype} (the kernel takes bf16/fp16)"
    if w.dtype != torch.int8 or w.dim() != 2 or x.dim() != 2:
        return "x or w is not 2-D, or w is not int8"
    n, k = w.shape
    if k % K_MULTIPLE or n % N_MULTIPLE:
        return f"needs K % {K_MULTIPLE} == 0 and N % {N_MULTIPLE} == 0 (K={k}, N={n})"
    if scale.dtype != x.dtype or scale.numel() not in (1, n):
        return f"scale of {scale.numel()} {scale.dtype} values (needs {n} or 1 of x's dtype {x.dtype})"
    if bias is not None and (bias.dtype != x.dtype or bias.numel() != n):
        return f"bias of {bias.numel()} {bias.dtype} values (needs {n} of x's dtype)"
    return None


def run_entry(fn, args: ctypes.Structure, device: torch.device) -> int:
    """Call a library entry point; where it asks for a workspace, allocate one on `device` and call again."""
    status = fn(ctypes.byref(args))
    if status == NEEDS_WORKSPACE:
        workspace = torch.empty(int(args.workspace_bytes), dtype=torch.uint8, device=device)
        args.workspace = workspace.data_ptr()
        status = fn(ctypes.byref(args))
    return status


def launch(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    choice: configs.Choice | None = None,
) -> None:
    """Run one GEMM into `out` with `choice` (default: `configs.choose` for this M, N, K). The operands are
    as the op hands them over: K-contiguous 16-byte-aligned rows, scale and bias contiguous vectors."""
    m, k = x.shape
    n = w.shape[0]
    choice = choice or configs.choose(m, n, k, x.device.index)
    args = Args(
        x=x.data_ptr(), w=w.data_ptr(), scale=scale.data_ptr(), bias=bias.data_ptr() if bias is not None else None,
        out=out.data_ptr(), workspace=None, stream=torch.cuda.current_stream(x.device).cuda_stream,
        m=m, n=n, k=k, ldx=x.stride(0), ldw=w.stride(0), ldout=out.stride(0), workspace_bytes=0,
        dtype=DTYPE_CODE[x.dtype], scale_per_channel=int(scale.numel() != 1), splits=choice.splits,
        device=x.device.index, sm_count=sm_count(x.device.index),
    )  # fmt: skip
    status = run_entry(_entry(choice.config), args, x.device)
    if status != OK:
        raise RuntimeError(
            f"qlower::woq_int8_cutlass: {STATUS.get(status, status)} (configuration {choice.config}, "
            f"M={m}, N={n}, K={k}, x {x.dtype})"
        )


def rows_ok(t: torch.Tensor) -> torch.Tensor:
    """Unit stride along K and a 16-byte row stride, the kernel's TMA layout; copied otherwise."""
    ok = t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
    return t if ok else t.contiguous()


def aligned_vector(t: torch.Tensor | None) -> torch.Tensor | None:
    """A contiguous 1-D copy where `t` is not one at a 16-byte address (the epilogue's vector loads)."""
    if t is None:
        return None
    t = t.reshape(-1)
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone()


@torch.library.custom_op("qlower::woq_int8_cutlass", mutates_args=())
def woq_int8_cutlass(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] @ (w [N, K] int8).T * scale ([N] or [1]) + bias [N], in x's dtype, on sm_90."""
    why = operand_blocker(x, w, scale, bias)
    if why:
        raise ValueError(f"qlower::woq_int8_cutlass: {why}")
    m, n = x.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if x.shape[1] == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    launch(rows_ok(x), rows_ok(w), aligned_vector(scale), aligned_vector(bias), out)
    return out


@woq_int8_cutlass.register_fake
def _(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))
