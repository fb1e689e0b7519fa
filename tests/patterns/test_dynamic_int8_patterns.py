"""Expect-tests of the graph after qlower's pass, per dynamic-int8 graph form (traced, no codegen), and the
registry's choices for CPU, CUDA and XPU records (CUDA/XPU through fake tensors on this CPU machine)."""

from __future__ import annotations

import expecttest
import pytest
import torch

import qlower
from qlower.lowerings.devices import cpu
from qlower.patterns import dynamic_int8
from qlower.testing import apply_pass, graph_summary, trace_for_inductor
from tests.forms.dynamic_int8 import (
    PT2E,
    AsymInt32,
    DequantBoth,
    FloatCarrier,
    Form,
    Int32MM,
    IntMMDivide,
    IntMMReciprocal,
    OutDtypeMM,
    per_token,
    retarget,
    torchao_linear,
)

FAMILY = ("dynamic_int8",)


@pytest.fixture(autouse=True)
def _s8s8_cpu(monkeypatch):
    """Graphs independent of the CI CPU's ISA: s8s8 `_int_mm` unless a test asks for u8s8 (qlower.int8_gemm,
    which serves M <= 4 on CPU, is off here: tests/lowerings/kernels/test_cpu_int8_gemm.py has its graphs)."""
    monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "none")
    monkeypatch.setattr(cpu, "INT8_GEMM_MAX_M", 0)


def lowered(model, x, dynamic=False, device=None, **kw) -> tuple[str, qlower.Report]:
    gm = trace_for_inductor(model, x, dynamic=dynamic)
    if device is not None:
        retarget(gm, device)
    report = apply_pass(gm, families=FAMILY, **kw)
    return graph_summary(gm), report


def after_matmul(text: str) -> str:
    """The rewritten tail: from the first line mentioning the int8 matmul on."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "_int_mm" in line or "int8_mm" in line)
    return "\n".join(lines[first:])


class TestForms(expecttest.TestCase):
    def test_int_mm_divide_nd_bias(self):
        text, report = lowered(IntMMDivide(64, 32), torch.randn(2, 3, 64))
        (d,) = report
        self.assertEqual((d.lowering, d.form), ("aten._int_mm", "int_mm+bias+nd"))
        self.assertExpectedInline(
            text,
            """\
view: float32[6, 64] = aten.view(arg0_1, [-1, 64])
abs_1: float32[6, 64] = aten.abs(view)
amax: float32[6, 1] = aten.amax(abs_1, [-1], True)
clamp_min: float32[6, 1] = aten.clamp_min(amax, 1e-08)
div: float32[6, 1] = aten.div.Tensor(clamp_min, 127.0)
div_1: float32[6, 64] = aten.div.Tensor(view, div)
round_1: float32[6, 64] = aten.round(div_1)
clamp_min_1: float32[6, 64] = aten.clamp_min(round_1, -127)
clamp_max: float32[6, 64] = aten.clamp_max(clamp_min_1, 127)
convert_element_type: int8[6, 64] = prims.convert_element_type(clamp_max, int8)
permute_default: int8[64, 32] = aten.permute(arg1_1, [1, 0])
_int_mm_default: int32[6, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[6, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_tensor_1: float32[6, 32] = aten.mul.Tensor(mul_tensor, arg2_1)
reshape_default: float32[32] = aten.reshape(arg3_1, [32])
add_tensor: float32[6, 32] = aten.add.Tensor(mul_tensor_1, reshape_default)
reshape_default_1: float32[2, 3, 32] = aten.reshape(add_tensor, [2, 3, 32])""",
        )

    def test_reciprocal_clamp_128_no_bias(self):
        text, report = lowered(IntMMReciprocal(64, 32, bias=False), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "int_mm")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[4, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(mul_tensor, arg2_1)""",
        )

    def test_out_dtype(self):
        text, report = lowered(OutDtypeMM(64, 32), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "int32_mm+bias")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[4, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(mul_tensor, arg2_1)
reshape_default: float32[32] = aten.reshape(arg3_1, [32])
add_tensor: float32[4, 32] = aten.add.Tensor(mul_tensor_1, reshape_default)""",
        )

    def test_int32_mm_weight_stored_kn(self):
        text, report = lowered(Int32MM(64, 32, kn=True), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "int32_mm+bias+kn_weight")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type, permute_default_1)
mul_tensor: float32[4, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(mul_tensor, arg2_1)
reshape_default: float32[32] = aten.reshape(arg3_1, [32])
add_tensor: float32[4, 32] = aten.add.Tensor(mul_tensor_1, reshape_default)""",
        )

    def test_int8_carried_in_float(self):
        text, report = lowered(FloatCarrier(64, 32, bias=False), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "float_mm")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[4, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(mul_tensor, arg2_1)""",
        )

    def test_dequantize_both_then_linear(self):
        text, report = lowered(DequantBoth(64, 32), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "dequant_mm+bias")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[4, 32] = aten.mul.Tensor(_int_mm_default, div)
reshape_default: float32[32] = aten.reshape(unsqueeze, [32])
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(mul_tensor, reshape_default)
reshape_default_1: float32[32] = aten.reshape(arg3_1, [32])
add_tensor: float32[4, 32] = aten.add.Tensor(mul_tensor_1, reshape_default_1)""",
        )

    def test_asymmetric_zero_point_compensated(self):
        text, report = lowered(AsymInt32(64, 32, bias=False), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "int32_mm+asym")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type_1, permute_default)
