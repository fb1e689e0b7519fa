"""qlower's own Triton kernels for CUDA, one folder per quantization family, with their launchers and triton_ops.

- `int8/`: woq-int8 and dynamic-int8 (kernels.py, hopper.py, woq_decode.py, woq_limbs.py; ops.py: the
  `qlower::woq_int8_linear` / `qlower::dynamic_int8_linear` triton_ops and their launchers).
- `mx/`: MXFP8 / MXFP4 (kernels.py, decode.py, hfma.py, bf16.py; launch.py: the decode kernels' launchers;
  ops.py: the `qlower::mx_linear` triton_op and its config picks).
- Shared by both families, here: `launch_args.py` (SymInt grid arithmetic, `branch_on_m`, M-range gates),
  `splitk.py` (the split-K reduce kernel), `configs.py` (the int8 launch configs and their rules) and `tuned.py`
  (the tuned config tables, data in `tuned/<gpu>.json`: the int8 tables and the MX decode table).

Triton is optional: importing this package, `configs`, `tuned` or a family's package imports no Triton; a
family's kernel modules and `ops` do, and only the emit step imports them (lowerings/emit/triton_int8.py,
triton_mx.py, which splice the traced ops into the graph through lowerings/graph/triton_inline.py).
`triton_unavailable()` says why the kernels cannot be used in this process (None when they can). Nothing here
imports lowerings/emit or lowerings/devices (tests/tools/test_layout.py).
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
