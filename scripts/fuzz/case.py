"""One fuzz case: every random choice of it (`scripts.fuzz.draw.make_case` draws them), JSON-ready.

A module of its own: the defect classes (classes.py, pipelines.py), the draws, the models and the steps all
take a `Case`, and none of them needs another to name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

FAMILIES = ("woq_int8", "dynamic_int8", "mx")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass
class Case:
    seed: int
    device: str
    family: str
    form: str
    dtype: str
    m: int  # rows per batch entry (the dim marked dynamic)
    k: int
    n: int
    batch: int | None  # None: 2-D input [M, K]; else [batch, M, K]
    bias: bool
    preference: str
    dynamic: bool
    m2: int | None = None  # the second call's M (dynamic cases)
    extra: dict[str, Any] = field(default_factory=dict)

    def x_shape(self, m: int) -> tuple[int, ...]:
        dims = self.extra.get("x_dims")  # a vector [K], or the right operand [K, M] of `w @ v` (classes.py)
        if dims == "k":
            return (self.k,)
        if dims == "k,m":
            return (self.k, m)
        return (m, self.k) if self.batch is None else (self.batch, m, self.k)

    def m_of(self, x: torch.Tensor) -> int:
        """The M of an input of `x_shape`."""
        dims = self.extra.get("x_dims")
        return 1 if dims == "k" else x.shape[-1] if dims == "k,m" else x.shape[-2]

    def describe(self) -> str:
        ext = "".join(f" {k}={v}" for k, v in self.extra.items())
        dyn_ = f" dyn(M {self.m}->{self.m2})" if self.dynamic else ""
        shape = "x".join(map(str, self.x_shape(self.m)))
        return (
            f"{self.family} {self.form} {SHORT[self.dtype]} x={shape} "
            f"N={self.n}{' bias' if self.bias else ''}{ext} pref={self.preference}{dyn_}"
        )
