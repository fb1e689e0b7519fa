"""Rule helpers shared by the backends."""

from __future__ import annotations

import torch

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
