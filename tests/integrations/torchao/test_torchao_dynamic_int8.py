"""torchao `Int8DynamicActivationInt8WeightConfig` at decode sizes (M = 1, 2, 3, 17), both of torchao's CPU
spellings (s8s8, and the u8s8 one it takes on VNNI CPUs without AMX), which `_int_mm` takes an M that can
be 1 (`lowerings/devices/cpu.py: u8s8_at_m1`) where qlower.int8_gemm is off, and which M qlower.int8_gemm takes.

At x [1, 1, K] Inductor handed `_int_mm` a [1, K] view with strides (0, 1), and oneDNN on AVX512 CPUs took the
0 for the leading dimension: outputs off by 10^3-10^4x (reproduced on the H200 host's Xeon, torch 2.11).
The AVX2 CPUs this suite also runs on read such a view right, so the generated code is checked too.
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


@pytest.mark.parametrize("shape", [(1, 1, K), (1, K), (1, 1, 1, K), (3, 1, K)])
def test_int_mm_operands_have_dense_leading_dims(torchao_branch, int_mm_only, shape):
    """Every `_int_mm` call in the generated code gets operands whose leading dimension spans the row
    (`inductor_fixes.dense_unit_strides`), with the numbers right."""
    import re

    from torch._inductor.utils import run_and_get_code

    model = _quantized_linear(torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        ref = _exact_eager(model, x)
        torch._dynamo.reset()
        out, codes = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
    calls = [line for code in codes for line in code.splitlines() if "._int_mm(" in line]
    assert calls, codes
    for call in calls:
        views = re.findall(r"reinterpret_tensor\(\w+, \((\d+), (\d+)\), \((\d+), (\d+)\)", call)
        for rows, cols, s0, s1 in views:
            assert (s1 == "1" and int(s0) >= int(cols)) or (s0 == "1" and int(s1) >= int(rows)), call
    assert _rel(out, ref) < TOL[torch.bfloat16]


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
def test_which_int_mm_takes_m_that_can_be_1(torchao_branch, int_mm_only, monkeypatch, isa, m, dynamic, want):
    from qlower.lowerings.devices.cpu import int_mm_takes_uint8

    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", isa)
    if not int_mm_takes_uint8():  # torch 2.11: no uint8 `_int_mm`, so s8s8 (with dense operands) everywhere
        want = "aten._int_mm"
    model = _quantized_linear(torch.bfloat16)
    with torch.no_grad():
        gm = trace_for_inductor(model, torch.randn(m, K, dtype=torch.bfloat16), dynamic=dynamic)
        report = apply_pass(gm)
    assert [d.lowering for d in report] == [want], report.table()
    assert _int_mm_operand_dtypes(gm) == [torch.uint8 if want.endswith("u8s8") else torch.int8]


@pytest.mark.parametrize(
    "isa, m, dynamic, want",
    [
        ("amx", 1, False, "qlower.int8_gemm"),  # a static decode M takes qlower's kernel
        ("vnni", 1, False, "aten._int_mm.u8s8"),  # ... but M = 1 on VNNI without AMX (INT8_GEMM_VNNI_M)
        ("vnni", 8, False, "qlower.int8_gemm"),
        ("vnni", 16, False, "aten._int_mm"),  # s8s8: this K is below CPU_U8_MIN_K
        ("amx", 4, False, "qlower.int8_gemm"),
        ("none", 1, True, "qlower.int8_gemm"),  # a symbolic M: the op hands larger M to `_int_mm` itself
        ("amx", 5, False, "aten._int_mm"),  # above INT8_GEMM_MAX_M
        ("vnni", 4, True, "aten._int_mm.u8s8"),  # a symbolic M on VNNI without AMX keeps u8s8 above M = 1
    ],
)
def test_int8_gemm_takes_decode_sizes(torchao_branch, monkeypatch, isa, m, dynamic, want):
    from qlower.lowerings.devices.cpu import int_mm_takes_uint8

    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", isa)
    if isa == "vnni" and not int_mm_takes_uint8():  # torch 2.11: no u8s8 `_int_mm`; VNNI chooses as AMX does
        want = "qlower.int8_gemm" if dynamic or m <= 4 else "aten._int_mm"
    model = _quantized_linear(torch.bfloat16)
    with torch.no_grad():
        gm = trace_for_inductor(model, torch.randn(m, K, dtype=torch.bfloat16), dynamic=dynamic)
        report = apply_pass(gm)
    assert [d.lowering for d in report] == [want], report.table()
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.qlower.int8_gemm.default]
    assert len(calls) == (want == "qlower.int8_gemm")


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
