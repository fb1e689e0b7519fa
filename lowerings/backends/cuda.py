"""CUDA backend. Never `_weight_int8pack_mm` here: on H200 it is a naive kernel, 9-770x slower than bf16
(shared/notes/baselines.md). Until qlower's Triton kernels land, woq-int8 uses the fused dequant path, which
is what stock Inductor generates for the same model (so AUTO is never slower than stock).
"""

from __future__ import annotations

import torch

from qlower.lowerings.backends.capability import cuda_capability, override_cuda_capability  # noqa: F401  (MX capability rules)
from qlower.lowerings.backends.dynamic_int8_rules import DYNAMIC_INT8_INT_MM_CUDA
from qlower.lowerings.backends.emulated import DYNAMIC_INT8_EMULATED, WOQ_INT8_DEQUANT_MM
from qlower.lowerings.backends.mx_rules import MX_EMULATED, MX_SCALED_MM
from qlower.lowerings.registry import register_backend
from qlower.lowerings.emit.triton_int8 import LOWERINGS as TRITON_LOWERINGS
from qlower.lowerings.emit.triton_int8 import LOWERINGS_LAST as TRITON_LAST
from qlower.lowerings.emit.triton_mx import MX_TRITON, MX_TRITON_ANY_M


def describe(device: torch.device) -> str:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return f"{device} ({torch.cuda.get_device_name(device)}, capability {major}.{minor})"
    return f"{device} (capability unknown: CUDA not available in this process)"


def register() -> None:
    register_backend(
        "cuda",
        [
            *TRITON_LOWERINGS,
            WOQ_INT8_DEQUANT_MM,
            DYNAMIC_INT8_INT_MM_CUDA,
            DYNAMIC_INT8_EMULATED,
            MX_SCALED_MM,
            MX_TRITON,
            MX_EMULATED,
            MX_TRITON_ANY_M,
            *TRITON_LAST,
        ],
        describe=describe,
        replace=True,
    )
