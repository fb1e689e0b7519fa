"""qlower: quantized linears lowered to the best kernel of each device under torch.compile and AOTInductor.

model = torch.compile(model, options=qlower.inductor_options())
print(qlower.last_report())
"""

from __future__ import annotations

from qlower.cpu_memory import keep_freed_cpu_memory
from qlower.lowerings import (
    KernelPreference,
    Lowering,
    QLowerError,
    UnsupportedPlatformError,
    register_backend,
    unregister_backend,
)
from qlower.options import inductor_options
from qlower.passes import Decision, QLowerPass, Report, all_reports, clear_reports, last_report
from qlower.patterns import FAMILIES, QuantLinear, Rejection

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "Decision",
    "KernelPreference",
    "Lowering",
    "QLowerError",
    "QLowerPass",
    "QuantLinear",
    "Rejection",
    "Report",
    "UnsupportedPlatformError",
    "all_reports",
    "clear_reports",
    "inductor_options",
    "keep_freed_cpu_memory",
    "last_report",
    "register_backend",
    "unregister_backend",
]
