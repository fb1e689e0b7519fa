"""What the tests of qlower's Triton kernels share: whether Triton is importable and the kernels an FX graph launches
(their interpreter subprocesses run through `tests.helpers.run_python`)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
KERNEL_NAMES = ("qlinear_mm_kernel", "woq_int8_gemv_kernel", "woq_decode_kernel")


def kernel_launches(gm) -> list[str]:
    """The names of the Triton kernels `gm`'s graph launches (functional wrappers), in graph order."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    return [
        kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
        for n in gm.graph.nodes
        if n.target is hop
    ]
