"""Quantized linears inside a producer library's own torch op: what qlower knows of each op.

Why: optimum-quanto's frozen `QLinear` with qint8 weights reaches the graph as one op,
`quanto::qbytes_mm(x, w_int8, scales)`, with no aten matmul for a recognizer to anchor on, so a model of
such linears reported "no candidate linears" (tests/patterns/test_producer_ops.py). Two answers, as graph
facts (passes/canonicalize.py builds the nodes; patterns/ may not import the emitters):

- `KNOWN`: ops whose arithmetic is proven from their source, each with the aten form a family records.
  `known_linear(node)` gives that form's operands, or why this call is not it.
- `PRODUCER_NAMESPACES`: libraries whose ops take quantized storage. Any call of theirs that multiplies an
  activation by quantized data (`producer_rejection`), and a known op that was not decomposed, gets a
  left-alone row naming the op (patterns/unclaimed.py): the producer's kernel stays, and the report says so.

Device-free, like every pattern.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import known_eq, tensor_val
from qlower.patterns.record import Rejection

# Op namespace -> the library that registers it.
PRODUCER_NAMESPACES: dict[str, str] = {
    "quanto": "optimum-quanto",
    "quanto_py": "optimum-quanto",
    "vllm": "vLLM",
    "_C": "vLLM",  # vLLM's kernel library: the ops its compressed-tensors / GPTQ / AWQ linears call
    "bitsandbytes": "bitsandbytes",
    "compressed_tensors": "compressed-tensors",
}
# Storage dtypes of quantized data a producer op may take: int8, packed sub-byte integers (uint8, int16 and
# int32 words: quanto's AWQ / Marlin layouts), fp8, fp4 and e8m0.
_INT_STORAGE = (torch.int8, torch.uint8, torch.int16, torch.int32)
_FLOAT_STORAGE = (
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
)


@dataclass(frozen=True)
class ProducerLinear:
    """A known producer op's call, proven to be y[..., N] = x[..., K] @ w[N, K].T scaled per output channel,
    in the aten form `family` records (what passes/canonicalize.py builds).

    `x` is float (weight-only: the op converts it to `out_dtype`) or int8 (both operands int8, the int32
    product exact); `weight` int8 [N, K]; `scale` float, [N, 1] or one value, of dtype `out_dtype`."""

    op: str
    family: str
    x: fx.Node
    weight: fx.Node
    scale: fx.Node
    k: Any
    n: Any
    out_dtype: torch.dtype


def op_name(node: fx.Node) -> str | None:
    """`namespace::name` of an OpOverload call (its default overload, or `name.overload`), else None."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    name = target._schema.name
    return name if target._overloadname == "default" else f"{name}.{target._overloadname}"


def _namespace(node: fx.Node) -> str | None:
    name = op_name(node)
    return name.split("::", 1)[0] if name is not None and "::" in name else None


def _what(v: torch.Tensor) -> str:
    return f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"


def _qbytes_mm(node: fx.Node) -> ProducerLinear | str:
    """optimum-quanto's `quanto::qbytes_mm(A, B, scales)` (optimum/quanto/library/qbytes_mm.py, 0.2.7).

    Its `default` kernel, registered for every backend, is the op's definition: `A.to(scales.dtype)`, the
    weight `scales * B` (B int8 promoted to scales.dtype, exact, one rounding of the product), then
    `matmul(A, weight.t())`. Its backend kernels compute the same product with fewer roundings:
    `_weight_int8pack_mm(A, B, scales.flatten())` for a float A (the scale applied to the fp32 accumulator),
    and for an int8 A `_int_mm(A, B.t()).to(float32) * scales.t()` rounded to scales.dtype once. qlower's
    form per A: a float A takes the definition (`mm(A, (B.to(dt) * scales).t())`, woq_int8's scale on the
    weight); an int8 A takes the exact int32 product and the one fp32 rescale (dynamic_int8), where quanto
    folds the activation's per-tensor scale into `scales`, so the activation's own scale is 1.
    """
    a, b, s = (list(node.args) + [None, None, None])[:3]
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node) and isinstance(s, fx.Node)):
        return "an operand that is not a graph value"
    av, bv, sv, out = tensor_val(a), tensor_val(b), tensor_val(s), tensor_val(node)
    if av is None or bv is None or sv is None or out is None:
        return "an operand without a traced value"
    if bv.dtype != torch.int8:
        return f"its weight is {_what(bv)}, not int8 storage: no family lowers that product"
    if bv.dim() != 2:
        return f"its weight is {_what(bv)}, not a 2-D [N, K] matrix"
    n, k = bv.shape
    if not sv.dtype.is_floating_point or out.dtype != sv.dtype:
        return f"its scales are {_what(sv)}, not float of the output's dtype {out.dtype}"
    if not (
        known_eq(sv.numel(), 1) or (sv.dim() == 2 and known_eq(sv.shape[0], n) and known_eq(sv.shape[1], 1))
    ):
        return f"its scales {_what(sv)} are neither per output channel [N, 1] nor one value"
    if av.dim() < 1 or not known_eq(av.shape[-1], k):
        return f"its activation {_what(av)} does not end in K = {k}"
    if av.dtype == torch.int8:
        family = "dynamic_int8"
    elif av.dtype.is_floating_point:
        family = "woq_int8"
    else:
        return f"its activation is {_what(av)}: neither float nor int8"
    return ProducerLinear("quanto::qbytes_mm", family, a, b, s, k, n, out.dtype)


