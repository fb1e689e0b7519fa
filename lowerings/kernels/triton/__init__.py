"""qlower's own Triton kernels for CUDA (woq-int8, dynamic-int8), and the lowerings that emit them.

Triton is optional: importing this package imports no Triton. `triton_unavailable()` says why the kernels
cannot be used in this process (None when they can). The kernels live in int8_kernels.py, int8_hopper.py,
woq_decode.py, woq_limbs.py, splitk.py and the mx_*.py modules; their `triton_op`s and launchers in int8_ops.py
and mx_ops.py, imported only when a lowering emits (configs.py and tuned.py, the tuned tables, import no Triton).
"""

from __future__ import annotations

import functools
import os

import torch


def interpreted() -> bool:
    """TRITON_INTERPRET is set: kernels run in Triton's interpreter, which cannot run inline PTX."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def one_line(ptx: str) -> str:
    """PTX for `tl.inline_asm_elementwise` on one line: Inductor copies the constexpr globals a user kernel
    reads into its generated module as one-line string literals, and a newline in one is a syntax error
    there (seen with torch 2.11)."""
    return " ".join(ptx.split())


@functools.cache
def triton_unavailable() -> str | None:
    """None when Triton kernels can be compiled into a graph here, else the reason."""
    if interpreted():
        return "TRITON_INTERPRET is set: kernels would run in the interpreter, not compiled into the graph"
    if not hasattr(torch.library, "triton_op"):
        return f"torch {torch.__version__} has no torch.library.triton_op"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"triton is not importable ({type(e).__name__}: {e})"
    return None
