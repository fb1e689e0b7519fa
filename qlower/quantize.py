"""Tiny gpt-fast-style quantizers for the demo, the benchmarks and the tests.

They produce the plain-PyTorch graph forms users write (not tensor subclasses), which is what qlower's patterns
must recognise. One function per family, registered in `QUANTIZERS`: adding a family is one function and one
dict entry.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from qlower.lowerings.devices.cuda import CUDA_KN_MULTIPLE, CUDA_MIN_M
from qlower.patterns import mx_format  # noqa: F401  (public: MX quantize / dequantize, for benchmarks and users)


def quantize_per_row_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w [N, K] ~= q [N, K] * scale [N, 1]. Scale in fp32, q int8."""
    amax = w.detach().abs().amax(dim=1).to(torch.float32).clamp(min=1e-8)
    scale = amax / 127.0
    q = torch.round(w.detach().to(torch.float32) / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale


class WeightOnlyInt8Linear(nn.Module):
    """gpt-fast's form: `F.linear(x, w.to(x.dtype)) * s`, int8 weight [N, K], per-row scale [N]."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> WeightOnlyInt8Linear:
        q, scale = quantize_per_row_int8(linear.weight)
        dtype = linear.weight.dtype
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale.to(dtype), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scales
        return y if self.bias is None else y + self.bias


class DynamicInt8Linear(nn.Module):
    """Dynamic int8 (per-token symmetric activations x per-channel int8 weights), the hand-written form:
    quantize x in the graph, `torch._int_mm` on int8, rescale in fp32 (in eager, shapes cuBLAS refuses take an
    exact float64 matmul: `_int8_matmul`)."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("weight", weight)  # int8 [N, K]
        self.register_buffer("scales", scales)  # fp32 [N]
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> DynamicInt8Linear:
        q, scale = quantize_per_row_int8(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(q, scale, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        s = x2.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-8) / 127.0
        xq = torch.round(x2 / s).clamp(-127, 127).to(torch.int8)
        y = _int8_matmul(xq, self.weight.t()) * s * self.scales
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)


def _int_mm_takes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `torch._int_mm` runs these shapes here (the CUDA rules the dynamic-int8 lowerings check too)."""
    if a.device.type != "cuda":
        return True
    m, k = a.shape
    return m >= CUDA_MIN_M and k % CUDA_KN_MULTIPLE == 0 and b.shape[1] % CUDA_KN_MULTIPLE == 0


def _int8_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] @ int8 [K, N] -> int32, exactly. Traced (torch.compile, torch.export) it is always
    `torch._int_mm`, the form qlower recognizes; in eager, shapes cuBLAS refuses (decode's M = 1) take a float64
    matmul, exact while K * 127**2 < 2**53."""
    if torch.compiler.is_compiling() or _int_mm_takes(a, b):
        return torch._int_mm(a, b)
    return (a.double() @ b.double()).to(torch.int32)


def _replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Swap every nn.Linear below `model` for `make(linear)`; returns how many were swapped."""
    count = 0
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, make(child))
            count += 1
        else:
            count += _replace_linears(child, make)
    return count


def quantize_woq_int8(model: nn.Module) -> int:
    """Weight-only int8 for every nn.Linear of `model`, in place. Returns the number of linears quantized."""
    return _replace_linears(model, WeightOnlyInt8Linear.from_linear)


def quantize_dynamic_int8(model: nn.Module) -> int:
    """Dynamic int8 for every nn.Linear of `model`, in place. Returns the number of linears quantized."""
    return _replace_linears(model, DynamicInt8Linear.from_linear)


Quantizer = Callable[[nn.Module], int]

# family name (a key of qlower.FAMILIES) -> in-place quantizer returning the number of linears it replaced.
QUANTIZERS: dict[str, Quantizer] = {
    "woq_int8": quantize_woq_int8,
    "dynamic_int8": quantize_dynamic_int8,
}