sum_dim_int_list: int32[32] = aten.sum.dim_IntList(arg1_1, [1], False, dtype=int32)
reshape_default: int32[1, 32] = aten.reshape(sum_dim_int_list, [1, 32])
mul_tensor: int32[4, 32] = aten.mul.Tensor(reshape_default, convert_element_type)
sub_tensor: int32[4, 32] = aten.sub.Tensor(_int_mm_default, mul_tensor)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(sub_tensor, clamp_min_1)
mul_tensor_2: float32[4, 32] = aten.mul.Tensor(mul_tensor_1, arg2_1)""",
        )

    def test_pt2e_per_token_symmetric(self):
        text, report = lowered(PT2E(64, 32), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "qdq+wzp+bias")
        self.assertNotIn("quantized_decomposed", text)  # inlined into aten ops Inductor fuses
        self.assertExpectedInline(
            text,
            """\
abs_default: float32[4, 64] = aten.abs(arg0_1)
amax_default: float32[4, 1] = aten.amax(abs_default, [-1], True)
clamp_min_default: float32[4, 1] = aten.clamp_min(amax_default, 1e-05)
div_tensor: float32[4, 1] = aten.div.Tensor(clamp_min_default, 127)
full_default: float32[4, 1] = aten.full([4, 1], 0, dtype=float32, layout=torch.strided, device=device(type='cpu'), pin_memory=False)
reciprocal_default: float32[4, 1] = aten.reciprocal(div_tensor)
mul_tensor: float32[4, 1] = aten.mul.Tensor(reciprocal_default, 1.0)
mul_tensor_1: float32[4, 64] = aten.mul.Tensor(arg0_1, mul_tensor)
add_tensor: float32[4, 64] = aten.add.Tensor(mul_tensor_1, full_default)
round_default: float32[4, 64] = aten.round(add_tensor)
clamp_min_default_1: float32[4, 64] = aten.clamp_min(round_default, -128)
clamp_max_default: float32[4, 64] = aten.clamp_max(clamp_min_default_1, 127)
convert_element_type_default: int8[4, 64] = prims.convert_element_type(clamp_max_default, int8)
permute_default: int8[64, 32] = aten.permute(arg1_1, [1, 0])
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type_default, permute_default)
sum_dim_int_list: int32[4, 1] = aten.sum.dim_IntList(convert_element_type_default, [1], True, dtype=int32)
reshape_default: int64[1, 32] = aten.reshape(arg3_1, [1, 32])
convert_element_type_default_1: int32[1, 32] = prims.convert_element_type(reshape_default, int32)
mul_tensor_2: int32[4, 32] = aten.mul.Tensor(sum_dim_int_list, convert_element_type_default_1)
sub_tensor: int32[4, 32] = aten.sub.Tensor(_int_mm_default, mul_tensor_2)
mul_tensor_3: float32[4, 32] = aten.mul.Tensor(sub_tensor, div_tensor)
mul_tensor_4: float32[4, 32] = aten.mul.Tensor(mul_tensor_3, arg2_1)
reshape_default_1: float32[32] = aten.reshape(arg4_1, [32])
add_tensor_1: float32[4, 32] = aten.add.Tensor(mul_tensor_4, reshape_default_1)""",
        )

    def test_pt2e_per_token_asymmetric(self):
        text, report = lowered(PT2E(64, 32, asymmetric=True, bias=False), torch.randn(4, 64))
        self.assertEqual(report.entries[0].form, "qdq+asym+wzp")
        self.assertNotIn("quantized_decomposed", text)
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(convert_element_type_default_2, permute_default)
convert_element_type_default_3: int32[4, 1] = prims.convert_element_type(convert_element_type_default_1, int32)
sum_dim_int_list: int32[4, 1] = aten.sum.dim_IntList(convert_element_type_default_2, [1], True, dtype=int32)
reshape_default: int64[1, 32] = aten.reshape(arg3_1, [1, 32])
convert_element_type_default_4: int32[1, 32] = prims.convert_element_type(reshape_default, int32)
mul_tensor_2: int32[4, 32] = aten.mul.Tensor(sum_dim_int_list, convert_element_type_default_4)
sub_tensor_3: int32[4, 32] = aten.sub.Tensor(_int_mm_default, mul_tensor_2)
sum_dim_int_list_1: int32[32] = aten.sum.dim_IntList(arg1_1, [1], False, dtype=int32)
reshape_default_1: int32[1, 32] = aten.reshape(sum_dim_int_list_1, [1, 32])
mul_tensor_3: int32[4, 32] = aten.mul.Tensor(reshape_default_1, convert_element_type_default_3)
sub_tensor_4: int32[4, 32] = aten.sub.Tensor(sub_tensor_3, mul_tensor_3)
reshape_default_2: int64[1, 32] = aten.reshape(arg3_1, [1, 32])
convert_element_type_default_5: int32[1, 32] = prims.convert_element_type(reshape_default_2, int32)
mul_tensor_4: int32[4, 32] = aten.mul.Tensor(convert_element_type_default_5, convert_element_type_default_3)
mul_tensor_5: int32[4, 32] = aten.mul.Tensor(mul_tensor_4, 64)
add_tensor_4: int32[4, 32] = aten.add.Tensor(sub_tensor_4, mul_tensor_5)
convert_element_type_default_6: float32[4, 1] = prims.convert_element_type(convert_element_type_default, float32)
mul_tensor_6: float32[4, 32] = aten.mul.Tensor(add_tensor_4, convert_element_type_default_6)
mul_tensor_7: float32[4, 32] = aten.mul.Tensor(mul_tensor_6, arg2_1)""",
        )

    def test_torchao_int8_dynamic(self):
        """torchao picks s8s8 or (VNNI without AMX) u8s8 by CPU; both lower to s8s8 here (the expected text is
        the s8s8 spelling's, forced, so it holds on every CPU;
        tests/integrations/torchao/test_torchao_dynamic_int8.py runs both)."""
        import torchao.kernel.intmm as intmm

        model = torchao_linear(64, 32, bias=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(intmm, "_cpu_is_vnni_supported", lambda: False)
            text, report = lowered(model, torch.randn(2, 3, 64, dtype=torch.bfloat16))
        self.assertIn(report.entries[0].form, ("int_mm+u8s8+bias+nd", "int_mm+bias+nd"))
        self.assertNotIn("uint8", text)
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[6, 32] = aten._int_mm(reshape_default, permute_default)
mul_tensor: float32[6, 32] = aten.mul.Tensor(_int_mm_default, view_8)
mul_tensor_1: float32[6, 32] = aten.mul.Tensor(mul_tensor, view_9)
reshape_default_1: bfloat16[32] = aten.reshape(arg3_1, [32])
add_tensor: float32[6, 32] = aten.add.Tensor(mul_tensor_1, reshape_default_1)
convert_element_type_default: bfloat16[6, 32] = prims.convert_element_type(add_tensor, bfloat16)
reshape_default_2: bfloat16[2, 3, 32] = aten.reshape(convert_element_type_default, [2, 3, 32])""",
        )

    def test_dynamic_m(self):
        text, report = lowered(IntMMDivide(64, 32, bias=False), torch.randn(5, 64), dynamic=True)
        (d,) = report
        self.assertEqual(d.lowering, "aten._int_mm")
        self.assertIsInstance(d.shape[0], torch.SymInt)
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[s77, 32] = aten._int_mm(convert_element_type, permute_default)
mul_tensor: float32[s77, 32] = aten.mul.Tensor(_int_mm_default, div)
mul_tensor_1: float32[s77, 32] = aten.mul.Tensor(mul_tensor, arg3_1)""",
        )


