"""Epilogue ops after a quantized matmul: absorbed only when their meaning on the 2-D [M, N] output is proven.

A linear whose output is split into heads (`.view(B, S, H, D)`) and then scaled or biased over the last viewed
dim must keep that op in the graph, applied to the lowered value (the walk ends at a view that changes the
last dim); views that keep N and only regroup the rows are still walked through, and the scale / bias after
them is absorbed. A factor reached through `expand` (torchao's CUDA form `_int_mm * x_scale.expand(M, N)`) is
stored as its un-expanded source. A zero-point correction qlower does not express is left alone with a reason
that names it. Every case: no crash, eager's numbers (and float64's where the module is exact), the report row.

Most cases run the rewritten aten graph eagerly (Dynamo + AOTAutograd + qlower's pass, no codegen: seconds);
the expand forms compile with `qlower.inductor_options()` too. `@pytest.mark.gpu` tests run the same modules on
CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import qlower
from qlower.patterns import dynamic_int8
from qlower.patterns import mx_format as fmt
from qlower.quantize import quantize_per_row_int8
from qlower.testing import apply_pass, trace_for_inductor
from tests.forms.dynamic_int8 import per_token, retarget

B, S, H, D = 2, 3, 4, 16
N, K = H * D, 64
aten = torch.ops.aten


# ---- modules: one quantized linear per family, then an epilogue over [B, S, N] ----


class _Base(nn.Module):
    """Buffers shared by every family: a per-channel scale, a bias, and factors over the viewed head dims."""

    def __init__(self, epilogue: str, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.epilogue = epilogue
        self.register_buffer("b", torch.randn(N, generator=g) * 0.1)
        self.register_buffer("g_d", torch.randn(D, generator=g))
        self.register_buffer("g_hd", torch.randn(H, D, generator=g))
        self.register_buffer("g_111d", torch.randn(1, 1, 1, D, generator=g))

    def heads(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The epilogue after the linear's [B, S, N] (or [M, N]) output."""
        b = x.shape[0]
        e = self.epilogue
        if e.startswith("flatten"):  # regroups the rows only: N stays the last dim
            return y.reshape(b * S, N) + self.b
        v = y.reshape(b, S, H, D)
        if e == "view_bias_d":
            return v + self.g_d
        if e == "view_bias_hd":
            return v + self.g_hd
        if e == "view_bias_111d":
            return v + self.g_111d
        if e == "view_mul_d":
            return v * self.g_d
        if e == "view_mul_row":  # looks per-row ([B, S, 1, 1]), but is applied to the split view
            return v * x.abs().amax(-1, keepdim=True)[..., None]
        raise ValueError(e)


class WoqHeads(_Base):
    """gpt-fast woq-int8: F.linear(x, w.to(x.dtype)) [* s], then the epilogue. `scaled`: where the scale is."""

    def __init__(self, epilogue: str, scaled: str = "before_view") -> None:
        super().__init__(epilogue)
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g))
        self.register_buffer("s", torch.rand(N, generator=g) * 0.02 + 0.005)
        self.scaled = scaled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.w.to(x.dtype))
        if self.scaled == "before_view":
            return self.heads(y * self.s, x)
        if self.scaled == "after_view":  # the per-channel scale applied to the split view: not absorbed
            return y.reshape(x.shape[0], S, H, D) * self.s.reshape(H, D) + self.g_d
        if self.scaled == "after_flatten":  # absorbed: the flatten keeps N last
            return y.reshape(x.shape[0] * S, N) * self.s + self.b
        return self.heads(y, x)


