"""Device-agnostic recognizers: each family turns the graph forms of its quantized linear into QuantLinear."""

from __future__ import annotations

from collections.abc import Callable

from torch import fx

from . import mx, woq_int8
from .record import ActQuant, Candidate, QuantLinear, Rejection

FamilyFinder = Callable[[fx.Graph], "list[Candidate]"]

FAMILIES: dict[str, FamilyFinder] = {
    woq_int8.FAMILY: woq_int8.find,
    mx.FAMILY: mx.find,
}

__all__ = ["FAMILIES", "ActQuant", "Candidate", "QuantLinear", "Rejection"]
