"""Expect-tests for the MX recognizer: every graph form becomes one record (or a rejection with a reason).

Graphs are traced exactly as qlower's pass receives them (no codegen). Forms: hand-written dequantizations
(e8m0 `.float()`, `2 ** (e - 127)`, `exp2` + `repeat_interleave`, an fp4 lookup table with transposed
scale storage, fp4 bit arithmetic with bias and 3-D input) and torchao's EMULATED MXFP8 / MXFP4 with FLOOR and
RCEIL scales (swizzled weight scales, in-graph activation quantization).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase

from qlower.passes.canonicalize import einsum_to_mm
from qlower.patterns import mx, mx_verify
from qlower.patterns.mx_format import E2M1_VALUES
from qlower.patterns.record import Rejection
from qlower.testing import apply_pass, graph_summary
from tests.forms import mx as mm

N, K = 48, 64


def summary(cands) -> str:
    out = []
    for c in cands:
        if isinstance(c, Rejection):
            out.append(f"rejected: {c.reason}")
            continue
        line = (
            f"{c.form} MKN={tuple(c.shape)} w={c.weight.name}:{c.weight_layout} "
            f"w_scale={c.weight_scale.name}:{c.weight_mx.scale_layout} out={c.out_dtype}"
        )
        if c.bias is not None:
            line += f" bias={c.bias.name}"
        if c.act_quant:
            a = c.act_quant
            xf = a.x_float.name if a.x_float is not None else None
            line += (
                f"\n  act x_q={a.x_q.name} x_scale={a.x_scale.name}:{a.mx.scale_layout} "
                f"rounding={a.rounding} x_float={xf}"
            )
        out.append(line)
    return "\n".join(out) or "no candidate"


def find_form(name: str) -> str:
    f = mm.hand_written_forms(N, K)[name]
    graph = mm.trace(f, *mm.form_inputs(name, N, K)).graph
    einsum_to_mm(graph)  # as the pass does before matching
    return summary(mx.find(graph))


class HandWrittenForms(TestCase):
    def test_e8m0_float(self):
        self.assertExpectedInline(
            find_form("e8m0_float"),
            """weight_only+e4m3+w_scale_plain+mm MKN=(5, 64, 48) w=arg0_1:NK w_scale=arg1_1:plain out=torch.bfloat16""",
        )

    def test_pow2_fp32_matmul(self):
        self.assertExpectedInline(
            find_form("pow2_fp32_matmul"),
            """weight_only+e4m3+w_scale_plain+mm MKN=(5, 64, 48) w=arg0_1:NK w_scale=arg1_1:plain out=torch.bfloat16""",
        )

    def test_exp2_repeat_interleave(self):
        self.assertExpectedInline(
            find_form("exp2_repeat_interleave"),
            """weight_only+e4m3+w_scale_plain+mm MKN=(5, 64, 48) w=arg1_1:NK w_scale=arg0_1:plain out=torch.bfloat16""",
        )

    def test_fp4_table_scale_transposed(self):
        self.assertExpectedInline(
            find_form("fp4_table_scale_t"),
            """weight_only+e2m1+w_scale_plain_t+mm MKN=(5, 64, 48) w=arg0_1:NK w_scale=arg1_1:plain_t out=torch.bfloat16""",
        )

    def test_fp4_table_moved_to_the_device(self):
        self.assertExpectedInline(
            find_form("fp4_table_moved"),
            """weight_only+e2m1+w_scale_plain+mm MKN=(5, 64, 48) w=arg0_1:NK w_scale=arg1_1:plain out=torch.bfloat16""",
        )

    def test_e8m0_einsum(self):
        self.assertExpectedInline(
            find_form("e8m0_einsum"),
            """weight_only+e4m3+w_scale_plain+mm MKN=(5, 64, 48) w=arg0_1:NK w_scale=arg1_1:plain out=torch.bfloat16""",
        )

    def test_fp4_bits_bias_3d(self):
        self.assertExpectedInline(
            find_form("fp4_bits_bias_3d"),
            """weight_only+e2m1+w_scale_plain+addmm+bias+nd MKN=(5, 64, 48) w=arg1_1:NK w_scale=arg2_1:plain out=torch.bfloat16 bias=full""",
        )

    def test_wrong_exponent_bias_is_not_mx(self):
        """2 ** (e - 128) is not an e8m0 decode: the probe catches it, the linear is left alone with where."""

        def f(x, q, e):
            w = (q.float().view(N, K // 32, 32) * 2 ** (e.float() - 128)[..., None]).view(N, K)
            return F.linear(x, w.to(x.dtype))

        x, q, e = mm.form_inputs("pow2_fp32_matmul", N, K)
        self.assertExpectedInline(
            summary(mx.find(mm.trace(f, x, q, e).graph)),
            """rejected: scale decode differs from e8m0 at code 1 (5.87747e-39 where e8m0 is 1.17549e-38)""",
        )

    def test_high_nibble_first_is_recognized(self):
        """A decode taking the even element from the high nibble: recognized, the order kept in the record."""

        def f(x, q, e):
            lut = torch.tensor(E2M1_VALUES, device=q.device)
            vals = lut[torch.stack([q >> 4, q & 15], -1).view(N, K).long()]
            s = torch.exp2(e.float() - 127)
            return F.linear(x, (vals.view(N, K // 32, 32) * s[..., None]).view(N, K).to(x.dtype))

        x, q, e = mm.form_inputs("fp4_bits_bias_3d", N, K)
        (rec,) = mx.find(mm.trace(f, x.view(-1, K), q, e).graph)
        self.assertEqual(rec.weight_mx.nibbles, "high_first")
        self.assertEqual(rec.form, "weight_only+e2m1+w_scale_plain+mm+high_nibble_first")

    def test_k_not_multiple_of_32_is_a_partial_block(self):
        k = 48

        def f(x, q, e):
            s = torch.exp2(e.float() - 127).repeat_interleave(32, dim=1)[:, :k]
            return F.linear(x, (q.float() * s).to(x.dtype))

        q = torch.randn(N, k).to(torch.float8_e4m3fn)
        e = torch.randint(120, 130, (N, 2), dtype=torch.uint8)
        x = torch.randn(5, k, dtype=torch.bfloat16)
        self.assertExpectedInline(
            summary(mx.find(mm.trace(f, x, q, e).graph)),
            """weight_only+e4m3+w_scale_plain+mm+partial_block MKN=(5, 48, 48) w=arg1_1:NK w_scale=arg0_1:plain out=torch.bfloat16""",
        )

    def test_dynamic_m(self):
        f = mm.hand_written_forms(N, K)["pow2_fp32_matmul"]
        x, q, e = mm.form_inputs("pow2_fp32_matmul", N, K)
        torch._dynamo.mark_dynamic(x, 0)
        gm = mm.trace(f, x, q, e)
        (rec,) = mx.find(gm.graph)
        self.assertIsInstance(rec.m, torch.SymInt)
        self.assertEqual((rec.k, rec.n), (K, N))

    def test_large_weight_probe_is_shrunk(self):
        """A 4096 x 4096 fp4 weight: the probe runs on a few rows, so recognition stays fast (checked by the
        rows each probe call evaluates, not by a clock a loaded machine can trip)."""
        from unittest import mock

        f = mm.hand_written_forms(4096, 4096)["fp4_bits_bias_3d"]
        x, q, e = mm.form_inputs("fp4_bits_bias_3d", 4096, 4096, m=2)
        gm = mm.trace(f, x, q, e)
        rows_run: list[int] = []
        real_call = mx_verify._Probe.__call__

        def spy(probe, *args):
            rows_run.append(probe.r)
            return real_call(probe, *args)

        with mock.patch.object(mx_verify._Probe, "__call__", spy):
            (rec,) = mx.find(gm.graph)
        self.assertEqual(rec.weight_mx.elem, "e2m1")
        self.assertTrue(rows_run and max(rows_run) <= 64, rows_run)


@pytest.mark.parametrize("elem", ["e4m3", "e2m1"])
@pytest.mark.parametrize("mode,bias", [("FLOOR", False), ("RCEIL", True)])
def test_torchao_emulated(elem, mode, bias):
    pytest.importorskip("torchao.prototype.mx_formats")
    m = mm.torchao_mx_model(elem, bias=bias, mode=mode)
    (rec,) = mx.find(mm.trace(m, torch.randn(2, 3, 64, dtype=torch.bfloat16)).graph)
    form = f"dynamic+{elem}x{elem}+w_scale_swizzled+{'addmm+bias' if bias else 'mm'}+nd"
    assert rec.form == form
    assert rec.weight_mx.scale_layout == "swizzled" and rec.act_quant.mx.scale_layout == "plain"
    assert rec.act_quant.rounding == mode.lower()
    assert rec.out_shape == [2, 3, 48] and (rec.m, rec.k, rec.n) == (6, 64, 48)


class EmittedGraph(TestCase):
    def test_cpu_emulation_graph(self):
        """What the CPU lowering emits for the e8m0 form: the e8m0 bytes copied out as uint8 by an extern op
        (C++ codegen has no e8m0 type), decoded from their bits, one fused dequant, then the bf16 mm."""
        f = mm.hand_written_forms(N, K)["e8m0_float"]
        gm = mm.trace(f, *mm.form_inputs("e8m0_float", N, K))
        report = apply_pass(gm, families=("mx",))
        self.assertEqual([d.lowering for d in report], ["mx_dequant_mm"])
        self.assertExpectedInline(
            graph_summary(gm),
            """\
