"""The quantized models the AOTInductor tests export (shared by tests): a two-linear MLP per family, quantized
by qlower.quantize's quantizers, and a hand-written weight-only MX linear for the family that has none there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qlower.lowerings.aoti.dtypes import shim_has_dtype
from qlower.patterns import mx_format
from qlower.quantize import QUANTIZERS

BF16 = torch.bfloat16


class MxWeightOnlyLinear(nn.Module):
    """Hand-written weight-only MX: fp8 (e4m3) or packed fp4 (e2m1) elements, e8m0 scale codes per 32."""

    def __init__(self, linear: nn.Linear, elem: str) -> None:
        super().__init__()
        q, codes = mx_format.quantize(linear.weight.detach().float(), elem)
        self.elem = elem
        # MX dtypes where the shim can name them (torch >= 2.12), else raw bytes (qlower.lowerings.aoti.dtypes says why)
        mx_dtypes = shim_has_dtype(torch.float4_e2m1fn_x2) and shim_has_dtype(torch.float8_e8m0fnu)
        self.register_buffer("q", q.view(torch.float4_e2m1fn_x2) if elem == "e2m1" and mx_dtypes else q)
        self.register_buffer("codes", codes.view(torch.float8_e8m0fnu) if mx_dtypes else codes)
        self.register_buffer("bias", linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, mx_format.dequantize(self.q, self.codes, self.elem, x.dtype), self.bias)


def quantize_mx(model: nn.Sequential) -> int:
    """MXFP8 for the first linear, MXFP4 for the second (until qlower.quantize has an MX quantizer)."""
    model[0] = MxWeightOnlyLinear(model[0], "e4m3")
    model[2] = MxWeightOnlyLinear(model[2], "e2m1")
    return 2


def quantized_mlp(family: str, device: str) -> nn.Module:
    """Two linears (K = 64, a multiple of 16 and of the MX block) quantized by the family's quantizer."""
    quantize = QUANTIZERS.get(family) or {"mx": quantize_mx}.get(family)
    if quantize is None:
        pytest.fail(f"family {family!r} has no quantizer in qlower.quantize.QUANTIZERS: add one to export it")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).to(BF16)
    assert quantize(model) == 2
    return model.to(device).eval()
