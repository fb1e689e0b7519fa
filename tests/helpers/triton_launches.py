"""What the tests of qlower's Triton kernels share: whether Triton is importable, a Python subprocess (Triton's
interpreter needs TRITON_INTERPRET=1 set before Triton is imported), and the kernels an FX graph launches."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
TESTS = ROOT / "tests"  # the subprocesses' working directory
KERNEL_NAMES = ("qlinear_mm_kernel", "woq_int8_gemv_kernel", "woq_decode_kernel")


def run_python(script: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=TESTS,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def kernel_launches(gm) -> list[str]:
    """The names of the Triton kernels `gm`'s graph launches (functional wrappers), in graph order."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    return [
        kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
        for n in gm.graph.nodes
        if n.target is hop
    ]
