"""The graph forms of a dynamic-int8 linear that qlower's pattern must recognise, as small modules.

Each form computes y = dequant(quant(x)) @ dequant(w).T (+ b) its own way; the tests trace them (pattern
expect-tests), compile them (numerics, generated code) and compare with eager and a float64 reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch._higher_order_ops.out_dtype import out_dtype

from qlower.quantize import quantize_per_row_int8
from tests.forms.woq_int8 import split_heads

aten = torch.ops.aten


def per_token(x2: torch.Tensor, qmin: int = -127, divide: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token int8: x2 [M, K] ~= xq * s, s [M, 1] fp32."""
    s = x2.abs().amax(dim=-1, keepdim=True).to(torch.float32).clamp(min=1e-8) / 127.0
    scaled = x2 / s if divide else x2 * torch.reciprocal(s)
    return torch.round(scaled).clamp(qmin, 127).to(torch.int8), s


class Form(nn.Module):
    """Common state: int8 weight q [N, K] (or stored [K, N]), fp32 per-channel scale s [N], optional bias."""

    def __init__(self, k: int, n: int, bias: bool = True, kn: bool = False, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(n, k, generator=g) * k**-0.5
        q, s = quantize_per_row_int8(w)
        self.register_buffer("q", q.t().contiguous() if kn else q)
        self.register_buffer("s", s)
        self.register_buffer("b", torch.randn(n, generator=g) * 0.1 if bias else None)
        self.kn = kn

    def q_nk(self) -> torch.Tensor:
        return self.q.t() if self.kn else self.q

    def finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.b is not None:
            y = y + self.b
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 y = x @ dequant(w).T + b: the unquantized-activation reference."""
        w = self.q_nk().double() * self.s.double()[:, None]
        y = x.double() @ w.t()
        return y if self.b is None else y + self.b.double()


class IntMMDivide(Form):
    """Hand-written: divide by the scale, clamp [-127, 127], `torch._int_mm`, rescale in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        return self.finish(torch._int_mm(xq, self.q_nk().t()) * sx * self.s, x)


class QuantizeThenFlatten(Form):
    """torchao's order: per-token quantize the N-D activation, then flatten codes and scales for `_int_mm`
    (at x [1, 1, K] Inductor once handed `_int_mm` a [1, K] view with strides (0, 1))."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x)
        k = x.shape[-1]
        y = torch._int_mm(xq.reshape(-1, k), self.q_nk().t()) * sx.reshape(-1, 1) * self.s
        return self.finish(y, x)


class IntMMReciprocal(Form):
    """Hand-written: multiply by the reciprocal, clamp [-128, 127], scales applied weight-first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]), qmin=-128, divide=False)
        y = torch._int_mm(xq, self.q_nk().t()).to(torch.float32) * self.s * sx
        return self.finish(y, x)


class OutDtypeMM(Form):
    """`out_dtype(aten.mm, torch.int32, xq, w.t())` (torchao's safe_int_mm under compile)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        acc = out_dtype(aten.mm.default, torch.int32, xq, self.q_nk().t())
        return self.finish(acc.to(torch.float32) * sx * self.s, x)


class Int32MM(Form):
    """`torch.mm(xq.to(int32), w.to(int32))`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        acc = torch.mm(xq.to(torch.int32), self.q_nk().t().to(torch.int32))
        return self.finish(acc * sx * self.s, x)


class FloatCarrier(Form):
    """int8 values carried in fp32 through a float matmul (torchao's CPU out_dtype spelling)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        acc = torch.mm(xq.to(torch.float32), self.q_nk().t().to(torch.float32))
        return self.finish(acc * sx * self.s, x)


class DequantBoth(Form):
    """Dequantize both operands by hand, then F.linear in float (the reference representation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        xd = xq.to(torch.float32) * sx
        wd = self.q_nk().to(torch.float32) * self.s[:, None]
        y = F.linear(xd, wd, self.b)
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])


class DequantEinsum(Form):
    """DequantBoth with the product written as `torch.einsum` (a batch-1 bmm until qlower canonicalizes it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        xd = xq.to(torch.float32) * sx
        wd = self.q_nk().to(torch.float32) * self.s[:, None]
        return self.finish(torch.einsum("mk,nk->mn", xd, wd), x)


class AsymInt32(Form):
    """Asymmetric per-token activations, zero point subtracted in int32 before the matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        lo, hi = x2.amin(-1, keepdim=True).clamp(max=0), x2.amax(-1, keepdim=True).clamp(min=0)
        sx = ((hi - lo) / 255.0).clamp(min=1e-8).to(torch.float32)
        zp = (-128 - torch.round(lo / sx)).to(torch.int32)
        xq = torch.clamp(torch.round(x2 / sx) + zp, -128, 127).to(torch.int8)
        acc = torch.mm(xq.to(torch.int32) - zp, self.q_nk().t().to(torch.int32))
        return self.finish(acc * sx * self.s, x)


