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
from qlower.lowerings.emit.mx import as_u8_view, scale_codes, unswizzle
from qlower.lowerings.emit.triton_int8 import emit_woq_int8
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.preference import KernelPreference
from qlower.patterns import mx_format as fmt
from qlower.patterns.graph_utils import is_static, known_eq, tensor_val
from qlower.patterns.record import QuantLinear

aten = torch.ops.aten


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


def block_scale_bits(em: Emitter, rec: QuantLinear) -> fx.Node:
    """The weight's block scales as the MXFP4 kernel reads them: [K/128, N, 4] bf16, 2 ** (code - 127) built
    from its bits (`code << 7`: exact, no float arithmetic that could flush 2 ** -127), with the record's meaning
    of the codes 0 and 255 (the spec's 2 ** -127 and NaN, or the graph's own 0.0 and +inf, which are the bits
    `code << 7` already give)."""
    d = rec.weight_mx
    assert d is not None
    n, cols = int(rec.n), int(rec.k) // fmt.BLOCK
    codes, swizzled = scale_codes(em, rec.weight_scale, d.scale_layout, d.scale_codes, d.scale_assoc, cols)
    if swizzled:
        codes = unswizzle(em, codes, n, cols)
    c = em.convert(codes, torch.int32)
    bits = em.call(aten.bitwise_left_shift.Tensor_Scalar, c, 7)
    for code, spec_bits in ((0, 0x0040), (fmt.E8M0_NAN, 0x7FC0)):
        if code not in d.scale_special:
            value = em.call(aten.scalar_tensor.default, spec_bits, dtype=torch.int32, device=rec.device)
            bits = em.call(aten.where.self, em.call(aten.eq.Scalar, c, code), value, bits)
    scales = em.call(aten.view.dtype, em.convert(bits, torch.int16), torch.bfloat16)
    quads = em.reshape(scales, [n, cols // 4, 4])
    return em.contiguous(em.call(aten.permute.default, quads, [1, 0, 2]))


def emit_mxfp4_cutlass(graph: fx.Graph, rec: QuantLinear, preference: KernelPreference) -> fx.Node:
    from qlower.lowerings.kernels.cutlass import mxfp4  # noqa: F401  (registers qlower::mxfp4_cutlass)

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
