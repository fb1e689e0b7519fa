"""MX model forms for the tests: hand-written dequantizations and torchao's EMULATED config.

Each hand-written form is a function (x, q, e) -> y over a fixed (N, K), written the way users spell it; the
tests check qlower recognizes every one of them and computes the same numbers.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from qlower.patterns import mx_format as fmt


def hand_written_forms(n: int, k: int) -> dict[str, Callable[..., torch.Tensor]]:
    """name -> f(x, q, e): fp8 [N, K] or packed e2m1 [N, K / 2] elements q, codes e [N, K / 32]."""

    def e8m0_float(x, q, e):  # e: float8_e8m0fnu; .float() is the decode
        w = (q.float().view(n, k // 32, 32) * e.float().unsqueeze(-1)).view(n, k).to(x.dtype)
        return F.linear(x, w)

    def pow2_fp32_matmul(x, q, e):  # e: uint8; the matmul in fp32, cast at the end
        w = (q.float().view(n, k // 32, 32) * 2 ** (e.float() - 127)[..., None]).view(n, k)
        return (x.float() @ w.t()).to(x.dtype)

    def exp2_repeat_interleave(x, q, e):
        s = torch.exp2(e.to(torch.int32) - 127).repeat_interleave(32, dim=1)
        return F.linear(x, (q.to(torch.bfloat16) * s).to(x.dtype))

    def fp4_table_scale_t(x, q, e):  # e stored [K / 32, N]: e.t() is the plain [N, K / 32]
        lut = torch.tensor(fmt.E2M1_VALUES, device=q.device)
        vals = lut[torch.stack([q & 15, q >> 4], -1).view(n, k).long()]
        s = torch.exp2(e.t().float() - 127)
        return F.linear(x, (vals.view(n, k // 32, 32) * s[..., None]).view(n, k).to(x.dtype))

    def fp4_table_moved(x, q, e):
        # `torch.tensor(list, device=q.device)` under dynamic shapes on CUDA traces as a host-built table moved
        # by prims.device_put; spelled out so a CPU trace holds the same node
        lut = torch.ops.prims.device_put(torch.tensor(fmt.E2M1_VALUES), q.device)
        vals = lut[torch.stack([q & 15, q >> 4], -1).view(n, k).long()]
        return F.linear(x, (vals.view(n, k // 32, 32) * torch.exp2(e.float() - 127)[..., None]).view(n, k).to(x.dtype))

    def e8m0_einsum(x, q, e):  # e: float8_e8m0fnu; the product written with torch.einsum
        w = (q.float().view(n, k // 32, 32) * e.float().unsqueeze(-1)).view(n, k).to(x.dtype)
        return torch.einsum("...k,nk->...n", x, w)

    def fp4_bits_bias_3d(x, q, e):  # x [B, T, K], bias
        w = fmt.dequantize(q, e, "e2m1", x.dtype)
        return F.linear(x, w, torch.ones(n, dtype=x.dtype, device=x.device))

    return {
        "e8m0_float": e8m0_float,
        "pow2_fp32_matmul": pow2_fp32_matmul,
        "exp2_repeat_interleave": exp2_repeat_interleave,
        "fp4_table_scale_t": fp4_table_scale_t,
        "fp4_table_moved": fp4_table_moved,
        "e8m0_einsum": e8m0_einsum,
        "fp4_bits_bias_3d": fp4_bits_bias_3d,
    }


def form_inputs(name: str, n: int, k: int, m: int = 5, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, q, e) for a hand-written form, and as its float64 reference needs them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float32).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g) * k**-0.5
    elem = "e2m1" if name.startswith("fp4") else "e4m3"
    q, e = fmt.quantize(w, elem)
    if name in ("e8m0_float", "e8m0_einsum"):
        e = e.view(torch.float8_e8m0fnu)
    if name == "fp4_table_scale_t":
        e = e.t().contiguous()
    if name == "fp4_bits_bias_3d":
        x = x.view(1, m, k)
    return x, q, e


def reference(name: str, x: torch.Tensor, q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """float64 x @ dequant(q, e).T (+ bias) for `form_inputs`."""
    elem = "e2m1" if name.startswith("fp4") else "e4m3"
    codes = e.t() if name == "fp4_table_scale_t" else e
    w = fmt.dequantize_f64(q, codes, elem)
    y = x.double().reshape(-1, w.shape[1]) @ w.t()
    if name == "fp4_bits_bias_3d":
        y = (y + 1).reshape(*x.shape[:-1], -1)
    return y


def torchao_mx_model(elem: str, bias: bool, mode: str = "FLOOR", k: int = 64, n: int = 48) -> torch.nn.Module:
    """torchao's MXDynamicActivationMXWeightConfig with KernelPreference.EMULATED on a bf16 Linear."""
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    dt = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.float4_e2m1fn_x2}[elem]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(torch.bfloat16)
    cfg = MXDynamicActivationMXWeightConfig(
        activation_dtype=dt,
        weight_dtype=dt,
        kernel_preference=KernelPreference.EMULATED,
        scaling_mode=getattr(ScaleCalculationMode, mode),
    )
    quantize_(m, cfg)
    return m


def trace(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> fx.GraphModule:
    """qlower.testing.trace_for_inductor, tolerating graphs whose tensor constants cannot be deep-copied
    (torchao's fp4 unpacking leaves scalar constants that fake tensor storage refuses to copy)."""
    import qlower.testing as qt

    qt.copy = types.SimpleNamespace(deepcopy=lambda obj: obj)  # type: ignore[attr-defined]
    try:
        return qt.trace_for_inductor(fn, *args, dynamic=dynamic)
    finally:
        qt.copy = copy  # type: ignore[attr-defined]


class MXLinear(torch.nn.Module):
    """A hand-written MX linear: weight-only, or MX-quantized activations too; optional bias. Weights are buffers
    (static shapes under dynamic=True, as parameters are); generated on `device` from `seed`."""

    def __init__(
        self,
        a_elem: str | None,
        w_elem: str,
        n: int,
        k: int,
        e8m0: bool = False,
        bias: bool = False,
        seed: int = 3,
        device: str = "cpu",
    ) -> None:
        super().__init__()
        g = torch.Generator(device=device).manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, device=device, generator=g) * k**-0.5, w_elem)
        self.register_buffer("q", q)
        self.register_buffer("e", e.view(torch.float8_e8m0fnu) if e8m0 else e)
        self.register_buffer("b", torch.randn(n, device=device, generator=g) * 0.1 if bias else None)
        self.a_elem, self.w_elem, self.n, self.k = a_elem, w_elem, n, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.k)
        if self.a_elem is not None:
            xq, xe = fmt.quantize(x2.float(), self.a_elem)
            x2 = fmt.dequantize(xq, xe, self.a_elem, x.dtype)
        w = fmt.dequantize(self.q, self.e, self.w_elem, x.dtype)
        b = None if self.b is None else self.b.to(x.dtype)
        return F.linear(x2, w, b).reshape(*x.shape[:-1], self.n)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 x @ dequant(w).T (+ b): the weight-only reference (activation-quantized forms use eager)."""
        w = fmt.dequantize_f64(self.q, self.e.view(torch.uint8), self.w_elem)
        y = x.double().reshape(-1, self.k) @ w.t()
        if self.b is not None:
            y = y + self.b.to(x.dtype).double()
        return y.reshape(*x.shape[:-1], self.n)
