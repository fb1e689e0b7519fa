"""Expect-tests of the graph after qlower's pass, per woq-int8 graph form (traced, no codegen)."""

from __future__ import annotations

import expecttest
import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower.patterns import woq_int8
from qlower.patterns.graph_utils import tensor_val
from qlower.patterns.record import QuantLinear
from qlower.testing import apply_pass, graph_summary, trace_for_inductor
from tests.forms.woq_int8 import WoqLinear
from tests.helpers.cpu_woq_choice import without_woq_gemm
from tests.helpers.fake_gpu_trace import fake_cuda_trace

BF16 = torch.bfloat16


def lowered(
    model: torch.nn.Module, x: torch.Tensor, dynamic: bool = False, **kw
) -> tuple[str, qlower.Report]:
    gm = trace_for_inductor(model, x, dynamic=dynamic)
    report = apply_pass(gm, **kw)
    return graph_summary(gm), report


class TestWoqForms(expecttest.TestCase):
    def test_gpt_fast_2d(self):
        text, report = lowered(WoqLinear(64, 32, BF16), torch.randn(4, 64, dtype=BF16))
        self.assertEqual([d.lowering for d in report], ["aten._weight_int8pack_mm"])
        self.assertExpectedInline(
            text,
            """_weight_int8pack_mm_default: bfloat16[4, 32] = aten._weight_int8pack_mm(arg2_1, arg0_1, arg1_1)""",
        )

    def test_gpt_fast_3d_bias_fp32_scale(self):
        model = WoqLinear(64, 32, BF16, bias=True, scale_dtype=torch.float32)
        text, report = lowered(model, torch.randn(2, 3, 64, dtype=BF16))
        self.assertEqual(report.entries[0].form, "mm+output_scale+bias+nd")
        self.assertExpectedInline(
            text,
            """\
view: bfloat16[6, 64] = aten.view(arg2_1, [6, 64])
full_default: bfloat16[32] = aten.full([32], 1.0, dtype=bfloat16, device=device(type='cpu'), pin_memory=False)
_weight_int8pack_mm_default: bfloat16[6, 32] = aten._weight_int8pack_mm(view, arg0_1, full_default)
mul_tensor: float32[6, 32] = aten.mul.Tensor(_weight_int8pack_mm_default, arg1_1)
add_tensor: float32[6, 32] = aten.add.Tensor(mul_tensor, arg3_1)
reshape_default: float32[2, 3, 32] = aten.reshape(add_tensor, [2, 3, 32])""",
        )

    def test_scale_first_with_bias(self):
        text, report = lowered(
            WoqLinear(64, 32, BF16, form="scale_first", bias=True), torch.randn(4, 64, dtype=BF16)
        )
        self.assertEqual(report.entries[0].form, "addmm+weight_scale+bias")
        self.assertExpectedInline(
            text,
            """\
unsqueeze: bfloat16[32, 1] = aten.unsqueeze(arg1_1, 1)
reshape_default: bfloat16[32] = aten.reshape(unsqueeze, [32])
_weight_int8pack_mm_default: bfloat16[4, 32] = aten._weight_int8pack_mm(arg2_1, arg0_1, reshape_default)
add_tensor: bfloat16[4, 32] = aten.add.Tensor(_weight_int8pack_mm_default, arg3_1)""",
        )

    def test_scale_n1_4d_fp16(self):
        model = WoqLinear(64, 32, torch.float16, form="scale_n1")
        text, report = lowered(model, torch.randn(1, 1, 1, 64, dtype=torch.float16))
        self.assertEqual(report.entries[0].lowering, "dequant_mm")  # fp16 weight scale: test_dequant_range.py
        self.assertExpectedInline(
            text,
            """\
view: float16[1, 64] = aten.view(arg2_1, [1, 64])
convert_element_type_default: float32[32, 64] = prims.convert_element_type(arg0_1, float32)
convert_element_type_default_1: float32[32, 1] = prims.convert_element_type(arg1_1, float32)
reshape_default: float32[32, 1] = aten.reshape(convert_element_type_default_1, [-1, 1])
mul_tensor: float32[32, 64] = aten.mul.Tensor(convert_element_type_default, reshape_default)
convert_element_type_default_2: float16[32, 64] = prims.convert_element_type(mul_tensor, float16)
permute_default: float16[64, 32] = aten.permute(convert_element_type_default_2, [1, 0])
mm_default: float16[1, 32] = aten.mm(view, permute_default)
reshape_default_1: float16[1, 1, 1, 32] = aten.reshape(mm_default, [1, 1, 1, 32])""",
        )

    def test_weight_stored_kn(self):
        text, report = lowered(WoqLinear(64, 32, BF16, form="kn_weight"), torch.randn(1, 64, dtype=BF16))
        self.assertEqual(report.entries[0].form, "mm+output_scale+kn_weight")
        self.assertExpectedInline(
            text,
            """\
permute_default: int8[32, 64] = aten.permute(arg0_1, [1, 0])
clone_default: int8[32, 64] = aten.clone(permute_default, memory_format=torch.contiguous_format)
_weight_int8pack_mm_default: bfloat16[1, 32] = aten._weight_int8pack_mm(arg2_1, clone_default, arg1_1)""",
        )

    def test_large_m_uses_dequant_mm(self):
        with pytest.MonkeyPatch.context() as mp:  # not qlower.woq_int8_gemm's shapes
            without_woq_gemm(mp)
            text, report = lowered(WoqLinear(64, 32, BF16), torch.randn(256, 64, dtype=BF16))
        self.assertEqual(report.entries[0].lowering, "dequant_mm")
        self.assertIn("M=256 > 8", report.entries[0].passed_over_text)
        self.assertExpectedInline(
            text,
            """\
convert_element_type_default: float32[32, 64] = prims.convert_element_type(arg0_1, float32)
convert_element_type_default_1: bfloat16[32, 64] = prims.convert_element_type(convert_element_type_default, bfloat16)
permute_default: bfloat16[64, 32] = aten.permute(convert_element_type_default_1, [1, 0])
mm_default: bfloat16[256, 32] = aten.mm(arg2_1, permute_default)
convert_element_type_default_2: float32[32] = prims.convert_element_type(arg1_1, float32)
mul_tensor: float32[256, 32] = aten.mul.Tensor(mm_default, convert_element_type_default_2)
convert_element_type_default_3: bfloat16[256, 32] = prims.convert_element_type(mul_tensor, bfloat16)""",
        )

    def test_dynamic_m_guarded_choice(self):
        with pytest.MonkeyPatch.context() as mp:
            without_woq_gemm(mp)
            text, report = lowered(WoqLinear(64, 32, BF16), torch.randn(3, 5, 64, dtype=BF16), dynamic=True)
        self.assertEqual(report.entries[0].lowering, "qlower.woq_int8_mm_by_m")
        self.assertExpectedInline(
            text,
            """\
mul_3: sym = mul(arg2_1, arg3_1)
view: bfloat16[s27*s77, 64] = aten.view(arg4_1, [mul_3, 64])
woq_int8_mm_by_m_default: bfloat16[s27*s77, 32] = qlower.woq_int8_mm_by_m(view, arg0_1, arg1_1, 8)
reshape_default: bfloat16[s77, s27, 32] = aten.reshape(woq_int8_mm_by_m_default, [arg2_1, arg3_1, 32])""",
        )

    def test_bf16_k24_avoids_packed_kernel(self):
        text, report = lowered(WoqLinear(24, 32, BF16), torch.randn(2, 3, 24, dtype=BF16))
        self.assertEqual(report.entries[0].lowering, "dequant_mm")
        self.assertIn("K % 16 == 0 (K=24)", report.entries[0].passed_over_text)
        self.assertNotIn("_weight_int8pack_mm", text)
        self.assertExpectedInline(
            text,
            """\
view: bfloat16[6, 24] = aten.view(arg2_1, [6, 24])
convert_element_type_default: float32[32, 24] = prims.convert_element_type(arg0_1, float32)
convert_element_type_default_1: bfloat16[32, 24] = prims.convert_element_type(convert_element_type_default, bfloat16)
permute_default: bfloat16[24, 32] = aten.permute(convert_element_type_default_1, [1, 0])
mm_default: bfloat16[6, 32] = aten.mm(view, permute_default)
convert_element_type_default_2: float32[32] = prims.convert_element_type(arg1_1, float32)
mul_tensor: float32[6, 32] = aten.mul.Tensor(mm_default, convert_element_type_default_2)
convert_element_type_default_3: bfloat16[6, 32] = prims.convert_element_type(mul_tensor, bfloat16)
reshape_default: bfloat16[2, 3, 32] = aten.reshape(convert_element_type_default_3, [2, 3, 32])""",
        )

    def test_symbolic_weight_shape_still_rewritten_safely(self):
        w = torch.randint(
            -127, 128, (32, 24), dtype=torch.int8
        )  # a global: Dynamo makes its dims dynamic too
        s = torch.rand(32, dtype=BF16)

        def f(x):
            return torch.nn.functional.linear(x, w.to(x.dtype)) * s

        text, report = lowered(f, torch.randn(2, 3, 24, dtype=BF16), dynamic=True)
        self.assertEqual(report.entries[0].lowering, "dequant_mm")
        self.assertIn("symbolic", report.entries[0].passed_over_text)
        self.assertNotIn("_weight_int8pack_mm", text)

    def test_explicit_emulated_preference(self):
        pref = qlower.KernelPreference.EMULATED
        text, report = lowered(
            WoqLinear(64, 32, BF16), torch.randn(4, 64, dtype=BF16), kernel_preference=pref
        )
        self.assertEqual(report.entries[0].lowering, "dequant_mm")
        self.assertEqual(report.entries[0].kind, "EMULATED")

    def test_two_linears_share_input(self):
        a, b = WoqLinear(64, 32, BF16, seed=1), WoqLinear(64, 48, BF16, seed=2)
        text, report = lowered(lambda x: torch.cat([a(x), b(x)], -1), torch.randn(4, 64, dtype=BF16))
        self.assertEqual(len(report.lowered), 2)
        self.assertEqual(text.count("= aten._weight_int8pack_mm("), 2)

    def test_chained_linears_2d(self):
        """The second linear's input is the first one's output node, which lowering the first replaces."""
        a, b = WoqLinear(64, 64, BF16, seed=1), WoqLinear(64, 32, BF16, seed=2)
        text, report = lowered(lambda x: b(a(x)), torch.randn(4, 64, dtype=BF16))
        self.assertEqual(len(report.lowered), 2)
        self.assertExpectedInline(
            text,
            """\
_weight_int8pack_mm_default: bfloat16[4, 64] = aten._weight_int8pack_mm(arg2_1, arg0_1, arg1_1)
_weight_int8pack_mm_default_1: bfloat16[4, 32] = aten._weight_int8pack_mm(_weight_int8pack_mm_default, arg3_1, arg4_1)""",
        )

    def test_residual_and_gate_at_m1_are_not_bias_or_scale(self):
        """At M = 1 a residual or gate is [1, 1, N]: it broadcasts along N but is an activation."""
        up, gate, down = (WoqLinear(64, 64, BF16, seed=i) for i in range(3))

        def block(x):
            h = x + up(x)
            return h + down(torch.nn.functional.silu(gate(h)) * up(h))

        text, report = lowered(block, torch.randn(1, 1, 64, dtype=BF16))
        self.assertEqual(len(report.lowered), 4)
        self.assertEqual({d.form for d in report}, {"mm+output_scale+nd"})
        self.assertEqual(text.count("= aten._weight_int8pack_mm("), 4)


