"""The one match record between patterns and lowerings.

A pattern turns any graph form of a quantized linear into a `QuantLinear`; a lowering turns a `QuantLinear`
into kernel calls. Neither side knows the other's internals, so N patterns x M lowerings cost N + M. Every
fact a lowering reads is a typed field; `form` (for reports) is derived from those fields (`form_of`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

import torch
from torch import fx

from qlower.patterns.graph_utils import bias_label, tensor_val

ZeroPoint = fx.Node | int | None
"""A zero point: none, a constant, or a per-token (activation) / per-channel (weight) node. The product is
(x_q - zx) @ (w - zw).T, which lowerings turn into compensation terms."""


class ScaleSite(str, Enum):
    """Where the graph multiplies a woq weight scale: into the weight (`w.to(dtype) * s`, so the scaled,
    rounded weight is what the user computed) or into the matmul result."""

    WEIGHT = "weight"
    OUTPUT = "output"


@dataclass(frozen=True)
class ScaleCast:
    """The record's scale is `source` (an fp32 tensor) rounded once to `dtype` (the matmul's dtype) by the
    graph, through shape-only ops, on this linear's behalf alone: each node from the cast to the scale
    multiply has that single use. A kernel given `source` and told to round it to `dtype` (round to nearest
    even, as the graph's convert does) computes with the graph's very scale, and the cast dies. Compared
    by dtypes only: records of two traces of one form compare equal (tests/patterns/test_woq_patterns.py
    `_facts`)."""

    source: fx.Node = field(compare=False)
    dtype: torch.dtype


@dataclass(frozen=True)
class MXOperand:
    """How one MX operand's stored bytes decode, as the recognizer verified it on probes of every code:
    value[r, k] = elem(q)[r, k] * 2 ** (code[r, k // 32] - 127). One type for both sides of the matmul
    (`ActQuant.mx`, `QuantLinear.weight_mx`); the stored scale tensor itself is `x_scale` / `weight_scale`."""

    elem: str  # element format: "e4m3", "e5m2" (fp8) or "e2m1" (fp4, two per byte)
    scale_layout: str  # how the stored scale tensor holds the codes: "plain", "plain_t", "swizzled", "other"
    scale_codes: fx.Node  # the scale-code tensor the decode multiplies by (numel rows * blocks), any layout
    scale_assoc: str  # "nk": the codes' row-major order is [rows, blocks]; "kn": it is [blocks, rows]
    nibbles: str = "low_first"  # packed e2m1: which nibble holds the even element
    scale_special: dict[int, float] = field(default_factory=dict)  # e8m0 code -> value, where not the spec's
    table: fx.Node | None = None  # e2m1 values gathered from this graph input at run time (weights only)
    # the verified multiply: its values, read row-major, are this decode as [rows, K] in the multiply's dtype
    decoded: fx.Node | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ActQuant:
    """The in-graph quantization of the activation (dynamic families); None for weight-only families.

    The pattern keeps the graph's own quantize nodes (`x_q`, `x_scale`): lowerings consume them, so the
    numerics are exactly the model's, and Inductor fuses that prologue with its producer.

    dynamic_int8: scheme is "per_token|per_tensor" + "_symmetric|_asymmetric"; `x_q` is int8 [..., K] (a
    lowering flattens it to [M, K]); `x_scale` the factor the int32 product is multiplied by (numel M or 1,
    any float dtype); qmin/qmax from the graph's clamp. MX: scheme "mx_block", `mx` says how x_q decodes.
    """

    scheme: str  # "per_token_symmetric" (dynamic_int8), "mx_block" (MX), ...
    x_q: fx.Node  # quantized activation, 2-D [M, K] (int8, fp8, or packed fp4)
    x_scale: fx.Node  # per-token scale (numel M, broadcast as [M, 1]) or MX block scales [M, K / block]
    qmin: int = -128
    qmax: int = 127
    x_float: fx.Node | None = None  # float activation before quantization, if the graph has it
    zero_point: ZeroPoint = None  # dynamic_int8: the activation's
    # dynamic_int8: the int8 activation reaches the matmul as uint8 (x_q + 128, torchao's u8s8 spelling);
    # the graph subtracts 128 * w.sum(0) after it ("compensated": no zero point left) or not ("zero_point")
    u8_shift: Literal["compensated", "zero_point"] | None = None
    prologue: Literal["matched", "opaque"] | None = None  # dynamic_int8: x_q quantized with x_scale, or not
    # PT2E: x_q / x_scale come from quantized_decomposed ops that Inductor runs as Python fallbacks; lowerings
    # inline them (`lowerings.decompose.materialize`) before using them
    quantized_decomposed: bool = False
    mx: MXOperand | None = None  # MX: how x_q and x_scale decode
    rounding: str | None = None  # MX: the scale's rounding, for reports: "floor", "rceil", "unknown"


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
    # the matmul's spelling in the graph: "mm", "addmm", "matvec" (`graph_utils.matmul_site`); dynamic_int8:
    # "int_mm", "int32_mm" (int32 products), "dequant_mm" / "float_mm" (int8 values in float, the activation
    # scaled before / after the matmul), "qdq" (PT2E dequantize nodes)
    matmul: str
    act_quant: ActQuant | None = None
    weight_block: int | None = None  # MX: elements per shared scale along K
    scale_site: ScaleSite | None = None  # woq_int8: where the graph multiplies `weight_scale`, if anywhere
    scale_cast: ScaleCast | None = None  # woq_int8: the fp32 scale the graph rounds to `compute_dtype`
    weight_zero_point: ZeroPoint = None  # dynamic_int8: the weight's
    weight_mx: MXOperand | None = None  # MX: how weight and weight_scale decode
    # matched nodes that other nodes also read (a training graph's backward): the rewrite leaves them, and what
    # they read, for those readers, and the pass marks them so that no family records them again
    kept: tuple[fx.Node, ...] = ()

    @property
    def device(self) -> torch.device:
        v = tensor_val(self.x)
        assert v is not None
        return v.device

    @property
    def shape(self) -> tuple[Any, int, int]:
        return (self.m, self.k, self.n)

    @property
    def form(self) -> str:
        """Which graph form matched (for reports and expect-tests): `form_of`."""
        return form_of(self)


_U8_FORM = {"compensated": "u8s8", "zero_point": "u8", None: ""}
_SCALE_FORM = {ScaleSite.WEIGHT: "weight_scale", ScaleSite.OUTPUT: "output_scale", None: "no_scale"}


def form_of(rec: QuantLinear) -> str:
    """The record's form, "+"-joined: derived from its typed fields alone, the one place forms are named."""
    common = (
        bias_label(rec.bias),
        "nd" if rec.out_shape is not None else "",
        "kept_for_readers" if rec.kept else "",
    )
    kn = "kn_weight" if rec.weight_layout == "KN" else ""
    aq = rec.act_quant
    if rec.weight_mx is not None:
        w, a = rec.weight_mx, aq.mx if aq is not None else None
        parts = (
            "dynamic" if a else "weight_only",
            f"{a.elem}x{w.elem}" if a else w.elem,
            f"w_scale_{w.scale_layout}",
            rec.matmul,
            *common,
            "high_nibble_first" if "high_first" in (w.nibbles, a and a.nibbles) else "",
            "partial_block" if rec.weight_block and rec.k % rec.weight_block else "",
            "runtime_table" if w.table is not None else "",
        )
    elif aq is not None:
        asym = "asym" if aq.scheme.endswith("_asymmetric") else ""
        wzp = "wzp" if rec.weight_zero_point is not None else ""
        parts = (rec.matmul, _U8_FORM[aq.u8_shift], asym, wzp, *common, kn)
    else:
        scale_cast = "scale_cast" if rec.scale_cast is not None else ""
        parts = (rec.matmul, _SCALE_FORM[rec.scale_site], scale_cast, *common, kn)
    return "+".join(p for p in parts if p)


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
