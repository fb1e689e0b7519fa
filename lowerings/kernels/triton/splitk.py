"""The reduce step of qlower's split-K launches: fp32 partials summed in a fixed order and cast to the output.

Shared by the MX decode kernels (partials [SPLIT_K, M, N], one per K slice) and the int8 kernels' gated split-K
ranges (one fp32 accumulator, SPLIT_K = 1: the cast alone). Its grid is gated by M like the launch it
finishes, so under a symbolic M it writes the output only where that launch's M range runs.
"""

# ruff: noqa: UP045

from collections.abc import Callable
from typing import Any, Optional

import torch
import triton
import triton.language as tl

from qlower.lowerings.kernels.triton.launch_args import cdiv

REDUCE_BLOCK = 1024


@triton.jit
def splitk_reduce_kernel(
    part_ptr, bias_ptr, out_ptr, M, N, SPLIT,
    stride_ps, stride_pm, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """out[m, n] = sum over splits of the fp32 partials [+ bias], cast to out's dtype (deterministic); grid
    (M, cdiv(N, BLOCK)): M on the first axis, which CUDA allows 2**31 - 1 programs."""
    m = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = rn < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLIT):
        acc += tl.load(part_ptr + s * stride_ps + m * stride_pm + rn, mask=mask, other=0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=mask, other=0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + rn * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask)


def reduce_into(
    out: torch.Tensor,
    part: torch.Tensor,
    gate: Any = 1,
    bias: Optional[torch.Tensor] = None,
    launch: Callable[[Any], Any] = lambda kernel: kernel,
    rows: Any = None,
) -> None:
    """out [M, N] = the sum of `part` [SPLIT_K, M, N] or [M, N] (fp32, unit inner stride) [+ bias [N]], for
    the rows of a launch gated by `gate` (1, 0, or a 0/1 SymInt). `launch`: `wrap_triton` inside a
    triton_op (traced), identity for a direct launch. `rows`: M where `part` holds more rows (a gated
    accumulator of at least two rows)."""
    p = part if part.dim() == 3 else part.unsqueeze(0)
    split, m, n = p.shape
    m = m if rows is None else rows
    b = bias if bias is not None else p
    launch(splitk_reduce_kernel)[(m * gate, cdiv(n, REDUCE_BLOCK))](
        p, b, out, m, n, split, p.stride(0), p.stride(1), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4,
    )  # fmt: skip