class DynamicHeads(_Base):
    """Hand-written dynamic int8: per-token quantize, `_int_mm`, rescale, then the epilogue."""

    def __init__(self, epilogue: str, scaled: str = "before_view") -> None:
        super().__init__(epilogue)
        g = torch.Generator().manual_seed(2)
        q, s = quantize_per_row_int8(torch.randn(N, K, generator=g) * K**-0.5)
        self.register_buffer("q", q)
        self.register_buffer("s", s)
        self.scaled = scaled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        xq, sx = per_token(x.reshape(-1, K))
        acc = torch._int_mm(xq, self.q.t())
        if self.scaled == "before_view":
            return self.heads((acc * sx * self.s).reshape(b, S, N), x)
        if self.scaled == "row_before_view":  # the column scale applied to the split view: not absorbed
            return (acc * sx).reshape(b, S, H, D) * self.s.reshape(H, D)
        if self.scaled == "after_view":  # no scale before the split: nothing to lower
            return acc.reshape(b, S, H, D) * sx.reshape(b, S, 1, 1) * self.s.reshape(H, D)
        if self.scaled == "after_flatten":  # absorbed: [B, S, N] with a [B, S, 1] per-token scale
            return acc.reshape(b, S, N) * sx.reshape(b, S, 1) * self.s + self.b
        if self.scaled == "not_per_row":  # [B, 1, 1] varies along B only: neither per token nor per channel
            return acc.reshape(b, S, N) * x.abs().amax((1, 2), keepdim=True) * self.s
        raise ValueError(self.scaled)


class MXHeads(_Base):
    """A hand-written MX linear (tests/forms/mx.py's spelling): weight-only, or MX activations too."""

    def __init__(self, epilogue: str, a_elem: str | None = None) -> None:
        super().__init__(epilogue)
        g = torch.Generator().manual_seed(3)
        q, e = fmt.quantize(torch.randn(N, K, generator=g) * K**-0.5, "e4m3")
        self.register_buffer("q", q)
        self.register_buffer("e", e)
        self.a_elem = a_elem

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, K)
        if self.a_elem is not None:
            xq, xe = fmt.quantize(x2.float(), self.a_elem)
            x2 = fmt.dequantize(xq, xe, self.a_elem, x.dtype)
        y = F.linear(x2, fmt.dequantize(self.q, self.e, "e4m3", x.dtype))
        return self.heads(y.reshape(x.shape[0], S, N), x)


# ---- running a graph through qlower's pass ----


def rewrite(fn: Callable[..., Any], *args: Any, families: tuple[str, ...]) -> tuple[Any, Any, fx.GraphModule]:
    """Dynamo + AOTAutograd + qlower's pass, then the rewritten aten graph run eagerly: (out, report, graph).

    Dynamic dims come from `torch._dynamo.mark_dynamic` on the inputs."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    seen: list[tuple[Any, fx.GraphModule]] = []

    def compiler(gm: fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        seen.append((apply_pass(gm, families=families), gm))
        return gm.forward

    backend = aot_autograd(
        fw_compiler=compiler, inference_compiler=compiler, decompositions=select_decomp_table()
    )
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(seen) == 1, len(seen)
    return out, *seen[0]


def tail_ops(gm: fx.GraphModule) -> list[str]:
    """The graph's own ops applied to the lowered value (downstream of qlower's nodes), in graph order."""
    after: set[fx.Node] = set()
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        fed = any(a.meta.get("qlower") or a in after for a in node.all_input_nodes)
        if fed and not node.meta.get("qlower"):
            after.add(node)
            out.append(node.target.overloadpacket.__name__)
    return out


def x_input(m_rows: int = B, dtype: torch.dtype = torch.float32, dynamic: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(m_rows, S, K, generator=g) + 0.2).to(dtype)
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    return x


def assert_matches(out: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor | None = None) -> None:
    """Eager's shape and numbers (fp32 matmul reassociation aside), and float64's within eager's own error."""
    assert out.shape == eager.shape and out.dtype == eager.dtype, (out.shape, eager.shape)
    scale = eager.double().abs().max().item()
    assert (out.double() - eager.double()).abs().max().item() <= 1e-5 * scale
    if ref64 is not None:
        err = (out.double() - ref64).abs().max().item()
        eager_err = (eager.double() - ref64).abs().max().item()
        assert err <= 2 * eager_err + 1e-6 * scale, (err, eager_err)


def only(report: Any) -> Any:
    (d,) = report.entries
    return d


SPLIT_VIEW = ["view_bias_d", "view_bias_hd", "view_bias_111d", "view_mul_d", "view_mul_row"]


