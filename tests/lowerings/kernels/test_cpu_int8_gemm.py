"""qlower::int8_gemm, the CPU int8 x int8 -> int32 GEMM for decode sizes (lowerings/kernels/csrc/int8_gemm.cpp).

- The op equals the exact integer product on every ISA level this CPU has, over M 0..9 (its own kernels up to
  `max_m`, `_int_mm` above), K and N tails of every vector width, strided operands and the int8 extremes, at
  1 and 2 threads.
- The pass takes it for dynamic-int8 records with M <= INT8_GEMM_MAX_M (or a symbolic M), the report names its
  ISA level, and compiled models (static and symbolic M) match the exact eager result, with the quantize and
  the rescale fused around the op's call in the generated code.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import qlower
from qlower.lowerings.devices import cpu
from qlower.lowerings.kernels import custom_ops, native
from qlower.testing import apply_pass, graph_summary, trace_for_inductor
from tests.forms.dynamic_int8 import IntMMDivide

pytestmark = pytest.mark.skipif(not native.compiler_available(), reason="no C++ compiler to build the kernel")

LEVELS = ("scalar", "avx2", "avx512", "avx512_vnni")
MAX_M = 4


def _cpu_has(level: str) -> bool:
    flags = {
        "scalar": True,
        "avx2": torch.cpu._is_avx2_supported(),
        "avx512": torch.cpu._is_avx512_supported(),
        "avx512_vnni": torch.cpu._is_vnni_supported(),
    }
    return flags[level]


@pytest.fixture(params=[lv for lv in LEVELS if _cpu_has(lv)])
def level(request, monkeypatch):
    monkeypatch.setenv(cpu.INT8_GEMM_ISA_ENV, request.param)
    return request.param


def _exact(x: torch.Tensor, w_nk: torch.Tensor) -> torch.Tensor:
    return (x.to(torch.int64) @ w_nk.to(torch.int64).t()).to(torch.int32)


def _int8(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, shape, dtype=torch.int8, generator=gen)


@pytest.mark.parametrize("threads", [1, 2])
def test_exact_on_every_level(level, threads):
    assert native.int8_gemm_isa() == level
    gen = torch.Generator().manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m in range(10):
            for k in (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130, 1000):
                for n in (1, 3, 4, 5, 9, 67):
                    x, w = _int8(m, k, gen=gen), _int8(n, k, gen=gen)
                    got = custom_ops.int8_gemm(x, w, MAX_M)
                    assert got.dtype == torch.int32 and torch.equal(got, _exact(x, w)), (m, k, n)
    finally:
        torch.set_num_threads(before)


def test_extremes_and_strided_operands(level):
    gen = torch.Generator().manual_seed(1)
    k, n = 4099, 70
    lo = torch.full((3, k), -128, dtype=torch.int8)  # -128 * -128 in every product: the largest sums
    w_lo = torch.full((n, k), -128, dtype=torch.int8)
    assert torch.equal(custom_ops.int8_gemm(lo, w_lo, MAX_M), _exact(lo, w_lo))
    hi = torch.full((2, k), 127, dtype=torch.int8)
    assert torch.equal(custom_ops.int8_gemm(hi, w_lo, MAX_M), _exact(hi, w_lo))
    wide = _int8(4, 2 * k, gen=gen)[:, ::2]  # K not contiguous: copied
    rows = _int8(8, k, gen=gen)[::2]  # a row stride larger than K
    w_kn = _int8(k, n, gen=gen)
    for x in (wide, rows, rows[:1].expand(3, k)):
        assert torch.equal(custom_ops.int8_gemm(x, w_lo, MAX_M), _exact(x, w_lo))
        assert torch.equal(custom_ops.int8_gemm(x, w_kn.t(), MAX_M), _exact(x, w_kn.t()))


def test_forced_level_names_are_checked(monkeypatch):
    monkeypatch.setenv(cpu.INT8_GEMM_ISA_ENV, "avx9000")
    with pytest.raises(RuntimeError, match="QLOWER_CPU_INT8_GEMM_ISA=avx9000 is not one of"):
        custom_ops.int8_gemm(torch.zeros(1, 8, dtype=torch.int8), torch.zeros(2, 8, dtype=torch.int8), MAX_M)


def test_rejects_operands_it_does_not_compute():
    x = torch.zeros(1, 8, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="must be int8"):
        custom_ops.int8_gemm(x.float(), torch.zeros(2, 8, dtype=torch.int8), MAX_M)
    with pytest.raises(RuntimeError, match="but w_nk is"):
        custom_ops.int8_gemm(x, torch.zeros(2, 9, dtype=torch.int8), MAX_M)


@pytest.fixture
def s8s8(monkeypatch):
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "none")


def test_pass_emits_the_op_between_quantize_and_rescale(s8s8):
    gm = trace_for_inductor(IntMMDivide(64, 32), torch.randn(1, 64))
    report = apply_pass(gm, families=("dynamic_int8",))
    (row,) = report
    assert row.lowering == "qlower.int8_gemm" and f"[{native.int8_gemm_isa()}]" in row.why, row
    text = graph_summary(gm)
    tail = text[text.index("int8_gemm") - 40 :]
    assert re.search(r"int32\[1, 32\] = qlower\.int8_gemm\(convert_element_type, arg1_1, 4\)", tail), text
    assert "aten.mul.Tensor(int8_gemm" in tail and "_int_mm" not in text, text


def test_symbolic_m_report_says_where_it_hands_over(s8s8):
    gm = trace_for_inductor(IntMMDivide(64, 32), torch.randn(3, 64), dynamic=True)
    (row,) = apply_pass(gm, families=("dynamic_int8",))
    assert row.lowering == "qlower.int8_gemm", row
    assert f"up to M = {cpu.INT8_GEMM_MAX_M}, `_int_mm` above" in row.why, row


def test_larger_static_m_keeps_int_mm(s8s8):
    gm = trace_for_inductor(IntMMDivide(64, 32), torch.randn(cpu.INT8_GEMM_MAX_M + 1, 64))
    (row,) = apply_pass(gm, families=("dynamic_int8",))
    assert row.lowering == "aten._int_mm", row
    assert any(
        name == "qlower.int8_gemm"
        and f"M={cpu.INT8_GEMM_MAX_M + 1} outside [1, {cpu.INT8_GEMM_MAX_M}]" in why
        for name, why in row.passed_over
    ), row.passed_over


def _exact_float(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model with its int8 matmul computed exactly (float64 sums of int8 products, |sum| < 2^53)."""

    def exact_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int32)

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch, "_int_mm", exact_int_mm)
        return model(x)


def test_compiled_static_and_symbolic_m_match_exact(s8s8):
    torch.manual_seed(0)
    model = IntMMDivide(96, 40)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        x = torch.randn(1, 96)
        torch._dynamo.reset()
        out, (code,) = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
        torch.testing.assert_close(out, _exact_float(model, x), rtol=1e-5, atol=1e-5)
        body = code[code.index("def call(") :]
        assert "torch.ops.qlower.int8_gemm.default(" in body, body
        assert "_int_mm" not in body, body
        torch._dynamo.reset()
        compiled = torch.compile(model, options=qlower.inductor_options(), dynamic=True)
        for m in (2, 1, 4, 5, 17):  # the op's own kernels to M = 4, `_int_mm` above
            x = torch.randn(m, 96)
            torch.testing.assert_close(compiled(x), _exact_float(model, x), rtol=1e-5, atol=1e-5)