convert_element_type_default: float32[48, 64] = prims.convert_element_type(arg0_1, float32)
reshape_default: float32[48, 2, 32] = aten.reshape(convert_element_type_default, [-1, 2, 32])
mx_bytes_default: uint8[48, 2] = qlower.mx_bytes(arg1_1)
convert_element_type_default_1: int32[48, 2] = prims.convert_element_type(mx_bytes_default, int32)
bitwise_left_shift_tensor_scalar: int32[48, 2] = aten.bitwise_left_shift.Tensor_Scalar(convert_element_type_default_1, 23)
eq_scalar: bool[48, 2] = aten.eq.Scalar(convert_element_type_default_1, 0)
scalar_tensor_default: int32[] = aten.scalar_tensor(4194304, dtype=int32, device=device(type='cpu'))
where_self: int32[48, 2] = aten.where.self(eq_scalar, scalar_tensor_default, bitwise_left_shift_tensor_scalar)
view_dtype: float32[48, 2] = aten.view.dtype(where_self, float32)
scalar_tensor_default_1: float32[] = aten.scalar_tensor(nan, dtype=float32, device=device(type='cpu'))
eq_scalar_1: bool[48, 2] = aten.eq.Scalar(convert_element_type_default_1, 255)
where_self_1: float32[48, 2] = aten.where.self(eq_scalar_1, scalar_tensor_default_1, view_dtype)
reshape_default_1: float32[48, 2] = aten.reshape(where_self_1, [-1, 2])
reshape_default_2: float32[48, 2, 1] = aten.reshape(reshape_default_1, [-1, 2, 1])
mul_tensor: float32[48, 2, 32] = aten.mul.Tensor(reshape_default, reshape_default_2)
reshape_default_3: float32[48, 64] = aten.reshape(mul_tensor, [-1, 64])
convert_element_type_default_2: bfloat16[48, 64] = prims.convert_element_type(reshape_default_3, bfloat16)
permute_default: bfloat16[64, 48] = aten.permute(convert_element_type_default_2, [1, 0])
mm_default: bfloat16[5, 48] = aten.mm(arg2_1, permute_default)""",
        )


@pytest.mark.parametrize("name", ["e8m0_float", "exp2_repeat_interleave"])
def test_decode_matvec_decomposition_is_recognized(name):
    """On GPUs with coordinate_descent_tuning on (torchao's quantize_ sets it process-wide) Inductor
    decomposes an M == 1 mm into (x[:, :, None] * w[None]).sum(1) before qlower's pass: still one MX record,
    and the rewritten graph computes the same numbers as the traced one."""
    from tests.helpers.fake_gpu_trace import fake_cuda_trace

    fn = mm.hand_written_forms(N, K)[name]
    x, q, e = mm.form_inputs(name, N, K, m=1)
    gm = fake_cuda_trace(fn, x, q, e)
    assert "aten.sum" in graph_summary(gm)
    (cand,) = mx.find(gm.graph)
    assert not isinstance(cand, Rejection), cand
    assert cand.form.startswith("weight_only") and "matvec" in cand.form, cand.form
    assert cand.shape == (1, K, N)


def _pow2_linears(biases: list[int]):
    """Linears of one shape, each decoding its fp8 weight as q * 2 ** (e - bias): MX where bias is 127."""

    def f(x, q, e):
        outs = []
        for b in biases:
            w = (q.float().view(48, 2, 32) * 2 ** (e.float() - b)[..., None]).view(48, 64)
            outs.append(F.linear(x, w.to(x.dtype)))
        return outs

    return f


def test_decode_verified_once_per_structure(monkeypatch):
    """A graph's decodes of one structure are probed once (`mx_verify.verify`, keyed by `structure_key`); a
    decode that differs only in a constant (a bias of 126: not e8m0) is probed apart and keeps its own verdict."""
    probes = []
    original = mx_verify._verify_probes

    def counted(*args, **kw):
        probes.append(1)
        return original(*args, **kw)

    monkeypatch.setattr(mx_verify, "_verify_probes", counted)
    x, q, e = mm.form_inputs("pow2_fp32_matmul", 48, 64)
    found = {}
    for biases in ([127, 127, 127, 126], [126]):
        probes.clear()
        f = _pow2_linears(biases)
        decisions = apply_pass(mm.trace(f, x, q, e), families=["mx"])
        found[len(biases)] = (len(probes), sorted((d.lowered, d.reason or "") for d in decisions))
    probed, rows = found[4]
    assert probed == 2, rows
    assert [lowered for lowered, _ in rows].count(True) == 3, rows
    assert found[1] == (1, [(False, found[1][1][0][1])]) and "scale" in found[1][1][0][1], found[1]
    assert [r for lowered, r in rows if not lowered] == [found[1][1][0][1]], (rows, found[1])