def split_tail(epilogue: str) -> list[str]:
    """The split view and the op over its last dim stay in the graph, applied to the lowered value."""
    return ["view", "mul" if epilogue.startswith("view_mul") else "add"]


# ---- woq_int8 ----


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("epilogue", SPLIT_VIEW)
@pytest.mark.parametrize("scaled", ["before_view", "none"])
def test_woq_split_view_epilogue_stays_in_graph(epilogue: str, scaled: str, dynamic: bool) -> None:
    model = WoqHeads(epilogue, scaled)
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("woq_int8",))
    d = only(report)
    assert d.lowered, report.table()
    assert ("output_scale" in d.form) == (scaled == "before_view"), d.form
    assert "bias" not in d.form, d.form
    assert tail_ops(gm) == split_tail(epilogue)
    assert_matches(out, model(x), model.double()(x.double()))


@pytest.mark.parametrize("dynamic", [False, True])
def test_woq_scale_after_split_view_stays_in_graph(dynamic: bool) -> None:
    model = WoqHeads("", "after_view")
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("woq_int8",))
    d = only(report)
    assert d.lowered and "no_scale" in d.form, (d.form, report.table())
    assert tail_ops(gm) == ["view", "mul", "add"]
    assert_matches(out, model(x), model.double()(x.double()))


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("scaled", ["before_view", "after_flatten"])
def test_woq_flatten_view_keeps_scale_and_bias_inside(scaled: str, dynamic: bool) -> None:
    model = WoqHeads("flatten", scaled)
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("woq_int8",))
    d = only(report)
    assert d.lowered and "output_scale" in d.form and "bias" in d.form, (d.form, report.table())
    assert tail_ops(gm) == []  # the scale, the flatten and the bias are all inside the lowered call
    assert_matches(out, model(x), model.double()(x.double()))


# ---- dynamic_int8 ----


@pytest.fixture
def _s8s8(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """s8s8 `_int_mm` on any CPU, so the lowering is the same everywhere; except M = 1 on VNNI CPUs without AMX,
    where s8s8 itself (eager as lowered) is wrong
    (tests/integrations/torchao/test_torchao_dynamic_int8.py)."""
    from qlower.lowerings.devices.cpu import cpu_int8_isa

    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("m") == 1 and cpu_int8_isa() == "vnni":
        pytest.skip("s8s8 _int_mm at M = 1 is wrong on VNNI CPUs without AMX: no s8s8 reference here")
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "none")


@pytest.mark.usefixtures("_s8s8")
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("epilogue", SPLIT_VIEW)
def test_dynamic_int8_split_view_epilogue_stays_in_graph(epilogue: str, dynamic: bool) -> None:
    model = DynamicHeads(epilogue)
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("dynamic_int8",))
    d = only(report)
    assert d.lowered and "bias" not in d.form, (d.form, report.table())
    assert tail_ops(gm) == split_tail(epilogue)
    assert_matches(out, model(x))


@pytest.mark.usefixtures("_s8s8")
@pytest.mark.parametrize("dynamic", [False, True])
def test_dynamic_int8_column_scale_after_split_view_stays_in_graph(dynamic: bool) -> None:
    model = DynamicHeads("", "row_before_view")
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("dynamic_int8",))
    d = only(report)
    assert d.lowered, report.table()
    assert tail_ops(gm) == ["view", "mul"]
    assert_matches(out, model(x))


@pytest.mark.usefixtures("_s8s8")
@pytest.mark.parametrize("dynamic", [False, True])
def test_dynamic_int8_scales_after_split_view_left_alone(dynamic: bool) -> None:
    model = DynamicHeads("", "after_view")
    x = x_input(dynamic=dynamic)
    out, report, _ = rewrite(model, x, families=("dynamic_int8",))
    d = only(report)
    assert not d.lowered
    assert d.reason.startswith("a view to [") and "changes the last dim (N = 64)" in d.reason, d.reason
    assert_matches(out, model(x))


