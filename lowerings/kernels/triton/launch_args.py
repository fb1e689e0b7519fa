"""Host-side helpers every Triton launcher here shares: grid arithmetic that works on SymInts, and scale or
bias vectors flattened for a kernel that reads them with one stride."""

from __future__ import annotations

from typing import Any

import torch


def cdiv(a: Any, b: int) -> Any:
    """ceil(a / b) for ints and SymInts (no guard: plain integer arithmetic)."""
    return (a + b - 1) // b


def is_static(x: Any) -> bool:
    """An int, or a SymInt that tracing has specialized to a constant."""
    return isinstance(x, int) or (isinstance(x, torch.SymInt) and x.node.is_constant())


def flat(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A 1-D view and its stride: 0 for a per-tensor value, so the kernel reads one element for all."""
    v = t.reshape(-1)
    return v, (0 if v.numel() == 1 else v.stride(0))
