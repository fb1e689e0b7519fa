"""CUDA MX lowerings checked without a GPU: graphs of fake CUDA tensors, capability pinned per test.

No SM100 is available, so the `_scaled_mm` path is checked here on the emitted graph (its meta kernel
validates the swizzled e8m0 scale sizes, row-/column-major operands and K/N alignment) and on the H200 via
generated code (tests/lowerings/kernels/test_mx_gpu.py); it has not run on hardware.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from expecttest import TestCase
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import qlower
from qlower.lowerings.devices.cuda import override_cuda_capability
from qlower.patterns import mx_format as fmt
from qlower.testing import apply_pass, graph_summary

# The SM90 choices below include qlower's Triton MX kernels, which need Triton importable (a test extra).
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton not installed: its kernels are not candidates"
)

M, N, K = 64, 256, 128


def _dynamic_fp8(xq, xs, q, e):
    x = fmt.dequantize(xq, xs, "e4m3", torch.bfloat16)
    return F.linear(x, fmt.dequantize(q, e, "e4m3", torch.bfloat16))


def _weight_only_fp4(x, q, e):
    return F.linear(x, fmt.dequantize(q, e, "e2m1", torch.bfloat16))


def _fake_graph(fn, *specs):
    from torch._inductor.decomposition import select_decomp_table

    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in specs]
        return make_fx(fn, decomposition_table=select_decomp_table())(*args)


def dynamic_graph():
    return _fake_graph(
        _dynamic_fp8,
        ((M, K), torch.float8_e4m3fn),
        ((M, K // 32), torch.uint8),
        ((N, K), torch.float8_e4m3fn),
        ((N, K // 32), torch.float8_e8m0fnu),
    )


def lower(gm, capability, preference="AUTO"):
    with override_cuda_capability(capability):
        return apply_pass(gm, families=("mx",), kernel_preference=qlower.KernelPreference[preference])


def _ops(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


class ScaledMM(TestCase):
    def test_sm100_emits_scaled_mm_with_swizzled_e8m0_scales(self):
        gm = dynamic_graph()
        report = lower(gm, (10, 0))
        self.assertEqual([d.lowering for d in report], ["aten._scaled_mm.mx"])
        tail = graph_summary(gm).splitlines()
        self.assertExpectedInline(
            "\n".join(tail[-10:]),
            """\
view_dtype_4: float8_e8m0fnu[512] = aten.view.dtype(reshape_default_2, float8_e8m0fnu)
view_dtype_5: uint8[256, 4] = aten.view.dtype(e_1, uint8)
reshape_default_3: uint8[256, 4] = aten.reshape(view_dtype_5, [-1, 4])
constant_pad_nd_default_1: uint8[256, 4] = aten.constant_pad_nd(reshape_default_3, [0, 0, 0, 0], 0)
reshape_default_4: uint8[2, 4, 32, 1, 4] = aten.reshape(constant_pad_nd_default_1, [-1, 4, 32, 1, 4])
permute_default_2: uint8[2, 1, 32, 4, 4] = aten.permute(reshape_default_4, [0, 3, 2, 1, 4])
clone_default_1: uint8[2, 1, 32, 4, 4] = aten.clone(permute_default_2, memory_format=torch.contiguous_format)
reshape_default_5: uint8[1024] = aten.reshape(clone_default_1, [-1])
view_dtype_6: float8_e8m0fnu[1024] = aten.view.dtype(reshape_default_5, float8_e8m0fnu)
_scaled_mm_default: bfloat16[64, 256] = aten._scaled_mm(view_dtype_1, permute_default, view_dtype_4, view_dtype_6, None, None, bfloat16)""",
        )

    def test_emitted_swizzle_is_to_blocked(self):
        """Run the emitted scale swizzle on real codes: it must equal the reference 128x4 tiling."""
        gm = dynamic_graph()
        lower(gm, (10, 0))
        mm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten._scaled_mm.default)
        codes = torch.randint(0, 255, (N, K // 32), dtype=torch.uint8)
        env = {}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = codes if node.name.startswith("e") else None
            elif node.op == "call_function" and _depends_only_on(node, env):
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.get)
                kwargs = {k: (torch.device("cpu") if k == "device" else v) for k, v in kwargs.items()}
                env[node] = node.target(*args, **kwargs)
        got = env[mm.args[3]].view(torch.uint8)
        self.assertTrue(torch.equal(got, fmt.to_swizzled(codes)))

    @needs_triton
    def test_weight_only_goes_to_triton_even_on_sm100(self):
        gm = _fake_graph(
            _weight_only_fp4,
            ((1, K), torch.bfloat16),
            ((N, K // 2), torch.uint8),
            ((N, K // 32), torch.uint8),
        )
        report = lower(gm, (10, 0))
        (d,) = report
        self.assertEqual(d.lowering, "triton.mx_linear")
        self.assertIn("_scaled_mm needs both operands MX-quantized", d.passed_over_text)


def _depends_only_on(node, env) -> bool:
    return all(n in env and env[n] is not None for n in node.all_input_nodes)


@needs_triton
def test_aten_preference_on_sm90_is_a_clear_compile_time_error():
    with pytest.raises(qlower.UnsupportedPlatformError) as info:
        lower(dynamic_graph(), (9, 0), "ATEN")
    msg = str(info.value)
    assert "family=mx" in msg and "kernel_preference=ATEN" in msg
    assert "capability >= 10.0; this device's is 9.0" in msg
    assert "Preferences that work here: AUTO, EMULATED, TRITON" in msg


@needs_triton
def test_sm90_auto_dynamic_large_m_emulates_and_triton_preference_forces_kernels():
    report = lower(dynamic_graph(), (9, 0))
    assert [d.lowering for d in report] == ["mx_dequant_mm"]
    assert "measured at 0.15x bf16" in report.entries[0].passed_over_text
    gm = dynamic_graph()
    report = lower(gm, (9, 0), "TRITON")
    assert [d.lowering for d in report] == ["triton.mx_linear"]
    hops = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert len(hops) == 1 and hops[0].kwargs["kwargs"]["FP8_MMA"] is True


@needs_triton
def test_old_gpus_emulate():
    report = lower(dynamic_graph(), (8, 0))
    (d,) = report
    assert d.lowering == "mx_dequant_mm" and "Triton fp8 needs capability >= 8.9" in d.passed_over_text


@needs_triton
def test_sm90_auto_weight_only_above_decode_sizes_emulates():
    """Weight-only MX: MXFP4 with bf16 x stays on the Triton op at every M (`mx_bf16`'s tiles, then its
    dequantize + cuBLAS: BENCHMARKS.md "MXFP4 weight-only"); other activations get the decode kernels up to
    M=16 and the emulation above (the tile kernel measured slower)."""

    def graph(m, dtype=torch.bfloat16):
        return _fake_graph(
            _weight_only_fp4,
            ((m, K), dtype),
            ((N, K // 2), torch.uint8),
            ((N, K // 32), torch.uint8),
        )

    for m in (16, 17, 300):
        assert [d.lowering for d in lower(graph(m), (9, 0))] == ["triton.mx_linear"], m
    assert [d.lowering for d in lower(graph(16, torch.float16), (9, 0))] == ["triton.mx_linear"]
    (d,) = lower(graph(17, torch.float16), (9, 0))
    assert d.lowering == "mx_dequant_mm" and "weight-only MX with M=17 > 16" in d.passed_over_text
    assert [d.lowering for d in lower(graph(128), (9, 0), "TRITON")] == ["triton.mx_linear"]