# `namespace::name` -> the proof of its form (each function's docstring: where the arithmetic is read from).
KNOWN: dict[str, Callable[[fx.Node], ProducerLinear | str]] = {
    "quanto::qbytes_mm": _qbytes_mm,
}


def known_linear(node: fx.Node) -> ProducerLinear | str | None:
    """The proven form of a known producer op's call, why this call is not it, or None for other nodes."""
    name = op_name(node)
    proof = KNOWN.get(name) if name is not None else None
    return proof(node) if proof is not None else None


def _storage(v: torch.Tensor | None) -> bool:
    return v is not None and v.dtype in _INT_STORAGE + _FLOAT_STORAGE


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    flat: list[Any] = []
    for a in (*node.args, *node.kwargs.values()):
        flat.extend(a if isinstance(a, (list, tuple)) else [a])
    return [a for a in flat if isinstance(a, fx.Node) and tensor_val(a) is not None]


def _linear_operands(node: fx.Node, out: torch.Tensor) -> tuple[fx.Node, fx.Node] | None:
    """(activation, quantized weight) of a producer op whose output [..., N] is a linear's: the activation is
    the first tensor argument with the output's rank and leading dims, the weight the first other argument
    holding quantized storage; None when the call has no such pair."""
    args = _tensor_args(node)
    acts = [
        a
        for a in args
        if (v := tensor_val(a)) is not None
        and v.dim() == out.dim()
        and all(known_eq(x, y) for x, y in zip(v.shape[:-1], out.shape[:-1], strict=True))
    ]
    if not acts:
        return None
    weights = [w for w in args if w is not acts[0] and _storage(tensor_val(w))]
    return (acts[0], weights[0]) if weights else None


def producer_rejection(node: fx.Node) -> Rejection | None:
    """A left-alone row for a call of a producer library's op (`PRODUCER_NAMESPACES`) that multiplies an
    activation by quantized data, naming the op and why qlower leaves it to the producer; else None."""
    ns = _namespace(node)
    out = tensor_val(node)
    if ns not in PRODUCER_NAMESPACES or out is None or not out.dtype.is_floating_point or out.dim() < 1:
        return None
    found = _linear_operands(node, out)
    if found is None:
        return None
    x, w = found
    xv, wv = tensor_val(x), tensor_val(w)
    assert xv is not None and wv is not None
    name, library = op_name(node), PRODUCER_NAMESPACES[ns]
    if wv.dtype in _INT_STORAGE:
        family = "dynamic_int8" if xv.dtype == torch.int8 else "woq_int8"
    else:
        family = "mx"
    known = known_linear(node)
    if isinstance(known, str):
        why = f"{known}"
    elif known is not None:
        why = f"qlower's {known.family} does not record the aten form of its product"
    else:
        why = f"a quantized product ({_what(wv)}) qlower cannot prove"
    reason = f"{name}: {library}'s own op; {why}; left to it"
    m = xv.shape[0] if xv.dim() == 2 else prod(xv.shape[:-1])
    dtype = xv.dtype if xv.dtype.is_floating_point else out.dtype
    return Rejection(family, node, reason, out.device, dtype, (m, xv.shape[-1], out.shape[-1]))