class TestCpuU8S8(expecttest.TestCase):
    """VNNI CPUs without AMX: u8s8 from M=2 on (the shift fuses into the quantize, column sums compensate)."""

    @pytest.fixture(autouse=True)
    def _vnni(self, monkeypatch):
        monkeypatch.setenv("QLOWER_CPU_INT8_ISA", "vnni")

    def test_u8s8_with_compensation(self):
        text, report = lowered(IntMMDivide(4096, 32, bias=False), torch.randn(4, 4096))
        self.assertEqual(report.entries[0].lowering, "aten._int_mm.u8s8")
        self.assertExpectedInline(
            text[text.index("convert_element_type:") :],
            """\
convert_element_type: int8[4, 4096] = prims.convert_element_type(clamp_max, int8)
view_dtype: uint8[4, 4096] = aten.view.dtype(convert_element_type, uint8)
bitwise_xor_scalar: uint8[4, 4096] = aten.bitwise_xor.Scalar(view_dtype, 128)
permute_default: int8[4096, 32] = aten.permute(arg1_1, [1, 0])
_int_mm_default: int32[4, 32] = aten._int_mm(bitwise_xor_scalar, permute_default)
sum_dim_int_list: int32[32] = aten.sum.dim_IntList(arg1_1, [1], False, dtype=int32)
reshape_default: int32[1, 32] = aten.reshape(sum_dim_int_list, [1, 32])
mul_tensor: int32[1, 32] = aten.mul.Tensor(reshape_default, 128)
sub_tensor: int32[4, 32] = aten.sub.Tensor(_int_mm_default, mul_tensor)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(sub_tensor, div)
mul_tensor_2: float32[4, 32] = aten.mul.Tensor(mul_tensor_1, arg2_1)""",
        )

    def test_small_k_stays_s8s8_but_m1_never_does(self):
        _, report = lowered(IntMMDivide(64, 32, bias=False), torch.randn(4, 64))
        self.assertEqual(report.entries[0].lowering, "aten._int_mm")
        self.assertIn("K=64 < 4096: s8s8 measured faster", report.entries[0].passed_over_text)
        # s8s8 at M = 1 is wrong on these CPUs (tests/integrations/torchao/test_torchao_dynamic_int8.py)
        for k in (64, 4096):
            _, report = lowered(IntMMDivide(k, 32, bias=False), torch.randn(1, k))
            (d,) = report
            self.assertEqual(d.lowering, "aten._int_mm.u8s8")

    def test_asymmetric_on_u8s8(self):
        text, report = lowered(AsymInt32(4096, 32, bias=False), torch.randn(4, 4096))
        self.assertEqual(report.entries[0].lowering, "aten._int_mm.u8s8")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[4, 32] = aten._int_mm(bitwise_xor_scalar, permute_default)
