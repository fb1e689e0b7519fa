"""The one match record between patterns and lowerings.

A pattern turns any graph form of a quantized linear into a `QuantLinear`; a lowering turns a `QuantLinear`
into kernel calls. Neither side knows the other's details, so N patterns x M lowerings cost N + M.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import tensor_val


@dataclass(frozen=True)
class ScaleCast:
    """The record's scale is `source` (an fp32 tensor) rounded once to `dtype` (the matmul's dtype) by the
    graph, through shape-only ops, on this linear's behalf alone: each node from the cast to the scale
    multiply has that single use. A kernel given `source` and told to round it to `dtype` (round to nearest
    even, as the graph's convert does) computes with the graph's very scale, and the cast dies. Compared
    by dtypes only: records of two traces of one form compare equal (tests/test_woq_patterns.py `_facts`)."""

    source: fx.Node = field(compare=False)
    dtype: torch.dtype


@dataclass(frozen=True)
class ActQuant:
    """The in-graph quantization of the activation (dynamic families); None for weight-only families.

    The pattern keeps the graph's own quantize nodes (`x_q`, `x_scale`): lowerings consume them, so the
    numerics are exactly the model's, and Inductor fuses that prologue with its producer.

    dynamic_int8: scheme is "per_token|per_tensor" + "_symmetric|_asymmetric"; `x_q` is int8 [..., K] (a
    lowering flattens it to [M, K]); `x_scale` the factor the int32 product is multiplied by (numel M or 1,
    any float dtype); qmin/qmax from the graph's clamp. `details`: "zero_point" / "weight_zero_point" (None,
    an int, or a per-token / per-channel node: the product is (x_q - zx) @ (w - zw).T, which lowerings turn
    into compensation terms), "prologue" ("matched" when x_q was quantized with x_scale, else "opaque"), and
    "quantized_decomposed" (PT2E: x_q / x_scale come from ops Inductor runs as Python fallbacks; inline them
    with `lowerings.decompose.materialize`).
    """

    scheme: str  # "per_token_symmetric" (dynamic_int8), "mx_block" (MX), ...
    x_q: fx.Node  # quantized activation, 2-D [M, K] (int8, fp8, or packed fp4)
    x_scale: fx.Node  # per-token scale (numel M, broadcast as [M, 1]) or MX block scales [M, K / block]
    qmin: int = -128
    qmax: int = 127
    x_float: fx.Node | None = None  # float activation before quantization, if the graph has it
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class QuantLinear:
    """One quantized linear found in a graph: y = (x @ dequant(weight).T) [* scale] [+ bias].

    `x` is the 2-D matmul input [M, K]; the lowered [M, N] result is finished (bias, dtype, view back to the
    original N-D shape) and replaces `output`.

    dynamic_int8: `x` is the int8 activation (the same node as `act_quant.x_q`, possibly N-D); `compute_dtype`
    is the dtype of the float activation before quantization (`act_quant.x_float`), or of the output when the
    graph does not show it — the matmul itself is int8 x int8 -> int32 and the rescale runs in fp32.
    """

    family: str
    x: fx.Node
    weight: fx.Node
    weight_layout: str  # "NK" (F.linear's layout) or "KN" (stored transposed)
    weight_scale: fx.Node | float | None  # per output channel (numel N) or per tensor (numel 1)
    bias: fx.Node | None
    compute_dtype: torch.dtype  # dtype of the matmul in the matched graph
    out_dtype: torch.dtype  # dtype of `output`
    m: int | torch.SymInt
    k: int | torch.SymInt  # static for parameters; symbolic only for weights Dynamo made dynamic
    n: int | torch.SymInt
    output: fx.Node
    out_shape: list[Any] | None  # shape argument of the trailing view, when the result was N-D
    nodes: tuple[fx.Node, ...]  # the matched nodes; those left without users are erased
    act_quant: ActQuant | None = None
    weight_block: int | None = None  # MX: elements per shared scale along K
    form: str = ""  # which graph form matched (for reports and expect-tests)
    details: dict[str, Any] = field(
        default_factory=dict
    )  # family-specific facts (MX: element format, scale layout)

    @property
    def device(self) -> torch.device:
        v = tensor_val(self.x)
        assert v is not None
        return v.device

    @property
    def shape(self) -> tuple[Any, int, int]:
        return (self.m, self.k, self.n)


@dataclass
class Rejection:
    """A candidate the pattern saw but could not describe as a QuantLinear, and why."""

    family: str
    anchor: fx.Node
    reason: str
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    shape: tuple[Any, ...] | None = None


Candidate = QuantLinear | Rejection
