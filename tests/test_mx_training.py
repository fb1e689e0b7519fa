"""MX graphs whose unlowered parts still read e8m0 values must compile and give eager's numbers.

A training compile's backward multiplies the gradient by the dequantized weight (blocks along N), which no
recognizer lowers; Inductor's C++ backend has no e8m0 type, so without `legalize_e8m0` that graph fails to
compile (stock `torch.compile` too). The decode it substitutes is checked on all 256 codes.
"""

from __future__ import annotations

import mx_models as mm
import pytest
import torch

import qlower
from qlower.lowerings.emit.mx import legalize_e8m0, mx_bytes
from qlower.patterns.graph_utils import tensor_val
from qlower.testing import trace_for_inductor


@pytest.fixture(autouse=True)
def _no_compile_caches():
    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _e8m0_readers(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Nodes other than qlower::mx_bytes that take an e8m0 value."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not mx_bytes:
            for a in node.all_input_nodes:
                v = tensor_val(a)
                if v is not None and v.dtype == torch.float8_e8m0fnu:
                    out.append(node)
    return out


def test_legalized_decode_matches_torch_on_every_code():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu)

    def f(e):
        return e.float(), e.to(torch.bfloat16), e.view(torch.uint8), e.view(torch.int8)

    gm = trace_for_inductor(f, codes)
    assert _e8m0_readers(gm)
    assert legalize_e8m0(gm.graph) == 4
    gm.recompile()
    assert _e8m0_readers(gm) == []
    for got, want in zip(gm(codes), f(codes), strict=True):
        assert got.dtype == want.dtype
        if want.dtype.is_floating_point:
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())  # 2**-127 at code 0 included
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("a_elem", [None, "e4m3"])
@pytest.mark.parametrize("w_elem", ["e4m3", "e2m1"])
def test_training_with_e8m0_scales_compiles_and_matches_eager(a_elem, w_elem):
    torch.manual_seed(0)
    model = mm.MXLinear(a_elem, w_elem, 96, 64, e8m0=True, bias=True)
    model.b = torch.nn.Parameter(model.b.clone())
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    cot = torch.randn(2, 5, 96, dtype=torch.bfloat16)

    def grads(fn):
        xi = x.clone().requires_grad_(True)
        model.b.grad = None
        y = fn(xi)
        (y * cot).sum().backward()
        return y.detach(), xi.grad, model.b.grad.clone()

    eager = grads(model)
    torch._dynamo.reset()
    qlower.clear_reports()
    compiled = grads(torch.compile(model, options=qlower.inductor_options(families=("mx",))))
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    rows = [d for r in qlower.all_reports() for d in r]
    assert [d.lowering for d in rows if str(d.shape[2]) == "96"] == ["mx_dequant_mm"], rows  # the forward
    backward = [d for d in rows if str(d.shape[2]) == "64"]  # grad_x = grad_y @ dequant(w): blocks along N
    assert len(backward) == 1 and backward[0].lowering is None, rows