add_tensor: int32[4, 1] = aten.add.Tensor(convert_element_type, 128)
sum_dim_int_list: int32[32] = aten.sum.dim_IntList(arg1_1, [1], False, dtype=int32)
reshape_default: int32[1, 32] = aten.reshape(sum_dim_int_list, [1, 32])
mul_tensor: int32[4, 32] = aten.mul.Tensor(reshape_default, add_tensor)
sub_tensor: int32[4, 32] = aten.sub.Tensor(_int_mm_default, mul_tensor)
mul_tensor_1: float32[4, 32] = aten.mul.Tensor(sub_tensor, clamp_min_1)
mul_tensor_2: float32[4, 32] = aten.mul.Tensor(mul_tensor_1, arg2_1)""",
        )


class TestRecord(expecttest.TestCase):
    def records(self, model, x):
        gm = trace_for_inductor(model, x)
        return dynamic_int8.find(gm.graph)

    def test_record_fields(self):
        (rec,) = self.records(IntMMDivide(64, 32), torch.randn(2, 3, 64))
        aq = rec.act_quant
        self.assertEqual((rec.m, rec.k, rec.n, rec.weight_layout), (6, 64, 32, "NK"))
        self.assertEqual((aq.scheme, aq.qmin, aq.qmax), ("per_token_symmetric", -127, 127))
        self.assertEqual(aq.prologue, "matched")
        self.assertIs(rec.x, aq.x_q)
        self.assertEqual(rec.compute_dtype, torch.float32)
        self.assertEqual(rec.out_shape, [2, 3, 32])

    def test_weight_layouts(self):
        (nk,) = self.records(Int32MM(64, 32), torch.randn(4, 64))
        (kn,) = self.records(Int32MM(64, 32, kn=True), torch.randn(4, 64))
        self.assertEqual((nk.weight_layout, nk.k, nk.n), ("NK", 64, 32))
        self.assertEqual((kn.weight_layout, kn.k, kn.n), ("KN", 64, 32))

    def test_asymmetric_record(self):
        (rec,) = self.records(PT2E(64, 32, asymmetric=True), torch.randn(4, 64))
        self.assertEqual(rec.act_quant.scheme, "per_token_asymmetric")
        self.assertIsNotNone(rec.act_quant.zero_point)
        self.assertTrue(rec.act_quant.quantized_decomposed)


class PerKScale(Form):
    """A weight scale per input channel K: not expressible as an int8 matmul's epilogue."""

    def forward(self, x):
        xq, sx = per_token(x)
        w = self.q.to(torch.float32) * self.s[:32].repeat(2)[None, :]
        return torch.mm(xq.to(torch.float32) * sx, w.t())


