"""Training graphs: a frozen quantized linear beside a trainable LoRA adapter, with x.requires_grad.

The joint forward + backward graph reads the dynamic-int8 matmul's product twice: the forward rescales it, the
backward multiplies it into the gradient of the per-token activation scale. The recognizer walks through that
shared value to the scale (it used to stop there and report "no per-token activation scale"), and the rewrite
leaves the original matmul for the backward, so every gradient is bit for bit what the unrewritten graph
gives. woq_int8's record is complete at the matmul: there a shared product ends the walk and its readers read
the lowered value (no second GEMM). Traced joint graphs (`qlower.testing.trace_joint_for_inductor`), run in
eager aten: no codegen.
"""

from __future__ import annotations

import expecttest
import pytest
import torch
from torch import nn

from qlower.patterns.unclaimed import quantized_source
from qlower.patterns.woq_int8 import DYNAMIC_ACTIVATION
from qlower.testing import apply_pass, graph_summary, joint_tangents, trace_joint_for_inductor
from tests.forms.dynamic_int8 import (
    AsymInt32,
    FloatCarrier,
    Int32MM,
    IntMMDivide,
    IntMMReciprocal,
    OutDtypeMM,
)
from tests.forms.woq_int8 import WoqLinear


@pytest.fixture(autouse=True)
def _s8s8_cpu(monkeypatch):
    """Graphs independent of the CI CPU's ISA: s8s8 `_int_mm`."""
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "none")


