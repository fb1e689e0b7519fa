"""Linear-shaped products of quantized data that no family recorded: each gets a report row with its reason.

A family's recognizer lists only the forms it knows, so a quantized linear written another way used to
leave the report silent ("no candidate linears"): a batched expert matmul over stacked int8 weights
(`torch.bmm(x, W.to(bf16).transpose(1, 2))`, `einsum("mk,enk->emn")`), or the weight as the left operand
(`w.to(bf16) @ x`, which a 1-D `x` turns into `(w * x).sum(1)`). The pass runs this sweep after every
family: any matrix product (`mm`, `addmm`, `bmm`, `baddbmm`, or the matrix-vector `sum(mul)`) one of whose
operands is computed from 8-bit quantized storage, and that no decision covers, becomes a `Rejection`
naming what it is and why it stays as written (tests/end_to_end/test_report.py). A call of a producer
library's own op that multiplies an activation by quantized data (optimum-quanto's `quanto::*`, vLLM's) and
that passes/canonicalize.py did not decompose gets its row too, naming the op (`producers.producer_rejection`,
tests/patterns/test_producer_ops.py). Device-free, like every pattern.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import (
    ADD_OPS,
    LAYOUT_OPS,
    MUL_OPS,
    aten,
    convert_target_dtype,
    is_call,
    tensor_val,
)
from qlower.patterns.producers import producer_rejection
from qlower.patterns.record import Rejection

# Storage dtypes of quantized data, by the family whose data they are.
_INT8 = (torch.int8,)
_MX = (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)
_PRODUCTS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)
# Ops a dequantized value flows through on its way into a product: layout, dtype and scale/zero-point math.
_PATH_OPS = (*LAYOUT_OPS, aten.sub.Tensor, *MUL_OPS, *ADD_OPS)
_MAX_DEPTH = 10


def _is_dequantize_op(node: fx.Node) -> bool:
    """A PT2E `quantized_decomposed.dequantize_*` op: its first argument is the quantized tensor."""
    return str(node.target).startswith("quantized_decomposed.dequantize")


def quantized_source(node: Any, depth: int = _MAX_DEPTH) -> torch.Tensor | None:
    """The fake value of the 8-bit storage `node` is computed from through dequant-path ops, or None."""
    if not isinstance(node, fx.Node) or depth == 0:
        return None
    v = tensor_val(node)
    if v is None:
        return None
    if v.dtype in _INT8 + _MX:
        return v
    if node.op != "call_function":
        return None
    if convert_target_dtype(node) is not None or is_call(node, _PATH_OPS) or _is_dequantize_op(node):
        for arg in node.args[:2] if is_call(node, (*MUL_OPS, *ADD_OPS, aten.sub.Tensor)) else node.args[:1]:
            found = quantized_source(arg, depth - 1)
            if found is not None:
                return found
    return None


def _family(*storage: torch.Tensor | None) -> str:
    found = [s for s in storage if s is not None]
    if all(s.dtype in _INT8 for s in found):
        return "dynamic_int8" if len(found) == 2 else "woq_int8"
    return "mx"


def _dims(v: torch.Tensor | None) -> list[Any]:
    return list(v.shape) if v is not None else []


def _product(node: fx.Node) -> Rejection | None:
    """A row for an `mm` / `addmm` / `bmm` / `baddbmm` one of whose operands is quantized storage."""
    a, b = node.args[1:3] if is_call(node, (aten.addmm.default, aten.baddbmm.default)) else node.args[:2]
    qa, qb = quantized_source(a), quantized_source(b)
    if qa is None and qb is None:
        return None
    av, bv, out = tensor_val(a), tensor_val(b), tensor_val(node)
    if av is None or bv is None or out is None:
        return None
    family = _family(qa, qb)
    storage = qb if qb is not None else qa
    assert storage is not None
    what = f"{str(storage.dtype).removeprefix('torch.')}{_dims(storage)}"
    float_side = av if qa is None else bv
    dtype = float_side.dtype if float_side.dtype.is_floating_point else out.dtype
    if av.dim() == 3:  # bmm: [E, M, K] x [E, K, N]
        e, m, k, n = av.shape[0], av.shape[1], av.shape[2], bv.shape[2]
        batches = "one batch" if str(e) == "1" else f"{e} batches"
        reason = (
            f"batched matmul ({batches}) over stacked quantized weights {what}, a grouped (MoE) linear: "
            "qlower has no grouped lowering, so Inductor computes it as written"
        )
        return Rejection(family, node, reason, out.device, dtype, (m, k, n))
    m, k, n = av.shape[0], av.shape[1], bv.shape[1]
    if qa is not None and qb is None:  # W @ X: the weight is the left operand
        reason = (
            f"the quantized weight ({what}) is the left operand (W @ x): qlower's recognizers take x @ W.T, "
            "so Inductor computes it as written"
        )
        return Rejection(family, node, reason, out.device, dtype, (n, k, m))
    reason = f"a matmul of quantized data ({what}) in a form no {family} recognizer describes"
    return Rejection(family, node, reason, out.device, dtype, (m, k, n))


def _matvec(node: fx.Node) -> Rejection | None:
    """A row for a matrix-vector product decomposed to `sum(a * b, dim)` with quantized data on one side:
    `w.to(dtype) @ x` for a 1-D x is `(w * x).sum(1)`, Inductor's M = 1 decomposition of `addmm` is
    `(x.T * w.T).sum(0, keepdim=True)`, and of a `bmm` with M = 1 (a stacked-experts einsum, say)
    `(a[..., None] * b[:, None]).sum(2)` over a 4-D product: no recognizer takes these."""
    if not is_call(node, (aten.sum.dim_IntList,)) or len(node.args[1]) != 1:
        return None
    prod = node.args[0]
    if not is_call(prod, MUL_OPS):
        return None
    a, b = prod.args[:2]
    qa, qb = quantized_source(a), quantized_source(b)
    pv, out = tensor_val(prod), tensor_val(node)
    if (qa is None and qb is None) or pv is None or out is None or pv.dim() < 2:
        return None
    storage = qb if qb is not None else qa
    assert storage is not None
    what = f"{str(storage.dtype).removeprefix('torch.')}{_dims(storage)}"
    kdim = node.args[1][0] % pv.dim()
    k, n = pv.shape[kdim], pv.shape[-2 if kdim == pv.dim() - 1 else -1]
    rows = out.numel() // n if isinstance(out.numel(), int) and isinstance(n, int) and n else 1
    x = b if qa is not None and qb is None else a
    if is_call(x, (aten.unsqueeze.default,)):
        x = x.args[0]
    xv = tensor_val(x)
    if convert_target_dtype(x) is not None and tensor_val(x.args[0]) is not None:  # the fp32 upcast of x
        xv = tensor_val(x.args[0])
    dtype = xv.dtype if xv is not None and xv.dtype.is_floating_point else out.dtype
    if xv is not None and xv.dim() == 1 and qb is None:
        reason = (
            f"matrix-vector product W @ x with the quantized weight ({what}) on the left, decomposed to "
            "sum(W * x): qlower's recognizers take x @ W.T, so Inductor computes it as written"
        )
    else:
        reason = (
            f"a matrix-vector product of quantized data ({what}) decomposed to sum(a * b) over K (Inductor's "
            "M = 1 form of mm / addmm / bmm): no recognizer takes this form, so Inductor computes it as written"
        )
    return Rejection(_family(qa, qb), node, reason, out.device, dtype, (rows, k, n))


def find_unclaimed(
    graph: fx.Graph, covered: Collection[fx.Node], families: Collection[str]
) -> list[Rejection]:
    """A rejection for every product of quantized data in `graph` that no decision `covered` (anchors and
    record nodes) and that qlower did not emit, for the enabled `families` only."""
    out: list[Rejection] = []
    for node in graph.nodes:
        if node.op != "call_function" or node in covered or node.meta.get("qlower"):
            continue
        row = _product(node) if is_call(node, _PRODUCTS) else _matvec(node) or producer_rejection(node)
        if row is not None and row.family in families:
            out.append(row)
    return out
