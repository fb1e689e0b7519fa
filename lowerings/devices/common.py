"""Rule helpers shared by the backends: `supports` checks and the blockers several lowerings share (each returns
None where the record is fine, else the reason the report shows)."""

from __future__ import annotations

import torch

from qlower.lowerings.scale_facts import product_dtype, scale_on_weight
from qlower.patterns import mx_format as fmt
from qlower.patterns.record import QuantLinear


def always(rec: QuantLinear) -> str | None:
    """The emulated lowerings: correct for every record."""
    return None


def int8_operands(rec: QuantLinear) -> str | None:
    """Every `_int_mm` takes int8 x int8; the record's activation must be int8 [.., K]."""
    aq = rec.act_quant
    if aq is None:
        return "no activation quantization in the record"
    for name, node in (("activation", aq.x_q), ("weight", rec.weight)):
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor) or v.dtype != torch.int8:
            return f"{name} is not int8"
    return None


WEIGHT_SCALE_RANGE_DTYPE = torch.float16


def weight_scale_range_blocker(rec: QuantLinear) -> str | None:
    """Why a kernel that applies a weight-side scale to its fp32 accumulator would not compute the graph.

    The graph `F.linear(x, w.to(fp16) * s)` rounds w * s to fp16: inf wherever |w * s| > 65504, so eager's
    output is inf/NaN there; a kernel scaling the accumulator instead returns finite numbers (and rounds
    differently: bf16/fp32 weights round w * s too, but their range needs |s| > 2e36 to overflow, which no
    quantizer makes, so only fp16 is refused). A Python-number scale is checked now; a tensor's values are
    unknown at compile time, so such a record is left to the lowerings that compute the graph's formula
    (dequant + GEMM, the scaled weight in a reused buffer;
    tests/lowerings/emit/test_dequant_range.py::test_weight_side_scale_overflows_like_eager).
    """
    if rec.weight_scale is None or not scale_on_weight(rec):
        return None
    if WEIGHT_SCALE_RANGE_DTYPE not in (product_dtype(rec), rec.compute_dtype):
        return None
    s = rec.weight_scale
    if isinstance(s, (int, float)) and abs(float(s)) * 128 <= torch.finfo(WEIGHT_SCALE_RANGE_DTYPE).max:
        return None  # |int8| <= 128: this weight never overflows
    return (
        "the graph scales the weight in fp16 (w.to(fp16) * s): eager's weight is inf where |w * s| > 65504, "
        "which a kernel scaling its fp32 accumulator does not reproduce; dequant + GEMM computes the graph's "
        "own formula"
    )


def spec_layout_blocker(rec: QuantLinear) -> str | None:
    """Why a kernel reading MX bytes as the OCP layout has them (whole 32-element blocks, even fp4 element in
    the low nibble) cannot take `rec`; the emulation (`emit.mx.dequant`) decodes any record."""
    if rec.k % fmt.BLOCK:
        return f"K={rec.k} ends in a partial MX block (K % {fmt.BLOCK} = {rec.k % fmt.BLOCK}): emulation only"
    w, aq = rec.weight_mx, rec.act_quant
    assert w is not None
    if w.table is not None:
        return "fp4 values gathered from a table the module holds (read at run time): emulation only"
    if "high_first" in (w.nibbles, aq.mx.nibbles if aq is not None and aq.mx is not None else None):
        return "fp4 packed with the even element in the high nibble: emulation only"
    return None
