"""woq-int8 end to end through Inductor on CPU: numerics vs eager and float64, and the kernel in the code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from torch.testing import FileCheck

import qlower
from tests.forms.woq_int8 import WoqLinear, assert_close_to_reference
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S
from tests.helpers.cpu_woq_choice import without_woq_gemm

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def compile_and_run(model, *xs, dynamic=False, **opts):
    compiled = torch.compile(model, options=qlower.inductor_options(**opts), dynamic=dynamic)
    with torch.no_grad():
        out, code = run_and_get_code(compiled, xs[0])
        rest = [compiled(x) for x in xs[1:]]
    return [out, *rest], "\n".join(code), qlower.last_report()


CASES = [
    # form, dtype, scale dtype, bias, x shape, expected lowering
    ("gpt_fast", BF16, FP32, True, (1, 1, 64), "aten._weight_int8pack_mm"),
    ("gpt_fast", BF16, BF16, False, (256, 64), "dequant_mm"),
    ("scale_first", FP16, FP16, True, (1, 64), "dequant_mm"),  # fp16 weight scale: test_dequant_range.py
    ("scale_n1", FP32, FP32, False, (2, 2, 2, 64), "dequant_mm"),
    ("kn_weight", BF16, BF16, True, (2, 64), "aten._weight_int8pack_mm"),
    ("unscaled", BF16, BF16, False, (3, 64), "aten._weight_int8pack_mm"),
]


@pytest.mark.parametrize("form,dtype,sdtype,bias,shape,lowering", CASES)
def test_numerics_and_code(form, dtype, sdtype, bias, shape, lowering, monkeypatch):
    without_woq_gemm(
        monkeypatch
    )  # the lowerings AUTO picks among without it (its tests: test_cpu_woq_gemm.py)
    model = WoqLinear(64, 48, dtype, form=form, bias=bias, scale_dtype=sdtype)
    x = torch.randn(shape, dtype=dtype)
    (out,), code, report = compile_and_run(model, x)
    assert [d.lowering for d in report] == [lowering], report.table()
    with torch.no_grad():
        assert_close_to_reference(out, model(x), model.reference(x))
    if lowering == "aten._weight_int8pack_mm":
        FileCheck().check("_weight_int8pack_mm").run(code)
    else:
        FileCheck().check_regex(r"extern_kernels\.(add)?mm").check_not("_weight_int8pack_mm").run(code)


@pytest.mark.parametrize(
    "form,dtype,sdtype,bias",
    [("gpt_fast", BF16, FP32, True), ("kn_weight", BF16, BF16, False), ("scale_first", FP16, FP16, True)],
)
def test_large_weights_convert_into_a_reused_buffer(form, dtype, sdtype, bias, monkeypatch):
    """Float weights of >= 16 MiB above the packed kernel's M: the int8 -> float copy goes into a per-thread
    buffer that the next call reuses (a fresh 32 MiB tensor page-faults on every call on the CI VM). Where
    qlower.woq_int8_gemm is preferred (its measured M limits, `WOQ_GEMM_MAX_M`) it would take this linear:
    the limits are emptied here."""
    from qlower.lowerings.kernels.cpu_scratch import scratch

    without_woq_gemm(monkeypatch)

    model = WoqLinear(4096, 2048, dtype, form=form, bias=bias, scale_dtype=sdtype)
    xs = [torch.randn(80, 4096, dtype=dtype, generator=torch.Generator().manual_seed(i)) for i in (1, 2)]
    outs, code, report = compile_and_run(model, *xs)
    assert [d.lowering for d in report] == ["qlower.int8_weight_mm"], report.table()
    op = "int8_scaled_weight_mm" if form == "scale_first" else "int8_weight_mm"  # the graph scales w
    FileCheck().check(f"torch.ops.qlower.{op}.default(").check_not("_weight_int8pack_mm").run(code)
    with torch.no_grad():
        for out, x in zip(outs, xs, strict=True):
            assert_close_to_reference(out, model(x), model.reference(x))
    buf = scratch((2048, 4096), dtype)
    assert buf.untyped_storage().data_ptr() == scratch((4096, 2048), dtype).untyped_storage().data_ptr()


def test_scratch_grows_and_is_per_thread():
    import threading

    from qlower.lowerings.kernels.cpu_scratch import scratch

    small = scratch((8, 8), torch.float32)
    big = scratch((64, 64), torch.float32)
    assert big.shape == (64, 64) and scratch((8, 8), torch.float32).data_ptr() == big.data_ptr()
    other: list[int] = []
    t = threading.Thread(target=lambda: other.append(scratch((8, 8), torch.float32).data_ptr()))
    t.start()
    t.join()
    assert other[0] != big.data_ptr() and small.numel() == 64


def test_dynamic_m_switches_kernel_at_run_time(monkeypatch):
    without_woq_gemm(monkeypatch)
    model = WoqLinear(64, 48, BF16)
    xs = [torch.randn(2, m, 64, dtype=BF16) for m in (1, 3, 70)]  # M = 2, 6, 140: both sides of 64
    outs, code, report = compile_and_run(model, *xs, dynamic=True)
    assert [d.lowering for d in report] == ["qlower.woq_int8_mm_by_m"]
    FileCheck().check("qlower.woq_int8_mm_by_m").run(code)
    with torch.no_grad():
        for out, x in zip(outs, xs, strict=True):
            assert_close_to_reference(out, model(x), model.reference(x))


def test_freezing_keeps_int8_weight():
    model = WoqLinear(64, 48, BF16, bias=True)
    x = torch.randn(2, 64, dtype=BF16)
    # Global config: Dynamo decides on freezing before per-compile options apply.
    with torch._inductor.config.patch(freezing=True):
        (out,), code, report = compile_and_run(model, x)
    assert "_frozen_param" in code  # weights really were frozen into constants
    assert report.entries[0].lowering == "aten._weight_int8pack_mm"
    FileCheck().check("_weight_int8pack_mm").run(code)
    with torch.no_grad():
        assert_close_to_reference(out, model(x), model.reference(x))


@pytest.mark.parametrize("backends", ["CPP", "ATEN,CPP"])
def test_freezing_with_max_autotune_offers_the_cpp_gemm_template(backends):
    """With frozen weights and max_autotune, Inductor offers its C++ GEMM template (an int8 weight-only
    micro-kernel) next to `_weight_int8pack_mm`. Its epilogue needs the scale as a TensorBox; qlower's fix of
    that lowering must keep it one (it crashed in `expand` before). The template was 13.0 ms against 8.4 ms
    for the aten kernel at M=16, 4096x4096 on the CI CPU, so autotuning, not qlower, picks between them."""
    model = WoqLinear(256, 128, BF16, bias=True)
    x = torch.randn(8, 256, dtype=BF16)  # M within the packed kernel's range
    with torch._inductor.config.patch(freezing=True, max_autotune=True, max_autotune_gemm_backends=backends):
        (out,), code, report = compile_and_run(model, x)
    assert report.entries[0].lowering == "aten._weight_int8pack_mm"
    if backends == "CPP":
        assert "_weight_int8pack_mm" not in code.split("def call(")[1]  # the template's kernel runs instead
    with torch.no_grad():
        assert_close_to_reference(out, model(x), model.reference(x))


def test_m_zero():
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(0, 64, dtype=BF16)
    (out,), _, report = compile_and_run(model, x)
    assert out.shape == (0, 48) and out.dtype == BF16
    assert report.entries[0].lowering == "dequant_mm"
    assert "M == 0" in report.entries[0].passed_over_text


def test_non_contiguous_weight():
    model = WoqLinear(64, 48, BF16)
    wide = torch.randint(-127, 128, (48, 128), dtype=torch.int8)
    model.w = torch.nn.Parameter(wide[:, ::2], requires_grad=False)  # strided [N, K]
    assert not model.w.is_contiguous()
    x = torch.randn(2, 64, dtype=BF16)
    (out,), _, report = compile_and_run(model, x)
    assert report.entries[0].lowering == "aten._weight_int8pack_mm"
    with torch.no_grad():
        assert_close_to_reference(out, model(x), model.reference(x))


class MixedDtypes(torch.nn.Module):
    """bf16 activations, fp32 scales, fp16 bias: the output dtype follows torch's promotion (fp32)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randint(-127, 128, (48, 64), dtype=torch.int8), requires_grad=False)
        self.s = torch.nn.Parameter(torch.rand(48) * 0.01, requires_grad=False)
        self.b = torch.nn.Parameter(torch.randn(48, dtype=FP16), requires_grad=False)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w.to(x.dtype)) * self.s + self.b


