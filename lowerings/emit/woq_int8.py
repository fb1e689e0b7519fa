"""Emitters for woq-int8 records: the ATen packed kernel, a guarded choice by M, fused dequant + mm, and
qlower's CPU GEMM with the conversion inside its K loop.

These say *how* to build each kernel call; which device uses which (and when) is decided in the per-device
modules through `supports` rules.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from qlower.lowerings.emit.common import finish, scale_epilogue, scale_fits, scale_vector, weight_nk
from qlower.lowerings.graph import inductor_fixes
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.kernels import custom_ops
from qlower.lowerings.kernels.cpu_scratch import int8_scaled_weight_mm
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.scale_facts import product_dtype, scale_on_weight
from qlower.patterns.graph_utils import aten, known_eq, tensor_val
from qlower.patterns.record import QuantLinear


def _kernel_scale(em: Emitter, rec: QuantLinear) -> tuple[fx.Node, bool]:
    """(the [N] scale for a kernel that takes it in x's dtype, whether the scale still has to be applied).

    Such a kernel multiplies its fp32 accumulator by that scale and rounds once to x's dtype. A scale that x's
    dtype cannot hold exactly (an fp32 scale next to fp16 x, a Python 1e5 or 0.1) would be rounded, or
    overflow, first; and the graph's product is then wider than x's dtype (fp32 for fp32 scales), which the
    kernel's output is not. Such a kernel gets ones and `scale_epilogue` applies the scale to its output in
    fp32: the graph's own arithmetic, `mm` rounded to x's dtype, then times the scale.
    """
    if scale_fits(rec, rec.compute_dtype):
        return scale_vector(em, rec, rec.compute_dtype), False
    ones = em.call(
        aten.full.default, [rec.n], 1.0, dtype=rec.compute_dtype, device=rec.device, pin_memory=False
    )
    return ones, True


def _scaled(em: Emitter, rec: QuantLinear, core: fx.Node, after: bool) -> fx.Node:
    return scale_epilogue(em, rec, core) if after else core


def emit_int8pack_mm(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """aten._weight_int8pack_mm(x [M, K], w [N, K] int8, scale [N]) with scale in x's dtype."""
    inductor_fixes.fix_int8pack_lowering()
    em = Emitter(graph, rec.output)
    scale, after = _kernel_scale(em, rec)
    core = em.call(aten._weight_int8pack_mm.default, em.contiguous(rec.x), weight_nk(em, rec), scale)
    return finish(em, rec, _scaled(em, rec, core, after))


def make_emit_int8pack_by_m(max_m_packed: int):
    """Dynamic M: one op that runs the packed kernel for M <= max_m_packed and dequant + mm above it."""

    def emit(
        graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
    ) -> fx.Node:
        em = Emitter(graph, rec.output)
        scale, after = _kernel_scale(em, rec)
        core = em.call(
            custom_ops.woq_int8_mm_by_m, em.contiguous(rec.x), weight_nk(em, rec), scale, max_m_packed
        )
        return finish(em, rec, _scaled(em, rec, core, after))

    return emit


def _weight_scale_for_dequant(em: Emitter, rec: QuantLinear, dtype: torch.dtype):
    """The scale shaped to multiply the stored weight: [N, 1] for [N, K], [N] for [K, N], scalar if per tensor.

    Uses -1 rather than N so symbolic weight shapes work too.
    """
    s = rec.weight_scale
    if s is None or isinstance(s, (int, float)):
        return s
    v = tensor_val(s)
    s = em.convert(s, dtype)
    if v is not None and v.numel() == 1:
        return em.reshape(s, [])
    return em.reshape(s, [-1, 1] if rec.weight_layout == "NK" else [-1])


def _dequantized_weight(em: Emitter, rec: QuantLinear) -> fx.Node:
    """The weight the matmul of the graph reads, in the compute dtype: w.to(dtype), times the scale where the
    graph scales the weight (exact product in fp32, rounded once to the graph's product dtype, as eager)."""
    if rec.weight_scale is None or not scale_on_weight(rec):
        # int8 -> fp32 -> compute dtype (exact, one fused kernel): Inductor's own woq rewrite matches
        # `mm(x, convert(w_int8).t())` followed by a `mul` even when a view that splits N sits between (a
        # per-head scale) and then fails to lower; it does not match a weight converted from fp32
        # (tests/end_to_end/test_epilogue_forms.py::test_woq_scale_after_split_view_compiles)
        return em.convert(em.convert(rec.weight, torch.float32), rec.compute_dtype)
    out = product_dtype(rec)
    wide = torch.promote_types(out, torch.float32)
    deq = em.call(aten.mul.Tensor, em.convert(rec.weight, wide), _weight_scale_for_dequant(em, rec, wide))
    return em.convert(em.convert(deq, out), rec.compute_dtype)


def emit_dequant_mm(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """mm(x, dequant(w)) with the scale where the graph puts it: one fused pointwise dequant, a float matmul.

    Output scale (`F.linear(x, w.to(x.dtype)) * s`): the exact int8 -> float weight, then the scale on the
    matmul result (`scale_epilogue`). Folding it into a low-precision weight would change the numbers: w * s
    overflows fp16 for |s| > 516 where (x @ w.T) * s need not, and rounds bf16 weights
    (tests/lowerings/emit/test_dequant_range.py). Weight scale (`F.linear(x, w.to(x.dtype) * s)`): the scaled
    weight, as the graph rounds it.
    """
    em = Emitter(graph, rec.output)
    deq = _dequantized_weight(em, rec)
    w_kn = em.transpose(deq) if rec.weight_layout == "NK" else deq
    core = em.call(aten.mm.default, rec.x, w_kn)
    if not scale_on_weight(rec):
        core = scale_epilogue(em, rec, core)
    return finish(em, rec, core)


def emit_int8_weight_mm(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """`qlower::int8_weight_mm` (x @ w.to(x.dtype), the float weight in a reused CPU buffer), then the scale,
    bias and output dtype in the fused epilogue: the gpt-fast form's own arithmetic, mm then scale. A graph
    that scales the weight gets `qlower::int8_scaled_weight_mm`: its scaled weight, rounded as it rounds it."""
    em = Emitter(graph, rec.output)
    x, kn = em.contiguous(rec.x), rec.weight_layout == "KN"
    if rec.weight_scale is None or not scale_on_weight(rec):
        core = em.call(custom_ops.int8_weight_mm, x, rec.weight, kn)
        return finish(em, rec, scale_epilogue(em, rec, core))
    out = product_dtype(rec)
    wide = torch.promote_types(out, torch.float32)
    s = _weight_scale_for_dequant(em, rec, wide)
    if isinstance(s, (int, float)):
        s = em.call(aten.scalar_tensor.default, float(s), dtype=wide, device=rec.device)
    core = em.call(int8_scaled_weight_mm, x, rec.weight, em.contiguous(s), kn, out)
    return finish(em, rec, core)


def _fused_bias(em: Emitter, rec: QuantLinear, core_dtype: torch.dtype) -> fx.Node | None:
    """The bias as an [N] operand of `qlower::woq_int8_gemm`, where adding it in the kernel (fp32, rounded to
    the output dtype) is what `finish` computes: the output already has the kernel's dtype, and the bias
    does not widen it. Else None: `finish` adds it after the kernel."""
    if rec.bias is None or rec.out_dtype != core_dtype:
        return None
    bv = tensor_val(rec.bias)
    if bv is None or bv.numel() != rec.n or torch.promote_types(bv.dtype, core_dtype) != core_dtype:
        return None
    return rec.bias if bv.dim() == 1 else em.reshape(rec.bias, [rec.n])


_WOQ_GEMM_SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _woq_gemm_scale(em: Emitter, rec: QuantLinear) -> fx.Node:
    """The scale operand of `qlower::woq_int8_gemm`: the graph's own [N] tensor as a view where its dtype is
    one the kernel reads (it widens it to fp32 itself, exactly), so no conversion kernel runs before each call;
    else `scale_vector`'s fp32 copy, which Inductor runs as a kernel of its own before every call
    (tests/lowerings/kernels/test_cpu_woq_gemm.py checks the generated code has none)."""
    v = tensor_val(rec.weight_scale) if isinstance(rec.weight_scale, fx.Node) else None
    if v is None or v.dtype not in _WOQ_GEMM_SCALE_DTYPES or not known_eq(v.numel(), rec.n):
        return scale_vector(em, rec, torch.float32)
    return rec.weight_scale if v.dim() == 1 else em.reshape(rec.weight_scale, [rec.n])


def emit_woq_int8_gemm(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """`qlower::woq_int8_gemm` (lowerings/kernels/csrc/woq_gemm.cpp): the int8 weight converted inside the
    GEMM's K loop, in the graph's own arithmetic. Output scale (`F.linear(x, w.to(x.dtype)) * s`): the fp32 sums
    rounded to x's dtype, then times the scale in fp32, rounded to the graph's product dtype. Weight scale
    (`F.linear(x, w.to(x.dtype) * s)`): the kernel rounds `w * s` as the graph does (inf in fp16 where the
    graph's weight is). A [K, N] weight is passed as its transposed view (the kernel reads either layout).

    Builds and loads the in-process kernel library now (lowerings/kernels/native.py), so the first call does
    not pay the build."""
    from qlower.lowerings.kernels import native

    native.ops()
    em = Emitter(graph, rec.output)
    w_nk = rec.weight if rec.weight_layout == "NK" else em.transpose(rec.weight)
    on_weight = rec.weight_scale is not None and scale_on_weight(rec)
    scale = None if rec.weight_scale is None else _woq_gemm_scale(em, rec)
    core_dtype = rec.compute_dtype if rec.weight_scale is None or on_weight else product_dtype(rec)
    bias = _fused_bias(em, rec, core_dtype)
    core = em.call(custom_ops.woq_int8_gemm, rec.x, w_nk, scale, bias, on_weight, core_dtype)
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)
