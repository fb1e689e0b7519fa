"""Numerics of the dynamic-int8 lowerings: vs the eager quantized model and a float64 reference.

Most checks execute the rewritten aten graph eagerly (`rewrite_and_run`: Dynamo + AOTAutograd + qlower's pass,
no codegen), so every form and lowering is covered in seconds; a few full Inductor compiles check the generated
code (fused prologue/epilogue, the freezing decision, PT2E ops inlined) and dynamic M.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch.testing import FileCheck

import qlower
from qlower.lowerings import register_backend, register_builtin_backends
from qlower.lowerings.devices.cpu import cpu_int8_isa
from qlower.lowerings.devices.cuda import DYNAMIC_INT8_INT_MM_CUDA
from tests.forms.dynamic_int8 import (
    PT2E,
    AsymInt32,
    DequantBoth,
    DequantEinsum,
    FloatCarrier,
    Int32MM,
    IntMMDivide,
    IntMMReciprocal,
    OutDtypeMM,
    rewrite_and_run,
    torchao_linear,
)

FAMILY = ("dynamic_int8",)
K, N = 96, 48
# what AUTO picks on this CPU for M >= 2, K >= 4096 without freezing (u8s8 on VNNI without AMX)
CPU_LOWERING_LARGE_K = "aten._int_mm.u8s8" if cpu_int8_isa() == "vnni" else "aten._int_mm"

FORMS = [
    (IntMMDivide, {}),
    (IntMMReciprocal, {"bias": False}),
    (OutDtypeMM, {"kn": True}),
    (Int32MM, {}),
    (Int32MM, {"kn": True}),
    (FloatCarrier, {}),
    (DequantBoth, {}),
    (DequantEinsum, {}),
    (AsymInt32, {}),
    (PT2E, {}),
    (PT2E, {"asymmetric": True}),
]


@pytest.fixture(autouse=True)
def _fresh_compiles():
    """A cache hit would skip Inductor's passes (qlower's too), leaving no report and stale code to check."""
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield


def _x(m: int, k: int = K, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, m, k, generator=g) * 2.0 + 0.3  # an offset: asymmetric zero points are not 0


def check_close(test_out: torch.Tensor, eager: torch.Tensor, ref64: torch.Tensor) -> None:
    """Within the eager path's own quantization error of the float64 reference, and close to eager."""
    err = (test_out.double() - ref64).abs().max().item()
    eager_err = (eager.double() - ref64).abs().max().item()
    scale = ref64.abs().max().item()
    assert err <= 1.02 * eager_err + 1e-6 * scale, (err, eager_err)
    assert (test_out.double() - eager.double()).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize(
    "isa, k, lowering", [("none", K, "aten._int_mm"), ("vnni", 4096, "aten._int_mm.u8s8")]
)
@pytest.mark.parametrize("form, kw", FORMS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_forms_lowered_match_eager_and_float64(form, kw, isa, k, lowering, monkeypatch):
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", isa)
    model = form(k, N, **kw)
    x = _x(5, k)
    out, report = rewrite_and_run(model, x, families=FAMILY)
    assert [d.lowering for d in report] == [lowering], report
    with torch.no_grad():
        check_close(out, model(x), model.reference(x))


@pytest.mark.parametrize("form, kw", [(IntMMDivide, {}), (AsymInt32, {}), (PT2E, {"asymmetric": True})])
@pytest.mark.parametrize("k", [K, 4100])  # 4100: u8s8 on VNNI; the emulated path sums 5 chunks in int32
def test_emulated_is_bit_exact_to_int_mm(form, kw, k, monkeypatch):
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "vnni")  # u8s8 vs the fp32 chunks: both exact integers
    model, x = form(k, N, **kw), _x(3, k)
    aten_out, _ = rewrite_and_run(model, x, families=FAMILY)
    emu_out, report = rewrite_and_run(
        model, x, families=FAMILY, kernel_preference=qlower.KernelPreference.EMULATED
    )
    assert [d.lowering for d in report] == ["int8_mm_emulated"]
    assert torch.equal(aten_out, emu_out)


@pytest.fixture
def cuda_rules_on_cpu():
    """Rank the CUDA `_int_mm` lowering (M padding, dynamic-M custom op) for CPU records, to run it here."""
    register_backend("cpu", [DYNAMIC_INT8_INT_MM_CUDA])
    yield
    register_builtin_backends()


@pytest.mark.parametrize("m", [0, 1, 16, 17, 40])
def test_cuda_padding_numerics(cuda_rules_on_cpu, m):
    model = IntMMDivide(K, N)
    x = _x(m)
    out, report = rewrite_and_run(model, x, families=FAMILY)
    assert report.entries[0].lowering == "aten._int_mm"
    assert out.shape == (2, m, N)
    if m:
        with torch.no_grad():
            check_close(out, model(x), model.reference(x))