class PT2EAxisK(PT2E):
    def forward(self, x):
        qd = torch.ops.quantized_decomposed
        s, zp = qd.choose_qparams_per_token(x, torch.int8)
        xq = qd.quantize_per_token(x, s, zp, -128, 127, torch.int8)
        xd = qd.dequantize_per_token(xq, s, zp, -128, 127, torch.int8, torch.float32)
        wd = qd.dequantize_per_channel(self.q, self.s[:32].repeat(2), None, 1, -127, 127, torch.int8)
        return torch.nn.functional.linear(xd, wd)


class Uint8Activation(Form):
    def forward(self, xu8, sx):
        return torch._int_mm(xu8, self.q.t()) * sx * self.s


class IntOnly(Form):
    def forward(self, x):
        xq, _ = per_token(x)
        return torch._int_mm(xq, self.q.t())


class TestRejections(expecttest.TestCase):
    def reasons(self, model, *args):
        gm = trace_for_inductor(model, *args)
        report = apply_pass(gm, families=FAMILY)
        self.assertEqual(len(report.lowered), 0)
        return [d.reason for d in report]

    def test_per_k_weight_scale(self):
        self.assertEqual(
            self.reasons(PerKScale(64, 32), torch.randn(4, 64)), ["weight: scale is not per output channel"]
        )

    def test_pt2e_weight_dequantized_along_k(self):
        self.assertEqual(
            self.reasons(PT2EAxisK(64, 32), torch.randn(4, 64)),
            ["weight: weight dequantized per input channel (axis is K, not N)"],
        )

    def test_uint8_activation(self):
        xu8 = torch.randint(0, 255, (4, 64), dtype=torch.uint8)
        self.assertEqual(
            self.reasons(Uint8Activation(64, 32), xu8, torch.rand(4, 1)),
            ["activation: uint8 operand that is not a shifted int8 tensor"],
        )

    def test_int_only_matmul(self):
        self.assertEqual(
            self.reasons(IntOnly(64, 32), torch.randn(4, 64)),
            ["no per-token activation scale after the int matmul (an int-only matmul)"],
        )

    def test_woq_linear_is_not_a_candidate(self):
        from qlower.quantize import WeightOnlyInt8Linear

        model = WeightOnlyInt8Linear.from_linear(torch.nn.Linear(64, 32))
        gm = trace_for_inductor(model, torch.randn(4, 64))
        self.assertEqual(dynamic_int8.find(gm.graph), [])