@pytest.mark.usefixtures("_s8s8")
@pytest.mark.parametrize("dynamic", [False, True])
def test_dynamic_int8_flatten_view_keeps_scales_and_bias_inside(dynamic: bool) -> None:
    model = DynamicHeads("", "after_flatten")
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("dynamic_int8",))
    d = only(report)
    assert d.lowered and "bias" in d.form and "nd" in d.form, (d.form, report.table())
    assert tail_ops(gm) == []
    assert_matches(out, model(x))


@pytest.mark.usefixtures("_s8s8")
def test_dynamic_int8_factor_varying_along_batch_only_is_not_per_token() -> None:
    model = DynamicHeads("", "not_per_row")
    x = x_input()
    out, report, _ = rewrite(model, x, families=("dynamic_int8",))
    d = only(report)
    assert not d.lowered
    assert d.reason == (
        "the int matmul's product is multiplied by a factor that is neither per token nor per channel"
    )
    assert_matches(out, model(x))


class AsymCorrection(nn.Module):
    """Asymmetric per-token int8 written as `_int_mm(xq, w.t()) - zp * w.sum(1)`: a correction qlower does
    not express (it expresses the zero point on the operand, `(xq - zp) @ w.t()`)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        q, s = quantize_per_row_int8(torch.randn(N, K, generator=g) * K**-0.5)
        self.register_buffer("q", q)
        self.register_buffer("s", s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
        sx = ((hi - lo) / 255.0).clamp(min=1e-8)
        zp = (-128 - torch.round(lo / sx)).to(torch.int32)
        xq = torch.clamp(torch.round(x / sx) + zp, -128, 127).to(torch.int8)
        acc = torch._int_mm(xq, self.q.t()) - zp * self.q.sum(1)
        return acc * sx * self.s


@pytest.mark.usefixtures("_s8s8")
def test_dynamic_int8_unexpressed_zero_point_correction_is_named() -> None:
    model = AsymCorrection()
    x = torch.randn(8, K) + 0.5
    out, report, _ = rewrite(model, x, families=("dynamic_int8",))
    d = only(report)
    assert not d.lowered
    assert "aten.sub.Tensor" in d.reason and "integer correction term" in d.reason, d.reason
    assert "no per-token activation scale" not in d.reason
    assert_matches(out, model(x))


# ---- mx ----


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("epilogue", SPLIT_VIEW)
def test_mx_split_view_epilogue_stays_in_graph(epilogue: str, dynamic: bool) -> None:
    model = MXHeads(epilogue)
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("mx",))
    d = only(report)
    assert d.lowered and "bias" not in d.form, (d.form, report.table())
    assert tail_ops(gm) == split_tail(epilogue)
    assert_matches(out, model(x), model.double()(x.double()))


@pytest.mark.parametrize("dynamic", [False, True])
def test_mx_dynamic_activation_split_view_bias_stays_in_graph(dynamic: bool) -> None:
    model = MXHeads("view_bias_hd", a_elem="e4m3")
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("mx",))
    d = only(report)
    assert d.lowered and d.form.startswith("dynamic+") and "bias" not in d.form, (d.form, report.table())
    assert tail_ops(gm) == ["view", "add"]
    assert_matches(out, model(x))


@pytest.mark.parametrize("dynamic", [False, True])
def test_mx_flatten_view_keeps_bias_inside(dynamic: bool) -> None:
    model = MXHeads("flatten")
    x = x_input(dynamic=dynamic)
    out, report, gm = rewrite(model, x, families=("mx",))
    d = only(report)
    assert d.lowered and "bias" in d.form, (d.form, report.table())
    assert tail_ops(gm) == []
    assert_matches(out, model(x), model.double()(x.double()))


def test_mx_bias_that_broadcasts_the_output_up_stays_in_graph() -> None:
    """A [1, 1, N] bias on a 2-D [M, N] output makes it [1, M, N]: not the linear's bias."""
    model = MXHeads("")
    b3 = model.b.reshape(1, 1, N)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, fmt.dequantize(model.q, model.e, "e4m3", x.dtype)) + b3

    x = torch.randn(6, K)
    out, report, gm = rewrite(fn, x, families=("mx",))
    d = only(report)
    assert d.lowered and "bias" not in d.form, (d.form, report.table())
    assert tail_ops(gm) == ["add"]
    assert_matches(out, fn(x))


