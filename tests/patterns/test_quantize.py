"""qlower.quantize's eager modules: exact in eager on every shape, and still the recognized form when traced."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

import qlower
from qlower import quantize


def _dynamic_int8_mlp() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 32)).to(torch.bfloat16)
    assert quantize.QUANTIZERS["dynamic_int8"](model) == 2
    return model.eval()


def test_int8_matmul_fallback_is_exact(monkeypatch):
    """Where cuBLAS refuses `_int_mm` (M <= 16 on CUDA) the eager module takes a float64 matmul: same int32."""
    a = torch.randint(-127, 128, (5, 4096), dtype=torch.int8)
    b = torch.randint(-127, 128, (4096, 24), dtype=torch.int8)
    a[0], b[:, 0] = 127, 127  # the largest |sum|: 4096 * 127**2
    want = torch._int_mm(a, b)
    monkeypatch.setattr(quantize, "_int_mm_takes", lambda *_: False)
    got = quantize._int8_matmul(a, b)
    assert got.dtype == torch.int32 and torch.equal(got, want)


def test_int_mm_shape_rule():
    """cuBLAS's int8 GEMM: M > 16, K and N multiples of 8 (checked on shape stand-ins, no GPU needed)."""
    a, b = torch.zeros(1, 64, dtype=torch.int8), torch.zeros(64, 32, dtype=torch.int8)
    assert quantize._int_mm_takes(a, b)  # off CUDA every shape runs

    def on_cuda(*shape: int) -> SimpleNamespace:
        return SimpleNamespace(device=torch.device("cuda"), shape=torch.Size(shape))

    assert quantize._int_mm_takes(on_cuda(17, 64), on_cuda(64, 32))
    for a_shape, b_shape in (
        ((16, 64), (64, 32)),
        ((1, 64), (64, 32)),
        ((32, 60), (60, 32)),
        ((32, 64), (64, 30)),
    ):
        assert not quantize._int_mm_takes(on_cuda(*a_shape), on_cuda(*b_shape)), (a_shape, b_shape)


def test_traced_module_keeps_int_mm_and_is_lowered():
    """The eager-only fallback never reaches a trace: compiled, every linear is lowered and matches eager."""
    model = _dynamic_int8_mlp()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    ep = torch.export.export(model, (x,))
    assert "torch.ops.aten._int_mm.default" in str(ep.graph)
    compiled = torch.compile(model, options=qlower.inductor_options())
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert len(qlower.last_report().lowered) == 2, qlower.last_report().table()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