def test_mixed_dtypes_follow_eager_promotion():
    model = MixedDtypes()
    x = torch.randn(3, 64, dtype=BF16)
    (out,), _, report = compile_and_run(model, x)
    assert report.entries[0].lowered
    with torch.no_grad():
        eager = model(x)
        ref = x.double() @ (model.w.double() * model.s.double()[:, None]).t() + model.b.double()
    assert_close_to_reference(out, eager, ref)


def test_bf16_odd_k_never_crashes_or_miscomputes():
    """K = 7, 24, 33 with bf16 3-D input: _weight_int8pack_mm would segfault or be wrong; Inductor's own woq
    rewrite calls it unchecked. Run in a subprocess so a segfault fails this test instead of killing pytest."""
    script = textwrap.dedent(
        """
        import torch, qlower
        from tests.forms.woq_int8 import WoqLinear, assert_close_to_reference
        for k in (7, 24, 33):
            model = WoqLinear(k, 40, torch.bfloat16, bias=True)
            x = torch.randn(2, 3, k, dtype=torch.bfloat16)
            out = torch.compile(model, options=qlower.inductor_options())(x)
            (d,) = qlower.last_report().entries
            assert d.lowering == "dequant_mm" and "K % 16" in d.passed_over_text, d
            with torch.no_grad():
                assert_close_to_reference(out, model(x), model.reference(x))
            torch._dynamo.reset()
        w, s = torch.randint(-127, 128, (40, 24), dtype=torch.int8), torch.rand(40, dtype=torch.bfloat16)
        f = lambda x: torch.nn.functional.linear(x, w.to(x.dtype)) * s  # dynamic weight dims too
        x = torch.randn(2, 3, 24, dtype=torch.bfloat16)
        out = torch.compile(f, options=qlower.inductor_options(), dynamic=True)(x)
        assert qlower.last_report().entries[0].lowering == "dequant_mm"
        ref = x.double() @ (w.double() * s.double()[:, None]).t()
        assert_close_to_reference(out, f(x), ref)
        print("ok")
        """
    )
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}  # a cache hit would skip the pass
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_aot_inductor_package():
    model = WoqLinear(64, 48, BF16, bias=True)
    x = torch.randn(2, 64, dtype=BF16)
    ep = torch.export.export(model, (x,))
    path = torch._inductor.aoti_compile_and_package(ep, inductor_configs=qlower.inductor_options())
    assert qlower.last_report().entries[0].lowering == "aten._weight_int8pack_mm"
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        assert_close_to_reference(runner(x), model(x), model.reference(x))


