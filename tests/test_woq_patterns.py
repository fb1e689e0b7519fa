"""Expect-tests of the graph after qlower's pass, per woq-int8 graph form (traced, no codegen)."""

from __future__ import annotations

import expecttest
import torch
from woq_models import WoqLinear

import qlower
from qlower.testing import apply_pass, graph_summary, trace_for_inductor

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
        text, report = lowered(WoqLinear(64, 32, BF16), torch.randn(256, 64, dtype=BF16))
        self.assertEqual(report.entries[0].lowering, "dequant_mm")
        self.assertIn("M=256 > 8", report.entries[0].reason)
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
        self.assertIn("K % 16 == 0 (K=24)", report.entries[0].reason)
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
        self.assertIn("symbolic", report.entries[0].reason)
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
