"""How a woq-int8 record becomes a call of qlower's CUTLASS W8A16 GEMM (`qlower::woq_int8_cutlass`). When it
is chosen is `lowerings/devices/cuda_cutlass.py` (`WOQ_INT8_CUTLASS`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from qlower.lowerings.emit.common import Emitter, finish
from qlower.patterns.graph_utils import known_eq, tensor_val
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


def emit_woq_int8_cutlass(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    from qlower.lowerings.kernels.cutlass import w8a16  # noqa: F401  (registers qlower::woq_int8_cutlass)

    em = Emitter(graph, rec.output)
    bias = fused_bias(rec)
    core = em.call(
        torch.ops.qlower.woq_int8_cutlass.default, em.contiguous(rec.x), rec.weight, _scale(em, rec), bias
    )
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)