class PT2E(Form):
    """The PT2E reference representation: quantized_decomposed q/dq per token, per-channel weight, linear."""

    def __init__(self, k: int, n: int, asymmetric: bool = False, **kw) -> None:
        super().__init__(k, n, **kw)
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

        self.asymmetric = asymmetric
        self.register_buffer("zp", torch.zeros(n, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qd = torch.ops.quantized_decomposed
        choose = qd.choose_qparams_per_token_asymmetric if self.asymmetric else qd.choose_qparams_per_token
        s, zp = choose(x, torch.int8)
        xq = qd.quantize_per_token(x, s, zp, -128, 127, torch.int8)
        xd = qd.dequantize_per_token(xq, s, zp, -128, 127, torch.int8, torch.float32)
        wd = qd.dequantize_per_channel(self.q_nk(), self.s, self.zp, 0, -127, 127, torch.int8)
        return F.linear(xd, wd, self.b).to(x.dtype)


def torchao_linear(k: int, n: int, bias: bool = True, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """nn.Linear quantized by torchao's Int8DynamicActivationInt8WeightConfig."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(k, n, bias=bias)).to(dtype)
    quantize_(m, Int8DynamicActivationInt8WeightConfig())
    return m


def rewrite_and_run(fn, *args, dynamic: bool = False, **pass_kw):
    """Run `fn` through Dynamo + AOTAutograd + qlower's pass and execute the rewritten aten graph eagerly
    (no Inductor codegen): the lowering's numerics in a fraction of a compile's time. Returns (out, report)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    from qlower.testing import apply_pass

    reports = []

    def compiler(gm, example_inputs):
        reports.append(apply_pass(gm, **pass_kw))
        return gm.forward

    backend = aot_autograd(
        fw_compiler=compiler, inference_compiler=compiler, decompositions=select_decomp_table()
    )
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*args)
    return out, reports[-1]


def retarget(gm: torch.fx.GraphModule, device: str) -> torch.fx.GraphModule:
    """Move every fake value of a traced graph to `device` (e.g. 'cuda', 'xpu' on a CPU-only machine), so the
    registry and the emitters can be exercised for that device without it."""
    from torch._subclasses.fake_tensor import FakeTensor

    for node in gm.graph.nodes:
        v = node.meta.get("val")
        if isinstance(v, FakeTensor):
            with v.fake_mode:
                meta = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
            node.meta["val"] = FakeTensor(v.fake_mode, meta, torch.device(device))
    return gm


# ------------------------------------------------------------------------------------------ fuzz variants
# Forms scripts/fuzz_compile.py's variants draw (view_epilogue, expanded_scale).


class RescaleAfterView(Form):
    """The rescale written after the heads view: `acc.view(..., H, D) * sx.view(..., 1, 1) * s.view(H, D)`
    (+ b.view(H, D)) — the same linear, its per-token scale a per-row-looking [.., 1, 1] factor."""

    def __init__(self, k: int, n_heads: int, head_dim: int, spelling: str = "view", **kw) -> None:
        super().__init__(k, n_heads * head_dim, **kw)
        self.h, self.d, self.spelling = n_heads, head_dim, spelling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        xq, sx = per_token(x.reshape(-1, x.shape[-1]))
        acc = torch._int_mm(xq, self.q_nk().t())
        y = split_heads(acc.view(*lead, acc.shape[-1]), lead, self.h, self.d, self.spelling)
        y = y * sx.view(*lead, 1, 1) * self.s.view(self.h, self.d)
        if self.b is not None:
            y = y + self.b.view(self.h, self.d)
        return y.to(x.dtype)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return super().reference(x).reshape(*x.shape[:-1], self.h, self.d)


X_SCALES = ("m1", "0d")
W_SCALES = ("n", "1n", "n1", "0d")
RESCALE_ORDERS = ("torchao", "x_first", "w_first")


class ExpandScales(Form):
    """Scales reaching the rescale through `.expand(M, N)`, as torchao's dynamic int8 emits on CUDA
    (`(_int_mm(xq, w.t()) * x_scale.expand(M, N)).to(dtype) * w_scale`): the activation scale per token [M, 1]
    or per tensor (0-d), the weight scale [N], [1, N] or [N, 1] (transposed first) expanded, or 0-d (the
    weight quantized per tensor)."""

    def __init__(
        self, k: int, n: int, x_scale: str = "m1", w_scale: str = "n", order: str = "torchao", **kw
    ) -> None:
        super().__init__(k, n, **kw)
        if w_scale == "0d":
            w = self.q_nk().float() * self.s[:, None]
            s0 = w.abs().amax().clamp(min=1e-8) / 127
            q = torch.round(w / s0).clamp(-127, 127).to(torch.int8)
            self.q, self.s = (q.t().contiguous() if self.kn else q), s0
        else:
            self.s = self.s.reshape({"n": (n,), "1n": (1, n), "n1": (n, 1)}[w_scale]).contiguous()
        self.x_scale, self.w_scale, self.order = x_scale, w_scale, order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        m, n = x2.shape[0], self.q_nk().shape[0]
        if self.x_scale == "m1":
            xq, sx = per_token(x2)
        else:
            sx = x2.abs().amax().to(torch.float32).clamp(min=1e-8) / 127.0
            xq = torch.round(x2 / sx).clamp(-127, 127).to(torch.int8)
        acc = torch._int_mm(xq, self.q_nk().t())
        s = self.s
        xs = sx.expand(m, n)
        ws = s if self.w_scale == "n" else (s.t() if self.w_scale == "n1" else s).expand(m, n)
        if self.order == "torchao":
            y = (acc * xs).to(x.dtype) * ws
        elif self.order == "x_first":
            y = acc.to(torch.float32) * xs * ws
        else:
            y = acc * ws * xs
        return self.finish(y, x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        w = self.q_nk().double() * self.s.double().reshape(-1, 1)
        y = x.double() @ w.t()
        return y if self.b is None else y + self.b.double()