def test_cuda_dynamic_m_custom_op_numerics(cuda_rules_on_cpu):
    """One graph for every M: the custom op pads only when M < 17 at run time."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    from qlower.testing import apply_pass

    texts = []

    def compiler(gm, example_inputs):
        apply_pass(gm, families=FAMILY)
        texts.append(gm.code)
        return gm.forward

    model = IntMMDivide(K, N)
    backend = aot_autograd(
        fw_compiler=compiler, inference_compiler=compiler, decompositions=select_decomp_table()
    )
    fn = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for m in (3, 9, 33):
            x = _x(m)
            check_close(fn(x), model(x), model.reference(x))
    assert len(texts) == 1 and "int8_mm_min_m" in texts[0]


def test_add_after_an_addmm_bias_stays():
    """`F.linear(x_deq, w_deq, b1) + b2`: the addmm's b1 is the record's bias and the add of b2 after it stays
    in the graph, applied to the lowered value (it was once consumed as a second bias and dropped)."""
    torch.manual_seed(0)
    wq, ws = torch.randint(-127, 128, (N, K), dtype=torch.int8), torch.rand(N) * 0.01
    b1, b2 = torch.randn(N), torch.randn(N) * 10

    def f(xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
        x, w = xq.to(torch.float32) * xs, wq.to(torch.float32) * ws[:, None]
        return torch.nn.functional.linear(x, w, b1) + b2

    xq, xs = torch.randint(-127, 128, (4, K), dtype=torch.int8), torch.rand(4, 1) * 0.01
    out, report = rewrite_and_run(f, xq, xs, families=FAMILY)
    assert [d.form for d in report] == ["dequant_mm+bias"] and report.entries[0].lowered, report.table()
    torch.testing.assert_close(out, f(xq, xs), rtol=1e-4, atol=1e-3)


def test_cpu_m_zero():
    model = IntMMDivide(K, N)
    out, report = rewrite_and_run(model, _x(0), families=FAMILY)
    assert report.entries[0].lowering == "qlower.int8_gemm" and out.shape == (2, 0, N)


# ---- full Inductor compiles: generated code and end-to-end numerics ----


def _kernel_calls(code: str) -> list[str]:
    """The calls the generated `call()` makes: fused C++ kernels, extern kernels, torch.ops fallbacks."""
    body = code[code.index("def call(") :]
    return re.findall(
        r"^\s+(?:buf\w+ = )?(cpp_fused\w+|extern_kernels\.\w+|torch\.ops\.[\w.]+)\(", body, re.M
    )


def test_torchao_compiled_prologue_and_epilogue_fused():
    model = torchao_linear(4096, N, bias=True)  # K = 4096: the u8s8 path on VNNI CPUs
    x = _x(5, 4096).to(torch.bfloat16)
    with torch.no_grad():
        eager = model(x)
        out, (code,) = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
    assert [d.lowering for d in qlower.last_report()] == [CPU_LOWERING_LARGE_K]
    calls = _kernel_calls(code)
    # one fused kernel quantizes x (amax reduction + round/clamp/int8, + 128 as uint8 for u8s8), `_int_mm`, one
    # fused rescale kernel (u8s8: the weight's column sums are computed inside it)
    assert len(calls) == 3 and calls[1] == "extern_kernels._int_mm", calls
    assert calls[0].startswith("cpp_fused") and "amax" in calls[0]
    assert re.search(rf"{calls[0]} = async_compile.cpp_pybinding\(\[[^\]]*'u?int8_t\*'\]", code)  # writes x_q
    assert calls[2].startswith("cpp_fused")
    assert re.search(rf"{calls[2]} = async_compile.cpp_pybinding\(\[[^\]]*'const int32_t\*'", code)  # acc
    FileCheck().check("cpp_fused").check("extern_kernels._int_mm").check("cpp_fused").run(
        code.split("def call(")[1]
    )
    w = model[0].weight
    w64 = w.qdata.double() * w.scale.double().reshape(-1, 1)
    ref = x.double() @ w64.t() + model[0].bias.double()
    err, eager_err = (out.double() - ref).abs().max(), (eager.double() - ref).abs().max()
    assert err <= 1.05 * eager_err, (err, eager_err)


def _qlinear_input_dtype(code: str) -> str:
    """The C++ type of the buffer the generated code passes to onednn.qlinear_pointwise as x."""
    x = re.search(r"onednn\.qlinear_pointwise\.\w+\((\w+),", code).group(1)
    return re.search(rf"{x} = empty_strided_cpu\(.*?, torch\.(\w+)\)", code).group(1)


def test_freezing_picks_u8_qlinear_never_s8():
    """With frozen weights, Inductor rewrites `convert(_int_mm(x, w_const)) * s * s` to an s8 oneDNN qlinear
    (37.5 s for one M=128, 4096^2 call on the CI CPU); qlower emits the u8 qlinear on a weight prepacked at
    compile time (10.5 ms there; bf16 21.4 ms) on VNNI and AMX CPUs, `_int_mm` elsewhere."""
    model = IntMMReciprocal(K, N, bias=True)  # the explicit .to(float32) upstream's pattern needs
    x = _x(5)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        eager = model(x)
        torch._dynamo.reset()
        _, (stock_code,) = run_and_get_code(torch.compile(model), x)
        torch._dynamo.reset()
        out, (code,) = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
    assert _qlinear_input_dtype(stock_code) == "int8"  # what freezing does without qlower
    (d,) = qlower.last_report()
    if cpu_int8_isa() in ("vnni", "amx"):
        assert d.lowering == "onednn.qlinear_pointwise.u8"
        assert _qlinear_input_dtype(code) == "uint8" and "ops.onednn.qlinear_prepack" not in code  # folded
    else:
        assert d.lowering == "aten._int_mm" and "qlinear" not in code
    assert "_frozen_param" in code
    check_close(out, eager, model.reference(x))


@pytest.mark.parametrize(
    "isa, want",
    [
        ("amx", "onednn.qlinear_pointwise.u8"),
        ("vnni", "onednn.qlinear_pointwise.u8"),
        ("none", "aten._int_mm"),
    ],
)
def test_frozen_weight_takes_the_prepacked_qlinear_on_vnni_and_amx(isa, want, monkeypatch):
    """The compile-time prepacked u8 qlinear where it was measured faster (devices/cpu.py,
    QLINEAR_FROZEN_ISAS); the run-time cached one stays on VNNI CPUs without AMX (its per-call weight compare
    costs more than AMX's GEMM saves)."""
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", isa)
    model, x = IntMMReciprocal(K, N, bias=True), _x(5)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        eager = model(x)
        torch._dynamo.reset()
        out = torch.compile(model, options=qlower.inductor_options())(x)
    (d,) = qlower.last_report()
    assert d.lowering == want, qlower.last_report().table()
    check_close(out, eager, model.reference(x))
    if isa == "amx":
        with torch.no_grad():
            torch._dynamo.reset()
            torch.compile(model, options=qlower.inductor_options())(x)
        (d,) = qlower.last_report()
        assert "qlower.qlinear_u8_cached" not in d.lowering
        assert "measured faster on VNNI CPUs without AMX only (this CPU: amx)" in d.passed_over_text


def test_freezing_through_options_only_is_not_frozen(monkeypatch):
    """options={"freezing": True} does not freeze nn.Module parameters (Dynamo reads the global config), so
    no prepacked-weight lowering may be chosen: it would re-pack the weight on every call."""
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "vnni")
    model, x = IntMMDivide(4096, N), _x(5, 4096)
    with torch.no_grad():
        out = torch.compile(model, options=qlower.inductor_options(freezing=True))(x)
        eager = model(x)
    (d,) = qlower.last_report()
    assert d.lowering == "aten._int_mm.u8s8"
    assert "the weight is not a constant" in d.passed_over_text
    check_close(out, eager, model.reference(x))


