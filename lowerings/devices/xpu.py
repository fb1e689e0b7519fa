"""XPU backend: `_weight_int8pack_mm` runs on oneDNN there (no K or M constraint known as of torch 2.13);
fused dequant + GEMM as the fallback.
"""

from __future__ import annotations

import torch

from qlower.lowerings.devices.common import int8_operands, weight_scale_range_blocker
from qlower.lowerings.devices.emulated import DYNAMIC_INT8_EMULATED, MX_EMULATED, WOQ_INT8_DEQUANT_MM
from qlower.lowerings.emit.dynamic_int8 import emit_int_mm
from qlower.lowerings.emit.woq_int8 import emit_int8pack_mm
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering, register_backend
from qlower.patterns.graph_utils import is_static
from qlower.patterns.record import QuantLinear

_PACKED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _supports_packed(rec: QuantLinear) -> str | None:
    if not (is_static(rec.k) and is_static(rec.n)):
        return "K or N is symbolic (dynamic weight shape)"
    if rec.compute_dtype not in _PACKED_DTYPES:
        return f"activation dtype {rec.compute_dtype} not supported by _weight_int8pack_mm"
    return weight_scale_range_blocker(rec)


WOQ_INT8_PACKED_XPU = Lowering(
    name="aten._weight_int8pack_mm",
    family="woq_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_packed,
    emit=emit_int8pack_mm,
    doc="oneDNN packed int8 weight GEMM",
)


def _supports_xpu_int_mm(rec: QuantLinear) -> str | None:
    why = int8_operands(rec)
    if why:
        return why
    if is_static(rec.m) and int(rec.m) == 0:
        return "M == 0 (nothing to multiply; the emulated path handles empty inputs)"
    return None


DYNAMIC_INT8_INT_MM_XPU = Lowering(
    name="aten._int_mm",
    family="dynamic_int8",
    kind=KernelPreference.ATEN,
    supports=_supports_xpu_int_mm,
    emit=emit_int_mm,
    doc="oneDNN int8 GEMM on XPU, fused quantize and rescale",
)


def register() -> None:
    register_backend(
        "xpu",
        [
            WOQ_INT8_PACKED_XPU,
            WOQ_INT8_DEQUANT_MM,
            DYNAMIC_INT8_INT_MM_XPU,
            DYNAMIC_INT8_EMULATED,
            MX_EMULATED,
        ],
        replace=True,
    )
