"""Emitters for woq-int8 records: the ATen packed kernel, a guarded choice by M, and fused dequant + mm.

These say *how* to build each kernel call; which device uses which (and when) is decided in the per-device
modules through `supports` rules.
"""

from __future__ import annotations

import torch
from torch import fx

from qlower.patterns.graph_utils import aten, tensor_val
from qlower.patterns.record import QuantLinear

from . import custom_ops, inductor_fixes
from .emit import Emitter, finish, scale_vector, weight_nk


def _kernel_scale(em: Emitter, rec: QuantLinear) -> tuple[fx.Node, fx.Node | None]:
    """(the [N] scale a kernel taking it in x's dtype applies, the scale to multiply its output by, or None).

    Such a kernel would round a wider scale (fp32 next to bf16 x) to bf16, one more rounding than eager's
    (mm rounded to x's dtype, then times the fp32 scale: the output is fp32). For a wider scale the kernel
    gets ones and the scale multiplies its output in the wider dtype, which is eager's own arithmetic.
    """
    sv = tensor_val(rec.weight_scale) if isinstance(rec.weight_scale, fx.Node) else None
    wide = sv is not None and torch.promote_types(sv.dtype, rec.compute_dtype) != rec.compute_dtype
    if not wide:
        return scale_vector(em, rec, rec.compute_dtype), None
    ones = em.call(
        aten.full.default, [rec.n], 1.0, dtype=rec.compute_dtype, device=rec.device, pin_memory=False
    )
    return ones, scale_vector(em, rec, torch.promote_types(sv.dtype, rec.compute_dtype))


def _scaled(em: Emitter, core: fx.Node, after: fx.Node | None) -> fx.Node:
    return core if after is None else em.call(aten.mul.Tensor, core, after)


def emit_int8pack_mm(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    """aten._weight_int8pack_mm(x [M, K], w [N, K] int8, scale [N]) with scale in x's dtype."""
    inductor_fixes.fix_int8pack_lowering()
    em = Emitter(graph, rec.output)
    scale, after = _kernel_scale(em, rec)
    core = em.call(aten._weight_int8pack_mm.default, em.contiguous(rec.x), weight_nk(em, rec), scale)
    return finish(em, rec, _scaled(em, core, after))


def make_emit_int8pack_by_m(max_m_packed: int):
    """Dynamic M: one op that runs the packed kernel for M <= max_m_packed and dequant + mm above it."""

    def emit(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
        em = Emitter(graph, rec.output)
        scale, after = _kernel_scale(em, rec)
        core = em.call(
            custom_ops.woq_int8_mm_by_m, em.contiguous(rec.x), weight_nk(em, rec), scale, max_m_packed
        )
        return finish(em, rec, _scaled(em, core, after))

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


def emit_dequant_mm(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    """mm(x, (w.to(s.dtype) * s).to(x.dtype)): one fused pointwise dequant feeding a float matmul.

    The scale is applied to the weight (in the wider of the scale's and the activation's dtype, so fp32
    scales lose nothing), which also keeps the result out of reach of Inductor's own woq rewrite (it only
    matches `mm(...) * scale`).
    """
    em = Emitter(graph, rec.output)
    sv = tensor_val(rec.weight_scale)
    sdtype = torch.promote_types(sv.dtype if sv is not None else rec.compute_dtype, rec.compute_dtype)
    scale = _weight_scale_for_dequant(em, rec, sdtype)
    deq = em.convert(rec.weight, sdtype)
    if scale is not None:
        deq = em.call(aten.mul.Tensor, deq, scale)
    deq = em.convert(deq, rec.compute_dtype)
    w_kn = em.transpose(deq) if rec.weight_layout == "NK" else deq
    core = em.call(aten.mm.default, rec.x, w_kn)
    return finish(em, rec, core)


def emit_int8_weight_mm(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    """`qlower::int8_weight_mm` (x @ w.to(x.dtype), the float weight in a reused CPU buffer), then the scale,
    bias and output dtype in the fused epilogue: the gpt-fast form's own arithmetic, mm then scale."""
    em = Emitter(graph, rec.output)
    core = em.call(custom_ops.int8_weight_mm, em.contiguous(rec.x), rec.weight, rec.weight_layout == "KN")
    if rec.weight_scale is not None:
        sv = tensor_val(rec.weight_scale)
        sdtype = torch.promote_types(sv.dtype if sv is not None else rec.compute_dtype, rec.compute_dtype)
        core = em.call(aten.mul.Tensor, core, scale_vector(em, rec, sdtype))
    return finish(em, rec, core)
