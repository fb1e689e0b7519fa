"""MX compiled on CPU through qlower: torchao's EMULATED model (which stock Inductor cannot compile on CPU:
`KeyError: torch.float8_e8m0fnu`) now compiles and matches eager; hand-written forms against float64."""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower.patterns import mx_format as fmt
from tests.forms import mx as mm

N, K = 48, 64


def _compile(fn, **opts):
    torch._dynamo.reset()
    qlower.clear_reports()
    return torch.compile(fn, options=qlower.inductor_options(families=("mx",), **opts))


def _lowerings() -> list[str | None]:
    return [d.lowering for r in qlower.all_reports() for d in r]


@pytest.fixture(autouse=True)
def _no_compile_caches():
    """A cached compile skips qlower's pass (and its report): every test compiles afresh."""
    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("elem,mode,bias", [("e4m3", "FLOOR", True), ("e2m1", "RCEIL", False)])
def test_torchao_emulated_compiles_and_matches_eager(elem, mode, bias):
    pytest.importorskip("torchao.prototype.mx_formats")
    m = mm.torchao_mx_model(elem, bias=bias, mode=mode)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        eager = m(x)
        out = _compile(m)(x)
    assert _lowerings() == ["mx_dequant_mm"]
    # Same exact dequantized operands, same bf16 mm: equal up to the mm's summation order.
    torch.testing.assert_close(out, eager, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", list(mm.hand_written_forms(N, K)))
def test_hand_written_forms_vs_float64(name):
    f = mm.hand_written_forms(N, K)[name]
    x, q, e = mm.form_inputs(name, N, K, m=7)
    out = _compile(f)(x, q, e)
    assert _lowerings() == ["mx_dequant_mm"]
    assert _rel(out, mm.reference(name, x, q, e)) <= 1e-2  # MXFP8 and MXFP4: only bf16 rounding left


def test_mxfp4_sqnr_no_worse_than_torchao_eager():
    """Against the unquantized float64 linear, the compiled MXFP4 model loses no more than eager emulation."""
    pytest.importorskip("torchao.prototype.mx_formats")
    m = mm.torchao_mx_model("e2m1", bias=False, k=256, n=128)
    torch.manual_seed(0)  # torchao_mx_model seeds 0 before building its Linear: the same float weight
    w = torch.nn.Linear(256, 128, bias=False).to(torch.bfloat16).weight.detach()
    x = torch.randn(16, 256, dtype=torch.bfloat16)
    ref = x.double() @ w.double().t()
    with torch.no_grad():
        eager = m(x)
        out = _compile(m)(x)
    assert _lowerings() == ["mx_dequant_mm"]
    assert fmt.sqnr_db(ref, eager) > 10  # a real MXFP4 model, not a broken one
    assert fmt.sqnr_db(ref, out) >= fmt.sqnr_db(ref, eager) - 0.1


def test_fp4x2_dtype_and_e8m0_storage_compile_on_cpu():
    """fp4x2 elements and e8m0 scales have no C++ type: their bytes reach the kernel as uint8 copies."""
    q, e = fmt.quantize(torch.randn(N, K) * 0.1, "e2m1")
    q2, e8 = q.view(torch.float4_e2m1fn_x2), e.view(torch.float8_e8m0fnu)

    def f(x, q, e):
        return torch.nn.functional.linear(x, fmt.dequantize(q, e, "e2m1", x.dtype))

    x = torch.randn(3, K, dtype=torch.bfloat16)
    out = _compile(f)(x, q2, e8)
    assert _lowerings() == ["mx_dequant_mm"]
    ref = x.double() @ fmt.dequantize_f64(q, e, "e2m1").t()
    assert _rel(out, ref) <= 1e-2


def test_dynamic_m():
    """M symbolic (automatic dynamic shapes: the second M recompiles with M dynamic); weights stay static."""
    f = mm.hand_written_forms(N, K)["pow2_fp32_matmul"]
    _, q, e = mm.form_inputs("pow2_fp32_matmul", N, K)
    cf = _compile(f)
    for m in (2, 9, 17):
        x = torch.randn(m, K, dtype=torch.bfloat16)
        assert _rel(cf(x, q, e), mm.reference("pow2_fp32_matmul", x, q, e)) <= 1e-2
    ms = [d.shape[0] for r in qlower.all_reports() for d in r]
    assert _lowerings() == ["mx_dequant_mm", "mx_dequant_mm"] and not str(ms[1]).isdigit()


def test_k_not_multiple_of_32_is_lowered_exactly():
    """A partial last block: the scale of block K // 32 applies to the tail. Lowered by the emulation; stock
    Inductor's CPU code for this graph is wrong (tests/patterns/test_mx_special_codes.py, the upstream
    bug)."""
    k = 48

    def f(x, q, e):
        s = torch.exp2(e.float() - 127).repeat_interleave(32, dim=1)[:, :k]
        return torch.nn.functional.linear(x, (q.float() * s).to(x.dtype))

    q = (torch.randn(N, k) * 0.1).to(torch.float8_e4m3fn)
    e = torch.randint(120, 131, (N, 2), dtype=torch.uint8)
    x = torch.randn(3, k, dtype=torch.bfloat16)
    out = _compile(f)(x, q, e)
    (d,) = [d for r in qlower.all_reports() for d in r]
    assert d.lowering == "mx_dequant_mm" and "partial_block" in d.form
    assert _rel(out, x.double() @ fmt.dequantize_f64(q, e, "e4m3").t()) <= 1e-2