def test_pt2e_compiled_without_fallbacks():
    model = PT2E(K, N, asymmetric=True)
    x = _x(5)
    with torch.no_grad():
        eager = model(x)
        out, (code,) = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
    assert "quantized_decomposed" not in code.split("def call(")[1]
    assert "extern_kernels._int_mm" in code
    check_close(out, eager, model.reference(x))


@pytest.mark.parametrize("preference", ["aten", "emulated"])
def test_pt2e_inlined_after_a_stock_compile_met_its_ops(preference):
    """A stock compile of a PT2E graph makes Inductor register fallback handlers for the quantized_decomposed
    ops; a qlower compile after it in the same process must still inline them. Run opaquely they take their
    meta function's dtypes (choose_qparams_per_token: float64 scales where the kernel returns float32), and
    the generated code read the float32 scales as doubles: non-finite and wrong outputs (fuzz seed 878058745)."""
    model = PT2E(K, N)
    x = _x(7)
    with torch.no_grad():
        eager = model(x)
        torch.compile(PT2E(K, N), dynamic=True)(x)  # stock: quantized_decomposed ops become fallbacks
        compiled = torch.compile(
            model, dynamic=True, options=qlower.inductor_options(kernel_preference=preference)
        )
        out, (code,) = run_and_get_code(compiled, x)
    assert "quantized_decomposed" not in code.split("def call(")[1], code
    check_close(out, eager, model.reference(x))


def test_dynamic_m_compiled():
    model = Int32MM(K, N, kn=True)
    fn = torch.compile(model, options=qlower.inductor_options(), dynamic=True)
    with torch.no_grad():
        for m in (3, 40):
            x = _x(m)
            check_close(fn(x), model(x), model.reference(x))
    (d,) = qlower.last_report()
    # K < 4096: s8s8, except where an M that can be 1 takes u8s8 (VNNI CPUs without AMX: cpu.u8s8_at_m1)
    from qlower.lowerings.devices.cpu import cpu_int8_isa, int_mm_takes_uint8

    want = "aten._int_mm.u8s8" if cpu_int8_isa() == "vnni" and int_mm_takes_uint8() else "aten._int_mm"
    assert d.lowering == want and isinstance(d.shape[0], torch.SymInt), (d.lowering, want)
