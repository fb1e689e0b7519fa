"""Emulated lowerings: dequantize, then a float matmul that Inductor fuses. Correct on every device.

They are the last entry of every in-tree backend's ranking and the shield for candidates no faster kernel
supports: once rewritten, Inductor's own woq pattern (which calls `_weight_int8pack_mm` without checking its
K constraint) cannot match them any more.
"""

from __future__ import annotations

from qlower.lowerings.devices.common import always as _always
from qlower.lowerings.emit.dynamic_int8 import emit_emulated as emit_dynamic_int8_emulated
from qlower.lowerings.emit.mx import emit_emulated as emit_mx_emulated
from qlower.lowerings.emit.woq_int8 import emit_dequant_mm
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering

WOQ_INT8_DEQUANT_MM = Lowering(
    name="dequant_mm",
    family="woq_int8",
    kind=KernelPreference.EMULATED,
    supports=_always,
    emit=emit_dequant_mm,
    doc="fused int8->float dequant + float GEMM, the scale where the graph puts it (weight or result)",
)

DYNAMIC_INT8_EMULATED = Lowering(
    name="int8_mm_emulated",
    family="dynamic_int8",
    kind=KernelPreference.EMULATED,
    supports=_always,
    emit=emit_dynamic_int8_emulated,
    doc="int8 operands in fp32, K in chunks of 1024 so every partial sum is exact, int32 total + fused rescale",
)

MX_EMULATED = Lowering(
    name="mx_dequant_mm",
    family="mx",
    kind=KernelPreference.EMULATED,
    supports=_always,
    emit=emit_mx_emulated,
    doc="MX operands decoded exactly (e8m0 via its bits or aten, e2m1 by bit arithmetic) and fused, then the float mm",
)