def test_explicit_preference_error_surfaces_through_compile():
    model = WoqLinear(64, 48, BF16)
    with pytest.raises(Exception, match="platform unsupported.*woq_int8.*TRITON"):
        torch.compile(model, options=qlower.inductor_options(kernel_preference="triton"))(
            torch.randn(2, 64, dtype=BF16)
        )


def test_torchao_large_weight_uses_the_reused_buffer(monkeypatch):
    """A real producer: torchao Int8WeightOnlyConfig on a 4096 -> 2048 linear at M = 80 (above the packed
    kernel's range, float weight 16 MiB): lowered to `qlower.int8_weight_mm`, within eager's error (with
    qlower.woq_int8_gemm's preference limits emptied, as above)."""

    without_woq_gemm(monkeypatch)
    torchao_quant = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 2048, bias=True)).to(BF16)
    torchao_quant.quantize_(model, torchao_quant.Int8WeightOnlyConfig())
    x = torch.randn(2, 40, 4096, dtype=BF16)
    with torch.no_grad():
        eager = model(x)
        out = torch.compile(model, options=qlower.inductor_options())(x)
    assert [d.lowering for d in qlower.last_report()] == ["qlower.int8_weight_mm"]
    w = model[0].weight
    ref = x.double() @ (w.qdata.double() * w.scale.double().reshape(-1, 1)).t() + model[0].bias.double()
    assert (out.double() - ref).abs().max() <= 1.05 * (eager.double() - ref).abs().max()


@pytest.mark.parametrize("dynamic", [False, True])
def test_fp32_scale_is_applied_in_fp32_as_eager_does(dynamic, monkeypatch):
    """bf16 x with an fp32 scale: eager rounds the mm to bf16, then multiplies by the fp32 scale. The packed
    kernel takes its scale in x's dtype, so qlower gives it ones and scales its output in fp32: the same
    arithmetic, not an fp32 scale rounded to bf16 first (found by scripts/fuzz_compile.py)."""
    without_woq_gemm(monkeypatch)
    model = WoqLinear(64, 200, BF16, form="gpt_fast", bias=True, scale_dtype=FP32, seed=5)
    xs = [torch.randn(1, m, 64, dtype=BF16, generator=torch.Generator().manual_seed(m)) for m in (3, 5)]
    outs, _, report = compile_and_run(model, *xs, dynamic=dynamic)
    assert [d.lowering for d in report] == [
        "qlower.woq_int8_mm_by_m" if dynamic else "aten._weight_int8pack_mm"
    ]
    with torch.no_grad():
        for out, x in zip(outs, xs, strict=True):
            eager = model(x)
            assert out.dtype == eager.dtype == FP32
            # the same roundings as eager: equal but for the mm's summation order, far below a bf16 step
            rel = ((out - eager).abs() / eager.abs().clamp_min(1e-3)).median().item()
            assert rel < 2**-12, rel
            assert_close_to_reference(out, eager, model.reference(x))
