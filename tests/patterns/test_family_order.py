"""A decision never depends on the order of `families=`, and woq_int8 never claims a dynamic-int8 linear.

A dynamic-int8 linear written as dequantize-then-matmul (`(x_q * s_x) @ (w_q * s_w).T`) also has a
dequantized int8 weight, so woq_int8 alone would describe it as a float GEMM on a float activation. The pass
runs the families in `qlower.FAMILIES`' order whatever order the options name them in, and woq_int8 leaves a
matmul that dynamic_int8 records exactly (`patterns.dynamic_int8.describes`) to that family: with
dynamic_int8 disabled the row says so instead of lowering it as weight-only.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import qlower
from qlower.patterns.woq_int8 import DYNAMIC_ACTIVATION
from qlower.testing import apply_pass, trace_for_inductor

K, N = 64, 48
torch.manual_seed(0)
WQ = torch.randint(-127, 128, (N, K), dtype=torch.int8)
WS = torch.rand(N) / 100 + 1e-3


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-5) / 127
    return (x / s).round().clamp(-128, 127).to(torch.int8), s


def scale_on_weight(x: torch.Tensor) -> torch.Tensor:
    xq, s = _quantize(x)
    wd = WQ.to(x.dtype) * WS.to(x.dtype)[:, None]
    return (xq.to(x.dtype) * s) @ wd.t()


def scale_after_linear(x: torch.Tensor) -> torch.Tensor:
    xq, s = _quantize(x)
    return torch.nn.functional.linear(xq.to(x.dtype) * s, WQ.to(x.dtype)) * WS.to(x.dtype)


def reference(x: torch.Tensor) -> torch.Tensor:
    """float64 of the same formula, from the same int8 activation and scale the graph computes."""
    xq, s = _quantize(x)
    return (xq.double() * s.double()) @ (WQ.double() * WS.double()[:, None]).t()


FORMS = [scale_on_weight, scale_after_linear]
SHAPES = [(8, K), (K,), (2, 3, K)]  # 2-D, a 1-D activation (vector-matrix product), N-D
ALL_ORDERS = list(itertools.permutations(qlower.FAMILIES))


def _rows(fn, shape, families) -> list[tuple]:
    gm = trace_for_inductor(fn, torch.randn(*shape, dtype=torch.bfloat16))
    qlower.clear_reports()
    report = apply_pass(gm, families=families)
    return [(d.family, d.lowering, d.form, d.reason) for d in report]


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "1d", "3d"])
@pytest.mark.parametrize("fn", FORMS, ids=lambda f: f.__name__)
def test_family_order_never_changes_the_decision(fn, shape):
    default = _rows(fn, shape, None)
    assert len(default) == 1 and default[0][0] == "dynamic_int8" and default[0][1] is not None, default
    for order in ALL_ORDERS:
        assert _rows(fn, shape, list(order)) == default, order
    for pair in itertools.permutations(("woq_int8", "dynamic_int8")):
        assert _rows(fn, shape, list(pair)) == default, pair


@pytest.mark.parametrize("shape", SHAPES, ids=["2d", "1d", "3d"])
@pytest.mark.parametrize("fn", FORMS, ids=lambda f: f.__name__)
def test_woq_alone_leaves_a_dynamic_int8_linear_with_the_reason(fn, shape):
    rows = _rows(fn, shape, ["woq_int8"])
    assert rows == [("woq_int8", None, "", DYNAMIC_ACTIVATION)], rows


def test_family_order_options_are_equal():
    """Equal sets give equal options (one Dynamo graph for blocks compiled with either order)."""
    passes = {qlower.inductor_options(families=list(o))["joint_custom_pre_pass"] for o in ALL_ORDERS}
    assert len(passes) == 1 and next(iter(passes)).families == tuple(qlower.FAMILIES)


@pytest.mark.parametrize("shape", [(K,), (5, K)], ids=["1d", "2d"])
def test_dynamic_int8_vector_activation_compiles_to_the_int8_matmul(shape):
    x = torch.randn(*shape, dtype=torch.bfloat16)
    torch._dynamo.reset()
    qlower.clear_reports()
    opts = qlower.inductor_options(families=["woq_int8", "dynamic_int8"])
    got = torch.compile(scale_after_linear, options=opts)(x)
    rows = list(qlower.last_report())
    assert [(d.family, d.lowered) for d in rows] == [("dynamic_int8", True)], rows
    assert "_int_mm" in rows[0].lowering or rows[0].lowering == "qlower.int8_gemm", rows[0]
    ref = reference(x)
    assert got.shape == ref.shape and got.dtype == torch.bfloat16
    rel = ((got.double() - ref).norm() / ref.norm()).item()
    assert rel <= 1e-2, rel  # int8 products are exact; bf16 rounding of the scales and the output remain
