"""Which dtypes the installed torch's AOTInductor C shim can name.

Why: a package whose constants have a dtype the shim lacks fails to compile its wrapper (`CACHE_TORCH_DTYPE`
of an undeclared `aoti_torch_dtype_*`). torch 2.11 lacks `float8_e8m0fnu` and `float4_e2m1fn_x2` (added by
pytorch/pytorch#176496); MX weights exported there must be stored as uint8 bytes, which qlower's MX
recognizers accept as well.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch


@cache
def _shim_header() -> str:
    path = Path(torch.__file__).parent / "include/torch/csrc/inductor/aoti_torch/c/shim.h"
    return path.read_text() if path.exists() else ""


def shim_has_dtype(dtype: torch.dtype) -> bool:
    """True when AOTInductor's C shim declares `aoti_torch_dtype_<dtype>()` in this torch."""
    return f"aoti_torch_dtype_{str(dtype).removeprefix('torch.')}()" in _shim_header()