class TestDevices(expecttest.TestCase):
    """CUDA rules (M > 16, K % 8, N % 8; the meta kernel checks none) and XPU (no rules), via fake devices."""

    def test_cuda_small_static_m_is_padded(self):
        text, report = lowered(IntMMDivide(64, 32, bias=False), torch.randn(8, 64), device="cuda")
        self.assertEqual(report.entries[0].lowering, "aten._int_mm")
        self.assertExpectedInline(
            after_matmul(text),
            """\
_int_mm_default: int32[17, 32] = aten._int_mm(constant_pad_nd_default, permute_default)
slice_tensor: int32[8, 32] = aten.slice.Tensor(_int_mm_default, 0, 0, 8)
mul_tensor: float32[8, 32] = aten.mul.Tensor(slice_tensor, div)
mul_tensor_1: float32[8, 32] = aten.mul.Tensor(mul_tensor, arg2_1)""",
        )

    def test_cuda_m_above_16_plain(self):
        text, report = lowered(IntMMDivide(64, 32, bias=False), torch.randn(32, 64), device="cuda")
        self.assertEqual(report.entries[0].lowering, "aten._int_mm")
        self.assertNotIn("constant_pad_nd", text)

    def test_cuda_dynamic_m_custom_op(self):
        text, report = lowered(
            IntMMDivide(64, 32, bias=False), torch.randn(5, 64), dynamic=True, device="cuda"
        )
        self.assertEqual(report.entries[0].lowering, "aten._int_mm")
        self.assertIn("qlower.int8_mm_min_m", text)

    def test_cuda_k_or_n_not_multiple_of_8_is_emulated(self):
        for k, n in ((60, 32), (64, 36)):
            text, report = lowered(IntMMDivide(k, n, bias=False), torch.randn(32, k), device="cuda")
            (d,) = report
            self.assertEqual(d.lowering, "int8_mm_emulated")
            self.assertIn(f"cuBLASLt int8 needs K % 8 == 0 and N % 8 == 0 (K={k}, N={n})", d.passed_over_text)
            self.assertNotIn("_int_mm", text)

    def test_cuda_explicit_aten_preference_cannot_be_honoured(self):
        with self.assertRaisesRegex(qlower.UnsupportedPlatformError, "K % 8 == 0"):
            lowered(
                IntMMDivide(60, 32, bias=False),
                torch.randn(32, 60),
                device="cuda",
                kernel_preference=qlower.KernelPreference.ATEN,
            )

    def test_xpu_int_mm_any_shape(self):
        text, report = lowered(IntMMDivide(60, 36, bias=False), torch.randn(8, 60), device="xpu")
        self.assertEqual(report.entries[0].lowering, "aten._int_mm")
        self.assertNotIn("constant_pad_nd", text)

    def test_emulated_chunks_long_k(self):
        text, report = lowered(
            IntMMDivide(2100, 16, bias=False),
            torch.randn(4, 2100),
            kernel_preference=qlower.KernelPreference.EMULATED,
        )
        self.assertEqual(report.entries[0].lowering, "int8_mm_emulated")
        self.assertExpectedInline(
            text[text.index("convert_element_type_default") :],
            """\
convert_element_type_default: float32[4, 2100] = prims.convert_element_type(convert_element_type, float32)
convert_element_type_default_1: float32[16, 2100] = prims.convert_element_type(arg1_1, float32)
constant_pad_nd_default: float32[4, 3072] = aten.constant_pad_nd(convert_element_type_default, [0, 972], 0.0)
constant_pad_nd_default_1: float32[16, 3072] = aten.constant_pad_nd(convert_element_type_default_1, [0, 972], 0.0)
reshape_default: float32[4, 3, 1024] = aten.reshape(constant_pad_nd_default, [-1, 3, 1024])
permute_default: float32[3, 4, 1024] = aten.permute(reshape_default, [1, 0, 2])
reshape_default_1: float32[16, 3, 1024] = aten.reshape(constant_pad_nd_default_1, [16, 3, 1024])
permute_default_1: float32[3, 1024, 16] = aten.permute(reshape_default_1, [1, 2, 0])
bmm_default: float32[3, 4, 16] = aten.bmm(permute_default, permute_default_1)
convert_element_type_default_2: int32[3, 4, 16] = prims.convert_element_type(bmm_default, int32)
sum_dim_int_list: int32[4, 16] = aten.sum.dim_IntList(convert_element_type_default_2, [0], False, dtype=int32)
mul_tensor: float32[4, 16] = aten.mul.Tensor(sum_dim_int_list, div)
mul_tensor_1: float32[4, 16] = aten.mul.Tensor(mul_tensor, arg2_1)""",
        )