class TestNotCandidates(expecttest.TestCase):
    def test_float_linear_untouched(self):
        lin = torch.nn.Linear(64, 32, dtype=BF16)
        text, report = lowered(lin, torch.randn(4, 64, dtype=BF16))
        self.assertEqual(len(report), 0)
        self.assertIn("aten.addmm", text)

    def test_zero_point_is_rejected_with_reason(self):
        w = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
        s = torch.rand(32, dtype=BF16)

        def asym(x):
            return torch.nn.functional.linear(x, (w.to(x.dtype) - 3)) * s

        text, report = lowered(asym, torch.randn(4, 64, dtype=BF16))
        self.assertEqual(report.entries[0].lowering, None)
        self.assertIn("zero point", report.entries[0].reason)
        self.assertIn("aten.mm", text)

    def test_per_k_scale_is_rejected(self):
        w = torch.randint(-127, 128, (32, 64), dtype=torch.int8)
        s = torch.rand(64, dtype=BF16)

        def per_k(x):
            return torch.nn.functional.linear(x, w.to(x.dtype) * s)

        _, report = lowered(per_k, torch.randn(4, 64, dtype=BF16))
        self.assertIn("per output channel", report.entries[0].reason)


# ------------------------------------------------------------------ M = 1 on CUDA: the decomposed matvec
# With `coordinate_descent_tuning` on (torchao's `quantize_` turns it on process-wide), Inductor's `mm`
# decomposition turns a CUDA mm with M == 1 into `(x[:, :, None] * w[None]).sum(1)`, upcast to fp32 and cast
# back (`pw_cast_for_opmath`). Graphs are traced with fake CUDA tensors: no GPU needed.


