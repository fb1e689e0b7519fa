"""torchao `Int8DynamicActivationInt8WeightConfig` at decode sizes (M = 1, 2, 3, 17), both of torchao's CPU
spellings (s8s8, and the u8s8 one it takes on VNNI CPUs without AMX), and the rule that keeps s8s8 `_int_mm`
away from M = 1 on VNNI CPUs (`lowerings/dynamic_int8_lowerings.py: s8s8_gemv_unsafe`).

On a VNNI CPU without AMX an M = 1 linear lowered to s8s8 `_int_mm` was off by 10^3-10^4x while the u8s8 form
was right; the numeric tests here run on whatever CPU runs the suite, the graph tests force the ISA.
"""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower.testing import apply_pass, trace_for_inductor

torchao_quant = pytest.importorskip("torchao.quantization")
intmm = pytest.importorskip("torchao.kernel.intmm")

K, N = 256, 128
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-5}


def _quantized_linear(dtype: torch.dtype, device: str = "cpu", k: int = K, n: int = N) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, n)).to(device, dtype)
    torchao_quant.quantize_(model, torchao_quant.Int8DynamicActivationInt8WeightConfig())
    return model


@pytest.fixture(params=["s8s8", "u8s8"])
def torchao_branch(request, monkeypatch):
    """torchao's CPU graph form: s8s8 (AMX or no VNNI), or u8s8 (VNNI without AMX), forced either way."""
    monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: request.param == "u8s8")
    monkeypatch.setattr(intmm, "_cpu_is_amx_tile_supported", lambda: False)
    return request.param


def _exact_eager(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchao's eager result with its int8 matmul computed exactly in float64: the reference must not depend
    on this CPU's `_int_mm` (s8s8 at M = 1 is what is wrong on VNNI CPUs without AMX)."""

    def exact_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int32)  # |sum| < 2^53: exact

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch, "_int_mm", exact_int_mm)
        return model(x)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.mark.parametrize("shape", [(1, K), (2, K), (3, K), (17, K), (1, 1, K), (2, 1, K)])
def test_torchao_dynamic_int8_decode_sizes_match_eager(torchao_branch, shape):
    model = _quantized_linear(torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        ref = _exact_eager(model, x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    report = qlower.last_report()
    assert len(report.lowered) == 1, report.table()
    assert _rel(out, ref) < TOL[torch.bfloat16], (_rel(out, ref), report.table())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_torchao_dynamic_int8_m1_every_dtype(torchao_branch, dtype):
    model = _quantized_linear(dtype)
    x = torch.randn(1, K, dtype=dtype)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        ref = _exact_eager(model, x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    assert len(qlower.last_report().lowered) == 1, qlower.last_report().table()
    assert _rel(out, ref) < TOL[dtype]


def test_torchao_dynamic_int8_dynamic_m_every_size(torchao_branch):
    """One compile with a symbolic M serves M = 1 (decode) as well as the prefill sizes."""
    model = _quantized_linear(torch.bfloat16)
    compiled = torch.compile(model, options=qlower.inductor_options(), dynamic=True)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        for m in (5, 1, 2, 17):
            x = torch.randn(m, K, dtype=torch.bfloat16)
            assert _rel(compiled(x), _exact_eager(model, x)) < TOL[torch.bfloat16], m


def _int_mm_operand_dtypes(gm: torch.fx.GraphModule) -> list[torch.dtype]:
    return [
        n.args[0].meta["val"].dtype
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is torch.ops.aten._int_mm.default
    ]


@pytest.mark.parametrize(
    "isa, m, dynamic, want",
    [
        ("vnni", 1, False, "aten._int_mm.u8s8"),  # M = 1 never reaches s8s8 on VNNI CPUs without AMX, any K
        ("vnni", 4, True, "aten._int_mm.u8s8"),  # nor a symbolic M, which can be 1
        ("vnni", 2, False, "aten._int_mm"),  # static M >= 2, K < 4096: s8s8 is right and measured faster
        ("none", 1, False, "aten._int_mm"),  # other CPUs keep s8s8 at M = 1
    ],
)
def test_which_int_mm_takes_m_that_can_be_1(torchao_branch, monkeypatch, isa, m, dynamic, want):
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", isa)
    model = _quantized_linear(torch.bfloat16)
    with torch.no_grad():
        gm = trace_for_inductor(model, torch.randn(m, K, dtype=torch.bfloat16), dynamic=dynamic)
        report = apply_pass(gm)
    assert [d.lowering for d in report] == [want], report.table()
    assert _int_mm_operand_dtypes(gm) == [torch.uint8 if want.endswith("u8s8") else torch.int8]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 4096), (2, 4096), (17, 4096), (1, 1, 4096), (1, 17, 4096)])
def test_torchao_dynamic_int8_cuda_decode_sizes(shape):
    model = _quantized_linear(torch.bfloat16, "cuda", 4096, 4096)
    x = torch.randn(*shape, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        ref = model(x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    report = qlower.last_report()
    assert len(report.lowered) == 1, report.table()
    assert _rel(out, ref) < TOL[torch.bfloat16], (_rel(out, ref), report.table())
