"""The device-agnostic MX lowerings (fused emulation) and the cuBLAS one of capability >= 10.0.

Per-device modules rank them: CPU and XPU emulate (XPU `_scaled_mm` takes no MX block scales as of 2.13);
CUDA tries `_scaled_mm` (capability >= 10.0), then qlower's Triton kernels, then emulation.
"""

from __future__ import annotations

import torch

from qlower.patterns import mx_format as fmt
from qlower.patterns.record import QuantLinear

from qlower.lowerings.backends.capability import cuda_capability, describe_capability
from qlower.lowerings.emit.mx import emit_emulated, emit_scaled_mm, spec_layout_blocker
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering

SCALED_MM_MIN_CAPABILITY = (10, 0)  # cuBLAS block-scaled (MX) GEMMs: Blackwell and newer
_SCALED_MM_OUT = (torch.bfloat16, torch.float16, torch.float32)


def _always(rec: QuantLinear) -> str | None:
    return None


def supports_scaled_mm(rec: QuantLinear) -> str | None:
    if rec.device.type != "cuda":
        return f"device {rec.device} is not CUDA"
    cap = cuda_capability(rec.device)
    if cap is None or cap < SCALED_MM_MIN_CAPABILITY:
        need = ".".join(map(str, SCALED_MM_MIN_CAPABILITY))
        return (
            f"MX block-scaled cuBLAS GEMMs need CUDA capability >= {need}; this device's is "
            f"{describe_capability(cap)} (cuBLAS would fail with CUBLAS_STATUS_NOT_SUPPORTED at run time)"
        )
    aq = rec.act_quant
    if aq is None:
        return "weight-only MX: _scaled_mm needs both operands MX-quantized"
    a_elem, w_elem = aq.details["elem"], rec.details["w_elem"]
    if a_elem != w_elem or a_elem not in ("e4m3", "e2m1"):
        return f"_scaled_mm takes MXFP8 e4m3 x e4m3 or MXFP4 x MXFP4, not {a_elem} x {w_elem}"
    if rec.n % 16 or rec.k % 32:
        return f"_scaled_mm needs N % 16 == 0 and K % 32 == 0 (N={rec.n}, K={rec.k})"
    if rec.compute_dtype not in _SCALED_MM_OUT:
        return f"output dtype {rec.compute_dtype}"
    return spec_layout_blocker(rec)


MX_EMULATED = Lowering(
    name="mx_dequant_mm",
    family="mx",
    kind=KernelPreference.EMULATED,
    supports=_always,
    emit=emit_emulated,
    doc="MX operands decoded exactly (e8m0 via its bits or aten, e2m1 by bit arithmetic) and fused, then the float mm",
)

MX_SCALED_MM = Lowering(
    name="aten._scaled_mm.mx",
    family="mx",
    kind=KernelPreference.ATEN,
    supports=supports_scaled_mm,
    emit=emit_scaled_mm,
    doc=f"cuBLAS MX GEMM (_scaled_mm v1, swizzled e8m0 scales, block {fmt.BLOCK}); capability >= 10.0",
)
