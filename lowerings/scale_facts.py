"""What a matched linear's graph does with its weight scale: facts of the record, read by both sides of a lowering.

Where the graph multiplies by the scale (`scale_multiply`), whether into the weight (`scale_on_weight`), and the
dtype that product rounds to (`product_dtype`). The rules in `devices/` decide with them when a lowering
computes the graph (`devices.common.weight_scale_range_blocker`, the CPU GEMM's scale dtype); the emitters in
`emit/` build the same arithmetic with them. Both import them from here, so no rule reads an emitter's module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import MUL_OPS, aten, is_call, tensor_val
from qlower.patterns.record import QuantLinear, ScaleSite

_SCALE_LAYOUT_OPS = (
    aten.expand.default,
    aten.view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten._unsafe_view.default,
)


def _is_scale_operand(arg: Any, scale: Any) -> bool:
    """Whether `arg` is the record's scale, up to the broadcasting views a graph puts around it."""
    if not isinstance(scale, fx.Node):
        return isinstance(arg, (int, float)) and not isinstance(arg, bool) and arg == scale
    for _ in range(4):
        if arg is scale:
            return True
        if not is_call(arg, _SCALE_LAYOUT_OPS):
            return False
        arg = arg.args[0]
    return arg is scale


def scale_multiply(rec: QuantLinear) -> tuple[fx.Node, Any] | None:
    """(the graph's own multiply by `rec.weight_scale`, its other operand); None without a scale or a match."""
    if rec.weight_scale is None:
        return None
    for node in rec.nodes:
        if not is_call(node, MUL_OPS):
            continue
        a, b = node.args[:2]
        if _is_scale_operand(b, rec.weight_scale):
            return node, a
        if _is_scale_operand(a, rec.weight_scale):
            return node, b
    return None


def scale_on_weight(rec: QuantLinear) -> bool:
    """Whether the graph multiplies the scale into the weight (`w.to(dtype) * s`) rather than into the matmul
    result: then the scaled, rounded weight is what the user computed, overflow to inf included. The
    recognizer proved where the scale sits (`QuantLinear.scale_site`)."""
    return rec.weight_scale is not None and rec.scale_site is ScaleSite.WEIGHT


def product_dtype(rec: QuantLinear) -> torch.dtype:
    """The dtype the graph's scale multiply rounds to (type promotion of the scale with its other operand,
    0-d scales and Python numbers included); the compute dtype when there is no scale."""
    found = scale_multiply(rec)
    v = tensor_val(found[0]) if found is not None else None
    if v is not None:
        return v.dtype
    sv = tensor_val(rec.weight_scale) if isinstance(rec.weight_scale, fx.Node) else None
    return rec.compute_dtype if sv is None else torch.promote_types(sv.dtype, rec.compute_dtype)


def _exponent_range(dtype: torch.dtype) -> int:
    return int(torch.finfo(dtype).max).bit_length()


def scale_after_kernel(rec: QuantLinear) -> bool:
    """Whether the graph's product (`mm * s`) has a wider range than the kernel's output (x's dtype): fp16 x
    with an fp32 scale gives an fp32 result, finite where acc * s stored as fp16 would be inf. The kernel
    then runs unscaled (its output rounded like the graph's mm) and the scale follows in fp32. bf16 shares
    fp32's exponent range: its kernel output stays scaled (one rounding, no extra pass)."""
    if rec.weight_scale is None:
        return False
    return _exponent_range(rec.compute_dtype) < _exponent_range(product_dtype(rec))
