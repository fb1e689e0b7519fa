"""Pin AUTO's CPU woq-int8 choice for tests of one lowering, on any CPU (shared by tests).

AUTO takes qlower.woq_int8_gemm where it was measured faster on the CPU's ISA level (`WOQ_GEMM_MAX_M` and the
small-weight limits in lowerings/devices/cpu.py), so which lowering a small test model gets depends on the
machine. Tests of the other lowerings take the op out of AUTO's choice; tests of the op put it in at every M.
"""

from __future__ import annotations

import pytest
import torch

from qlower.lowerings.devices import cpu as cpu_lowerings


def without_woq_gemm(mp: pytest.MonkeyPatch) -> None:
    """AUTO never prefers qlower.woq_int8_gemm: it picks among the other CPU woq lowerings."""
    mp.setattr(cpu_lowerings, "WOQ_GEMM_MAX_M", {})


def with_woq_gemm(mp: pytest.MonkeyPatch) -> None:
    """AUTO prefers qlower.woq_int8_gemm at every M and weight size, for every activation dtype."""
    isa = cpu_lowerings.cpu_woq_isa()
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        mp.setitem(cpu_lowerings.WOQ_GEMM_MAX_M, (isa, dtype), cpu_lowerings.WOQ_GEMM_EVERY_M)
    mp.setattr(cpu_lowerings, "WOQ_GEMM_MIN_WEIGHT", {})
    mp.setattr(cpu_lowerings, "WOQ_GEMM_MIN_WEIGHT_DEFAULT", 0)
    mp.setattr(cpu_lowerings, "WOQ_GEMM_SMALL_PACKED", {})