def _torchao_woq(m: int, dtype: torch.dtype, k: int = 64, n: int = 32) -> torch.fx.GraphModule:
    """torchao `Int8WeightOnlyConfig`'s linear on [1, m, k], its Int8Tensor rebuilt from fake CUDA parts as
    AOTAutograd does (`__tensor_unflatten__`), so the graph is torchao's own dispatch."""
    ao = pytest.importorskip("torchao.quantization")
    lin = torch.nn.Linear(k, n, bias=False, dtype=dtype)
    ao.quantize_(lin, ao.Int8WeightOnlyConfig())
    names, ctx = lin.weight.__tensor_flatten__()
    parts = [getattr(lin.weight, name) for name in names]

    def f(x, *inner):
        w = type(lin.weight).__tensor_unflatten__(dict(zip(names, inner, strict=True)), ctx, None, None)
        return F.linear(x, w)

    return fake_cuda_trace(f, torch.empty(1, m, k, dtype=dtype), *parts)


def _gpt_fast(m: int, dtype: torch.dtype, k: int = 64, n: int = 32) -> torch.fx.GraphModule:
    def f(x, w, s):
        return F.linear(x, w.to(x.dtype)) * s

    w, s = torch.empty(n, k, dtype=torch.int8), torch.empty(n, dtype=dtype)
    return fake_cuda_trace(f, torch.empty(m, k, dtype=dtype), w, s)