# ---- what an addmm adds, and weights broadcast into the operand ----


def _addmm_residual(family: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """`addmm(r [M, N], x, w)`: a residual added by the matmul, not a bias (one value per output channel)."""
    g = torch.Generator().manual_seed(6)
    r = torch.randn(6, N, generator=g)
    w8 = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    q, e = fmt.quantize(torch.randn(N, K, generator=g) * K**-0.5, "e4m3")
    s = torch.rand(N, generator=g) * 0.02

    def fn(x: torch.Tensor) -> torch.Tensor:
        if family == "woq_int8":
            return torch.addmm(r, x, w8.to(x.dtype).t())
        if family == "mx":
            return torch.addmm(r, x, fmt.dequantize(q, e, "e4m3", x.dtype).t())
        xq, sx = per_token(x)
        return torch.addmm(r, xq.float() * sx, (w8.float() * s[:, None]).t())

    return fn


@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8", "mx"])
def test_addmm_residual_is_not_a_bias(family: str) -> None:
    fn = _addmm_residual(family)
    x = torch.randn(6, K)
    out, report, _ = rewrite(fn, x, families=(family,))
    d = only(report)
    assert not d.lowered and d.reason == f"addmm adds a [6, {N}] tensor, not a per-channel bias", d.reason
    assert_matches(out, fn(x))


def test_woq_int8_weight_broadcast_into_the_operand_is_named() -> None:
    w1 = torch.randint(-127, 128, (1, K), dtype=torch.int8)
    s = torch.rand(N, 1) * 0.02

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w1.to(x.dtype) * s)

    x = torch.randn(6, K)
    out, report, _ = rewrite(fn, x, families=("woq_int8",))
    d = only(report)
    assert not d.lowered and d.reason == f"int8 weight [1, {K}] is broadcast into the matmul operand", (
        d.reason
    )
    assert_matches(out, fn(x))


# ---- factors reached through expand: the record holds the un-expanded source ----


class Expanded(nn.Module):
    """Scales and biases applied through `expand`, as torchao's dynamic-int8 graph on CUDA does (dumped on an
    H200: `mul(_int_mm, expand(x_scale [M, 1], [M, N]))`). `form` picks the family and which factor."""

    def __init__(self, form: str, k: int = K, n: int = N) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        q, s = quantize_per_row_int8(torch.randn(n, k, generator=g) * k**-0.5)
        mx_q, mx_e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, "e4m3")
        self.register_buffer("q", q)
        self.register_buffer("s", s)
        self.register_buffer("w8", torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g))
        self.register_buffer("ws", torch.rand(n, generator=g) * 0.02 + 0.005)
        self.register_buffer("mx_q", mx_q)
        self.register_buffer("mx_e", mx_e)
        self.register_buffer("b", torch.randn(n, generator=g) * 0.1)
        self.register_buffer("c", torch.full((1, 1), 0.5))
        self.form, self.n, self.k = form, n, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f, m, n, k = self.form, x.shape[0], self.n, self.k
        if f.startswith("woq"):
            if f == "woq_weight_scale":
                return F.linear(x, self.w8.to(x.dtype) * self.ws[:, None].expand(n, k).to(x.dtype))
            y = F.linear(x, self.w8.to(x.dtype)) * self.ws.expand(m, n)
            return y + self.b.to(x.dtype).expand(m, n)
        if f == "mx_bias":
            y = F.linear(x, fmt.dequantize(self.mx_q, self.mx_e, "e4m3", x.dtype))
            return y + self.b.to(x.dtype).expand(m, n)
        xq, sx = per_token(x)
        if f == "int8_operands":  # both operands dequantized through expanded scales, then a float matmul
            xd = xq.float() * sx.expand(m, k)
            wd = self.q.float() * self.s[:, None].expand(n, k)
            return F.linear(xd, wd).to(x.dtype)
        acc = torch._int_mm(xq, self.q.t())
        if f == "int8_row":
            return (acc * sx.expand(m, n) * self.s).to(x.dtype)
        if f == "int8_col":
            return (acc * sx * self.s.expand(m, n)).to(x.dtype)
        if f == "int8_scalar":  # a per-tensor weight scale
            return (acc * sx * self.c.expand(m, n)).to(x.dtype)
        if f == "int8_bias":
            return (acc * sx * self.s + self.b.expand(m, n)).to(x.dtype)
        if f == "int8_torchao_cuda":  # the dump's order: row scale expanded, bf16, column scale, bias
            y = (acc * sx.view(-1, 1).expand(m, n)).to(x.dtype) * self.s
            return (y + self.b.to(x.dtype)).to(x.dtype)
        raise ValueError(f)