class LoRA(nn.Module):
    """y = base(x) + (x @ A.T) @ B.T: a frozen quantized base (buffers) and a trainable rank-r adapter."""

    def __init__(self, base: nn.Module, k: int, n: int, dtype: torch.dtype, rank: int = 4) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.base = base
        self.a = nn.Parameter((torch.randn(rank, k, generator=g) * k**-0.5).to(dtype))
        self.b = nn.Parameter((torch.randn(n, rank, generator=g) * 0.1).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


def _run(gm: torch.fx.GraphModule, primals: list, tangents: list) -> list[torch.Tensor]:
    """The joint graph's outputs, then the gradient of each primal that has one."""
    outs, grads = gm(primals, tangents)
    return [*outs, *(g for g in grads if g is not None)]


def _rewrite(model: nn.Module, x: torch.Tensor, dynamic: bool = False, **pass_kw):
    """(report, graph after the pass, the joint graph's outputs + gradients before and after the rewrite,
    eager autograd's output + gradients in the same order)."""
    gm, primals = trace_joint_for_inductor(model, x.clone().requires_grad_(True), dynamic=dynamic)
    tangents = joint_tangents(gm)
    before = _run(gm, primals, tangents)
    report = apply_pass(gm, **pass_kw)
    after = _run(gm, primals, tangents)
    return report, gm, before, after, _eager(model, x, primals, tangents[0])


def _eager(model: nn.Module, x: torch.Tensor, primals: list, cot: torch.Tensor) -> list[torch.Tensor]:
    """Output, then the gradient of each primal that requires grad (x, the trainable parameters) in the
    joint graph's order: eager autograd, no compile."""
    xi = x.clone().requires_grad_(True)
    params = {p.data_ptr(): p for p in model.parameters() if p.requires_grad}
    for p in params.values():
        p.grad = None
    y = model(xi)
    y.backward(cot.reshape(y.shape))
    trained = [t for t in primals if isinstance(t, torch.Tensor) and t.requires_grad]  # not symbolic sizes
    grads = [params[t.data_ptr()].grad if t.data_ptr() in params else xi.grad for t in trained]
    return [y.detach(), *grads]


def _kept(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.meta.get("qlower") == "kept"]


class TestDynamicInt8Lora(expecttest.TestCase):
    def test_backward_reads_the_product_before_the_scale(self):
        """`_int_mm * x_scale * w_scale`: the backward's gradient of x_scale reads `_int_mm` itself."""
        torch.manual_seed(0)
        model, x = LoRA(IntMMDivide(64, 32, bias=True), 64, 32, torch.float32), torch.randn(2, 3, 64)
        report, gm, before, after, eager = _rewrite(model, x)
        self.assertEqual(
            [(d.family, d.lowering, d.form, d.reason) for d in report],
            [("dynamic_int8", "aten._int_mm", "int_mm+bias+nd+kept_for_readers", None)],
        )
        # the lowered _int_mm feeds the forward's rescale; the original one is kept for the backward alone
        text = "\n".join(line for line in graph_summary(gm).splitlines() if "_int_mm" in line)
        self.assertExpectedInline(
            text,
            """\
_int_mm: int32[6, 32] = aten._int_mm(convert_element_type, permute)
_int_mm_default: int32[6, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[6, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_3: float32[6, 32] = aten.mul.Tensor(mul_2, _int_mm)""",
        )
        self.assertEqual([n.name for n in _kept(gm)], ["_int_mm"])
        _exact(after, before)  # output and every gradient
        _close(after, eager, 1e-5)


def test_backward_reads_the_product_and_the_rescaled_product():
    """Trainable w_scale too: the backward reads `acc` (grad of x_scale) and `acc * x_scale` (grad of
    w_scale). The walk goes through the first to the per-token scale and stops at the second: the record
    ends there, and the grad of w_scale reads the lowered value (the same fp32 product)."""
    base = IntMMDivide(64, 32, bias=False)
    base.s = nn.Parameter(base.s.clone())
    model, x = LoRA(base, 64, 32, torch.float32), torch.randn(5, 64)
    report, gm, before, after, eager = _rewrite(model, x)
    assert [(d.family, d.lowering, d.form) for d in report] == [
        ("dynamic_int8", "aten._int_mm", "int_mm+kept_for_readers")
    ], report
    assert [n.name for n in _kept(gm)] == ["_int_mm"]
    _exact(after, before)
    _close(after, eager, 1e-5)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_float_carrier_is_one_dynamic_int8_row(dynamic):
    """int8 values carried in fp32 through `mm`, bf16 activations, weight stored [K, N], trainable w_scale,
    a symbolic M: one dynamic_int8 row, lowered. woq_int8, which sees a float activation times an int8
    weight in that matmul, leaves it to dynamic_int8 (it used to lower it: two families for one linear)."""
    base = FloatCarrier(100, 48, bias=False, kn=True)
    base.s = nn.Parameter(base.s.clone())
    model, x = LoRA(base, 100, 48, torch.bfloat16), torch.randn(17, 100, dtype=torch.bfloat16)
    report, gm, before, after, eager = _rewrite(model, x, dynamic=dynamic)
    assert [(d.family, d.lowering, d.form) for d in report] == [
        ("dynamic_int8", "aten._int_mm", "float_mm+kept_for_readers+kn_weight")
    ], report
    assert [n.name for n in _kept(gm)] == ["mm"]
    _exact(after, before)  # the output too: exact int products (K = 100), fp32 scales, one bf16 rounding
    _close(after, eager, 2e-2)


def test_woq_alone_leaves_it_to_dynamic_int8():
    model = LoRA(FloatCarrier(64, 32, bias=False), 64, 32, torch.float32)
    report, gm, before, after, _ = _rewrite(model, torch.randn(4, 64), families=("woq_int8",))
    assert [(d.family, d.lowering, d.reason) for d in report] == [("woq_int8", None, DYNAMIC_ACTIVATION)]
    _exact(after, before)


@pytest.mark.parametrize("form", [IntMMReciprocal, OutDtypeMM, Int32MM, AsymInt32], ids=lambda f: f.__name__)
def test_forms(form):
    """Every int32 spelling, the scales in either order, asymmetric zero points: lowered, the gradients
    bit for bit; the output within fp32 rounding (IntMMReciprocal multiplies the weight scale first, the
    lowering the activation's)."""
    model, x = LoRA(form(64, 32, bias=True), 64, 32, torch.float32), torch.randn(2, 5, 64)
    report, gm, before, after, eager = _rewrite(model, x)
    (d,) = report
    assert (d.family, d.lowering, d.reason) == ("dynamic_int8", "aten._int_mm", None), d
    assert "kept_for_readers" in d.form, d.form
    _close(after[:1], before[:1], 1e-6)
    _exact(after[1:], before[1:])
    _close(after, eager, 1e-5)


def test_woq_shared_product_ends_the_walk():
    """woq_int8 with a trainable scale: the backward reads `mm` (the scale's gradient). The record ends at
    `mm`, whose readers, the forward's scale and the backward, all read the lowered product: no node kept,
    no GEMM left on the dequantized weight."""
    base = WoqLinear(64, 32, torch.bfloat16, form="gpt_fast", bias=True)
    base.s.requires_grad_(True)
    model, x = LoRA(base, 64, 32, torch.bfloat16), torch.randn(6, 64, dtype=torch.bfloat16)
    report, gm, before, after, eager = _rewrite(model, x, families=("woq_int8",))
    forward = [d for d in report if d.shape == (6, 64, 32)]
    assert [(d.lowering is not None, d.form) for d in forward] == [(True, "mm+no_scale")], report
    assert _kept(gm) == []
    products = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    left = [n for n in gm.graph.nodes if n.target in products and any(map(quantized_source, n.args))]
    assert left == [], left
    _close(after, eager, 2e-2)


def _exact(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), (i, (g - w).abs().max())


def _close(got: list[torch.Tensor], want: list[torch.Tensor], tol: float) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