def _record(gm: torch.fx.GraphModule) -> QuantLinear:
    (rec,) = woq_int8.find(gm.graph)
    assert isinstance(rec, QuantLinear), rec
    return rec


def _facts(rec: QuantLinear) -> dict:
    """What a lowering reads from a record, node identities aside."""
    scale = tensor_val(rec.weight_scale)
    return dict(
        x=(tensor_val(rec.x).dtype, tensor_val(rec.x).dim(), tensor_val(rec.x).shape[1]),
        weight=(tensor_val(rec.weight).dtype, tuple(tensor_val(rec.weight).shape), rec.weight_layout),
        scale=None if scale is None else (scale.dtype, tuple(scale.shape)),
        bias=rec.bias,
        dtypes=(rec.compute_dtype, rec.out_dtype),
        kn=(rec.k, rec.n),
        nd=rec.out_shape is not None,
        form=rec.form.split("+", 1)[1],
        scale_site=rec.scale_site,
        scale_cast=rec.scale_cast,
    )


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("build", [_torchao_woq, _gpt_fast], ids=["torchao", "gpt_fast"])
def test_decomposed_matvec_is_the_record_of_the_mm(build, dtype):
    """M = 1 (the decomposed matvec, x upcast to fp32) gives the record M = 2 (an mm) gives: x in its own
    dtype, the scale multiply after the fp32 -> dtype cast absorbed, one record (not one per sum and cast)."""
    one, two = build(1, dtype), build(2, dtype)
    assert "aten.sum" in graph_summary(one) and "aten.sum" not in graph_summary(two)
    rec1, rec2 = _record(one), _record(two)
    assert rec1.form.startswith("matvec+") and rec2.form.startswith("mm+"), (rec1.form, rec2.form)
    assert (rec1.m, rec2.m) == (1, 2)
    assert _facts(rec1) == _facts(rec2)
    assert tensor_val(rec1.x).dtype == dtype and rec1.compute_dtype == dtype


def test_decomposed_matvec_picks_the_cuda_decode_kernel(monkeypatch):
    """With an SM90 device, torchao's M = 1 graph gets the Triton decode kernel, as M = 2 does (it was
    `dequant_mm`: the matvec's record said fp32, which the kernel does not take)."""
    from qlower.lowerings.devices.cuda import override_cuda_capability
    from qlower.lowerings.kernels.triton import triton_unavailable
    from qlower.lowerings.registry import choose

    if triton_unavailable():
        pytest.skip(triton_unavailable())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    with override_cuda_capability((9, 0)):
        for m in (1, 2):
            choice = choose(_record(_torchao_woq(m, BF16)), qlower.KernelPreference.AUTO)
            assert choice.lowering is not None and choice.lowering.name == "triton.woq_int8_linear", (
                m,
                choice,
            )


def test_fp32_matvec_cast_down_keeps_fp32():
    """A matvec the model computes in fp32 and casts to bf16 afterwards is not a bf16 mm: the weight operand
    is no upcast of a bf16 tensor, so the record keeps the fp32 activation and compute dtype."""

    def f(x, w, s):
        return F.linear(x.float(), w.float()).to(x.dtype) * s

    gm = fake_cuda_trace(f, torch.empty(1, 64, dtype=BF16), torch.empty(32, 64, dtype=torch.int8),
                          torch.empty(32, dtype=BF16))  # fmt: skip
    assert "aten.sum" in graph_summary(gm)
    rec = _record(gm)
    assert tensor_val(rec.x).dtype == torch.float32 and rec.compute_dtype == torch.float32, rec


def test_half_precision_matvec_is_not_an_mm():
    """`(x[:, :, None] * w[None]).sum(1)` written in bf16 rounds every product to bf16; an mm does not.
    Inductor never emits it (its matvec computes in fp32), so it is no matmul site."""

    def f(x, w, s):
        return (x.unsqueeze(2) * w.to(x.dtype).t().unsqueeze(0)).sum(1) * s

    gm = fake_cuda_trace(f, torch.empty(1, 64, dtype=BF16), torch.empty(32, 64, dtype=torch.int8),
                          torch.empty(32, dtype=BF16), coordinate_descent=False)  # fmt: skip
    assert woq_int8.find(gm.graph) == []