EXPANDED = {
    "int8_row": "dynamic_int8",
    "int8_col": "dynamic_int8",
    "int8_scalar": "dynamic_int8",
    "int8_bias": "dynamic_int8",
    "int8_operands": "dynamic_int8",
    "int8_torchao_cuda": "dynamic_int8",
    "woq_col_bias": "woq_int8",
    "woq_weight_scale": "woq_int8",
    "mx_bias": "mx",
}


def _stored_factors(model: nn.Module, x: torch.Tensor) -> list[Any]:
    """The scale / bias / activation-scale nodes the family's recognizer stores for `model(x)`."""
    from qlower.patterns import FAMILIES

    gm = trace_for_inductor(model, x)
    (rec,) = FAMILIES[EXPANDED[model.form]](gm.graph)
    assert not hasattr(rec, "reason"), rec.reason
    factors = [rec.bias] if rec.family == "mx" else [rec.weight_scale, rec.bias]  # (MX: block codes)
    if rec.family == "dynamic_int8":
        factors.append(rec.act_quant.x_scale)
    return [f for f in factors if isinstance(f, fx.Node)]


@pytest.mark.usefixtures("_s8s8")
@pytest.mark.parametrize("m", [1, 2, 17])
@pytest.mark.parametrize("form", sorted(EXPANDED))
def test_expanded_factor_is_stored_unexpanded(form: str, m: int) -> None:
    model = Expanded(form)
    x = torch.randn(m, K) + 0.2
    factors = _stored_factors(model, x)
    assert factors, "the expanded factor was not absorbed"
    for f in factors:
        assert f.target is not aten.expand.default, f.format_node()
        assert f.meta["val"].numel() in (1, m, N), (f.format_node(), f.meta["val"].shape)
    out, report, gm = rewrite(model, x, families=(EXPANDED[form],))
    assert only(report).lowered, report.table()
    assert tail_ops(gm) == []
    assert_matches(out, model(x))


@pytest.mark.usefixtures("_s8s8")
@pytest.mark.parametrize("m", [1, 2, 17])
@pytest.mark.parametrize(
    "form", ["int8_row", "int8_torchao_cuda", "int8_operands", "woq_col_bias", "mx_bias"]
)
def test_expanded_factor_compiles(form: str, m: int) -> None:
    model = Expanded(form)
    x = (torch.randn(m, K) + 0.2).to(torch.bfloat16 if form == "int8_torchao_cuda" else torch.float32)
    with torch.no_grad():
        eager = model(x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    report = qlower.last_report()
    assert only(report).lowered, report.table()
    if x.dtype == torch.bfloat16:  # eager rounds to bf16 between the row and column scales, qlower at the end
        torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2 * eager.float().abs().max().item())
    else:
        assert_matches(out, eager)


