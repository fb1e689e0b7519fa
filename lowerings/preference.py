"""Kernel preference: one device-agnostic knob for which kind of kernel a lowering may use.

Modelled on torchao's `KernelPreference` (AUTO | TORCH | EMULATED ...): the user says what kind of kernel
they want, each backend says which of its lowerings are of that kind.
"""

from __future__ import annotations

import enum


class KernelPreference(str, enum.Enum):
    """Which kind of lowering the registry may pick for a matched quantized linear."""

    AUTO = "auto"  # the backend's ranked list; first lowering that supports the candidate wins
    ATEN = "aten"  # an ATen kernel with native quantized support (_weight_int8pack_mm, _int_mm, _scaled_mm)
    TRITON = "triton"  # one of qlower's own Triton kernels
    EMULATED = "emulated"  # dequantize, then a high-precision matmul that Inductor fuses; works anywhere

    def __str__(self) -> str:
        return self.name
