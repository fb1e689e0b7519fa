"""How a woq-int8 record becomes a call of qlower's CUTLASS W8A16 GEMM (`qlower::woq_int8_cutlass`), and an
MXFP4 weight-only record one of its MXFP4 GEMM (`qlower::mxfp4_cutlass`). When they are chosen is
`lowerings/devices/cuda_cutlass.py` (`WOQ_INT8_CUTLASS`, `MXFP4_CUTLASS`).

A static M (or an explicit CUTLASS preference) calls the op. A symbolic M under AUTO calls qlower's Triton
woq op with the CUTLASS GEMM as its branch above `triton_max_m` (`emit.triton_int8.emit_woq_int8`): the
Triton kernels keep the small M they are faster at, and the choice stays on the host at run time."""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from qlower.lowerings.emit.common import finish
from qlower.lowerings.emit.mx import as_u8_view, block_scale_bits
from qlower.lowerings.emit.triton_int8 import emit_woq_int8
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.preference import KernelPreference
from qlower.patterns.graph_utils import is_static, known_eq, tensor_val
from qlower.patterns.record import QuantLinear


def fused_bias(rec: QuantLinear) -> fx.Node | None:
    """The bias the kernel adds in its epilogue: [N] of the compute dtype (else `finish` adds it after)."""
    v = tensor_val(rec.bias)
    ok = v is not None and v.dtype == rec.compute_dtype and known_eq(v.numel(), rec.n)
    return rec.bias if ok else None


def _scale(em: Emitter, rec: QuantLinear) -> fx.Node:
    s = rec.weight_scale
    if isinstance(s, fx.Node):
        return em.reshape(s, [-1])
    value = 1.0 if s is None else float(s)  # `supports` checked that the compute dtype holds it exactly
    return em.call(
        torch.ops.aten.full.default, [1], value, dtype=rec.compute_dtype, device=rec.device, pin_memory=False
    )


def emit_woq_int8_cutlass(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference, triton_max_m: int
) -> fx.Node:
    from qlower.lowerings.kernels.cutlass import w8a16  # noqa: F401  (registers qlower::woq_int8_cutlass)

    if not is_static(rec.m) and preference is KernelPreference.AUTO:
        return emit_woq_int8(graph, rec, preference, cutlass_above=triton_max_m)
    em = Emitter(graph, rec.output)
    bias = fused_bias(rec)
    core = em.call(
        torch.ops.qlower.woq_int8_cutlass.default, em.contiguous(rec.x), rec.weight, _scale(em, rec), bias
    )
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)


def emit_mxfp4_cutlass(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference, m_range: tuple[int, int | None]
) -> fx.Node:
    """A static M (or an explicit CUTLASS preference): the op. A symbolic M under AUTO: qlower's Triton MX op
    with the CUTLASS GEMM as its choice in `m_range` (`emit.triton_mx.emit_mx_triton`)."""
    from qlower.lowerings.kernels.cutlass import mxfp4  # noqa: F401  (registers qlower::mxfp4_cutlass)

    if not is_static(rec.m) and preference is KernelPreference.AUTO:
        from qlower.lowerings.emit.triton_mx import emit_mx_triton

        lo, hi = m_range
        return emit_mx_triton(graph, rec, preference, cutlass_min_m=lo, cutlass_max_m=hi or 0)
    em = Emitter(graph, rec.output)
    bias = fused_bias(rec)
    core = em.call(
        torch.ops.qlower.mxfp4_cutlass.default,
        em.contiguous(rec.x),
        as_u8_view(em, rec.weight),
        block_scale_bits(em, rec),
        bias,
    )
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)