@pytest.mark.parametrize("m", [1, 2, 17])
def test_torchao_cpu_form_compiles(m: int) -> None:
    pytest.importorskip("torchao.quantization")
    from tests.forms.dynamic_int8 import torchao_linear

    model = torchao_linear(K, N, bias=True)
    x = torch.randn(m, K, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = model(x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    report = qlower.last_report()
    assert only(report).lowered, report.table()
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2 * eager.float().abs().max().item())


@pytest.mark.parametrize("m", [1, 2, 17])
def test_torchao_cuda_form_lowers_on_fake_cuda(m: int) -> None:
    """The CUDA graph (x_scale expanded to [M, N]) on fake CUDA tensors: the record holds x_scale [M, 1] and
    the CUDA lowering emits (at M = 1 its Triton rule read the expanded scale as M * N elements)."""
    model = Expanded("int8_torchao_cuda", k=256, n=256)
    gm = retarget(trace_for_inductor(model, torch.randn(m, 256, dtype=torch.bfloat16)), "cuda")
    (rec,) = dynamic_int8.find(gm.graph)
    assert list(rec.act_quant.x_scale.meta["val"].shape) == [m, 1]
    report = apply_pass(gm, families=("dynamic_int8",))
    assert only(report).lowered, report.table()
    assert only(report).device.startswith("cuda")


# ---- the same modules on CUDA ----


def _cuda_compiled(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(compiled on CUDA, eager on the host, report): eager `torch._int_mm` on CUDA refuses M <= 16."""
    with torch.no_grad():
        eager = model(x.cpu())
        out = torch.compile(model.cuda(), options=qlower.inductor_options())(x)
    return out.cpu(), eager, qlower.last_report()


def _close(out: torch.Tensor, eager: torch.Tensor, rtol: float) -> None:
    assert out.shape == eager.shape and out.dtype == eager.dtype, (out.shape, eager.shape)
    torch.testing.assert_close(out, eager, rtol=rtol, atol=rtol * eager.float().abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(
    "epilogue", ["view_bias_d", "view_bias_111d", "view_mul_d", "view_mul_row", "flatten"]
)
@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8", "mx"])
def test_cuda_epilogue_forms(family: str, epilogue: str, dynamic: bool) -> None:
    cls = {"woq_int8": WoqHeads, "dynamic_int8": DynamicHeads, "mx": MXHeads}[family]
    x = x_input(m_rows=8, dtype=torch.bfloat16).cuda()  # M = 24
    if dynamic:
        torch._dynamo.mark_dynamic(x, 0)
    out, eager, report = _cuda_compiled(cls(epilogue), x)
    d = only(report)
    assert d.lowered, report.table()
    assert ("bias" in d.form) == (epilogue == "flatten"), d.form
    _close(out, eager, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 17])
@pytest.mark.parametrize("form", sorted(EXPANDED))
def test_cuda_expanded_factors(form: str, m: int) -> None:
    x = (torch.randn(m, 256, device="cuda") + 0.2).to(torch.bfloat16)
    out, eager, report = _cuda_compiled(Expanded(form, k=256, n=256), x)
    assert only(report).lowered, report.table()
    _close(out, eager, 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 17, 300])
def test_cuda_torchao_dynamic_int8(m: int) -> None:
    """torchao's CUDA graph `mul(_int_mm, expand(x_scale [M, 1], [M, N]))`, every M."""
    pytest.importorskip("torchao.quantization")
    from tests.forms.dynamic_int8 import torchao_linear

    model = torchao_linear(512, 256, bias=True).cuda()
    x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        eager = model(x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    report = qlower.last_report()
    assert only(report).lowered, report.table()
    _close(out.cpu(), eager.cpu(), 2e-2)


@pytest.mark.parametrize("k", [128, 129])
@pytest.mark.parametrize("dynamic", [False, True])
def test_woq_scale_after_split_view_compiles(k: int, dynamic: bool) -> None:
    """The per-head scale stays after qlower's unscaled dequant + mm: Inductor's own woq rewrite must not then
    match `mm(x, convert(w).t())` through the split view (it did, and its lowering asserted; fuzz seed
    957636635)."""
    from tests.forms.woq_int8 import WoqHeads

    model = WoqHeads(k, 8, 4, torch.bfloat16, spelling="reshape")
    x = torch.randn(100, k, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(k))
    with torch.no_grad():
        out = torch.compile(model, options=qlower.inductor_options(), dynamic=dynamic)(x)
    assert only(qlower.last_report()).lowered, qlower.last_report().table()
    ref = model.reference(x)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2
