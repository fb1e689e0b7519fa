"""Device-agnostic recognizers: each family turns the graph forms of its quantized linear into QuantLinear."""

from __future__ import annotations

from collections.abc import Callable

from torch import fx

from qlower.patterns import dynamic_int8, mx, woq_int8
from qlower.patterns.record import ActQuant, Candidate, QuantLinear, Rejection

FamilyFinder = Callable[[fx.Graph], "list[Candidate]"]

# The pass runs the families in this order, whatever order the user names them in. woq_int8 also leaves
# alone a matmul whose activation dynamic_int8 describes (`dynamic_int8.describes`), so the decision for a
# dequantized int8 activation times a dequantized int8 weight is the same with or without dynamic_int8.
FAMILIES: dict[str, FamilyFinder] = {
    dynamic_int8.FAMILY: dynamic_int8.find,
    woq_int8.FAMILY: woq_int8.find,
    mx.FAMILY: mx.find,
}

__all__ = ["FAMILIES", "ActQuant", "Candidate", "QuantLinear", "Rejection"]
