"""Weight-only int8 linears: y = (x @ (w_int8 -> float).T) * per-channel scale [+ bias].

Anchored on every matmul (`mm`, `addmm`, or the decomposed matrix-vector form; see
`graph_utils.matmul_site`) whose weight operand is a dequantized int8 tensor. One structural walk covers
the graph forms users write: gpt-fast (`F.linear(x, w.to(x.dtype)) * s`), scale on the weight
(`F.linear(x, w.to(x.dtype) * s[:, None])`), torchao `Int8WeightOnlyConfig` after flattening
(`mm(x, w.t().to(dtype)) * s`), with or without bias, any input rank (views around the mm), scales 1-D or
[N, 1] in any float dtype, weight [N, K] or stored [K, N].

A scale that the graph rounds from fp32 to the matmul's dtype on every call (torchao stores it fp32 [N, 1]:
`convert_element_type(s, bf16)` then a view) is recorded as the record's `scale_cast` (a `ScaleCast`), the
rounding's nodes among the record's, so a kernel that rounds the fp32 scale itself leaves that cast dead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from qlower.patterns import dynamic_int8
from qlower.patterns.epilogue import Epilogue, site_bias, stored_nk, walk_epilogue, weight_layout
from qlower.patterns.graph_utils import (
    ADD_OPS,
    FLOAT_DTYPES,
    MUL_OPS,
    Factor,
    MatmulSite,
    convert_target_dtype,
    is_call,
    is_static,
    is_transpose_2d,
    known_eq,
    matmul_site,
    strip_expand,
    tensor_devices,
    tensor_val,
)
from qlower.patterns.record import Candidate, QuantLinear, Rejection, ScaleCast, ScaleSite

FAMILY = "woq_int8"
# An activation that is itself a dequantized int8 tensor, which dynamic_int8 records exactly: a float GEMM on
# it would be right but slower than the int8 one, and the decision must not depend on which family runs first.
DYNAMIC_ACTIVATION = (
    "activation is a dequantized int8 tensor: a dynamic_int8 linear (left to that family; enable it to lower)"
)
_MAX_WALK = 12
# ops that change only a tensor's shape, never its values (the scale chain between a cast and its multiply)
_SHAPE_OPS = (
    torch.ops.aten.view.default,
    torch.ops.aten._unsafe_view.default,
    torch.ops.aten.reshape.default,
    torch.ops.aten.unsqueeze.default,
    torch.ops.aten.squeeze.default,
    torch.ops.aten.squeeze.dim,
    torch.ops.aten.squeeze.dims,
    torch.ops.aten.expand.default,
)
_ROUNDED_DTYPES = (torch.bfloat16, torch.float16)  # what a kernel can round an fp32 scale to in registers


@dataclass
class _WeightPath:
    source: fx.Node  # the int8 tensor
    flips: int  # transposes between the int8 source and the matmul operand
    scale: fx.Node | float | None = None
    scale_operand: Any = None  # the multiply's scale operand as the graph has it (expands not stripped)
    scale_flips: int = 0  # transposes between the scale multiply and the matmul operand
    nodes: list[fx.Node] = field(default_factory=list)


def _is_int8(node: Any) -> bool:
    v = tensor_val(node)
    return v is not None and v.dtype == torch.int8


def _reaches_int8(node: Any, depth: int = 6) -> bool:
    """Whether an int8 tensor feeds `node` through a chain of single-input-ish ops (a dequant path)."""
    while depth > 0 and isinstance(node, fx.Node):
        if _is_int8(node):
            return True
        if node.op != "call_function" or not node.args:
            return False
        node = node.args[0]
        depth -= 1
    return False


def _trace_weight(operand: fx.Node) -> _WeightPath | str | None:
    """Walk from the matmul's weight operand back to an int8 tensor.

    Returns the path, a rejection reason (an int8 weight reached through something qlower cannot express),
    or None when the operand is not a dequantized int8 weight at all.
    """
    path = _WeightPath(source=operand, flips=0)
    cur: Any = operand
    converted = False
    for _ in range(_MAX_WALK):
        if not isinstance(cur, fx.Node) or tensor_val(cur) is None:
            return None
        if is_transpose_2d(cur):
            path.flips += 1
        elif convert_target_dtype(cur) is not None:
            if _is_int8(cur):
                return None  # float -> int8 on the weight path: a quantize, not a dequant
            converted = True
        elif _is_int8(cur):
            if not converted:
                return None
            path.source = cur
            return path
        elif is_call(cur, MUL_OPS) and path.scale is None:
            a, b = cur.args[:2]
            if isinstance(a, fx.Node) and _reaches_int8(a):
                data, scale = a, b
            elif isinstance(b, fx.Node) and _reaches_int8(b):
                data, scale = b, a
            else:
                return None
            path.scale, path.scale_operand, path.scale_flips = strip_expand(scale), scale, path.flips
            path.nodes.append(cur)
            cur = data
            continue
        else:
            if _reaches_int8(cur):
                return f"int8 weight reaches the matmul through {cur.target} (zero point or other op woq_int8 does not express)"
            return None
        path.nodes.append(cur)
        cur = cur.args[0]
    return None


def _weight_scale_ok(path: _WeightPath, n: int) -> bool:
    """A scale multiplied into the weight must vary only along N (per output channel)."""
    if path.scale is None or isinstance(path.scale, (int, float)):
        return True
    v = tensor_val(path.scale)
    if v is None or v.dim() > 2:
        return False
    shape = [1] * (2 - v.dim()) + list(v.shape)
    n_axis = 1 if path.scale_flips % 2 == 0 else 0  # the matmul operand is [K, N]
    other = shape[1 - n_axis]
    return known_eq(other, 1) and (known_eq(shape[n_axis], n) or known_eq(shape[n_axis], 1))


def _is_channel_vector(factor: Any) -> bool:
    """Only 0-d/1-d tensors (or numbers) are this linear's scale or bias: at M = 1 a residual or a gate
    activation ([1, 1, N]) is also a per-channel factor by shape, but it is an activation, not part of this
    linear (tests/patterns/test_woq_patterns.py::test_residual_and_gate_at_m1_are_not_bias_or_scale)."""
    v = tensor_val(factor)
    return v is None or v.dim() <= 1


def _is_float_scalar_or_tensor(x: Any) -> bool:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return True
    v = tensor_val(x)
    return v is not None and v.dtype.is_floating_point


def _cast_target(node: Any) -> torch.dtype | None:
    """The dtype a pure dtype conversion produces (`prims.convert_element_type`, a same-device `_to_copy`,
    `aten.to.dtype`), or None."""
    if is_call(node, (torch.ops.aten.to.dtype,)):
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    return convert_target_dtype(node)


def _scale_cast(operand: Any, scale: Any, dtype: torch.dtype) -> tuple[ScaleCast, list[fx.Node]] | None:
    """When the scale multiply's `operand` is, through shape-only ops that keep the scale's numel (expands
    above the record's `scale` aside), an fp32 tensor cast to `dtype` (bf16/fp16), with no other use of any
    node on the way: the fact and those nodes (the cast included). None otherwise: a cast another node also
    reads stays in the graph anyway; an fp64 source rounded once to bf16 is not fp32 rounded to bf16."""
    sv = tensor_val(scale)
    if dtype not in _ROUNDED_DTYPES or not isinstance(operand, fx.Node) or sv is None:
        return None
    chain: list[fx.Node] = []
    cur: Any = operand
    reached = False  # past the record's scale: from here down every node keeps its numel
    for _ in range(_MAX_WALK):
        v = tensor_val(cur)
        if not isinstance(cur, fx.Node) or v is None or v.dtype != dtype or len(cur.users) != 1:
            return None
        reached = reached or cur is scale
        if reached and not known_eq(v.numel(), sv.numel()):
            return None
        chain.append(cur)
        if _cast_target(cur) is not None:
            src = cur.args[0]
            srcv = tensor_val(src)
            if not reached or _cast_target(cur) != dtype or srcv is None or srcv.dtype != torch.float32:
                return None
            return ScaleCast(source=src, dtype=dtype), chain
        if not is_call(cur, _SHAPE_OPS):
            return None
        cur = cur.args[0]
    return None


def _weight_dims(path: _WeightPath) -> tuple[Any, Any] | str:
    """(K, N) from the int8 weight: static for parameters even when Dynamo marks activation dims dynamic."""
    wv = tensor_val(path.source)
    if wv is None or wv.dim() != 2:
        return "weight is not a 2-D tensor"
    n, k = stored_nk(wv, path.flips)
    return (int(k) if is_static(k) else k), (int(n) if is_static(n) else n)


def _weight_problem(path: _WeightPath, xv: torch.Tensor, mmv: torch.Tensor, k: Any, n: Any) -> str | None:
    """Why the traced weight is not this linear's [N, K] int8 weight times a per-channel scale, if it is not."""
    if not (known_eq(n, mmv.shape[1]) and known_eq(k, xv.shape[1])):
        return f"int8 weight {list(tensor_val(path.source).shape)} is broadcast into the matmul operand"
    if xv.dtype not in FLOAT_DTYPES:
        return f"activation dtype {xv.dtype} is not bf16/fp16/fp32"
    if not _weight_scale_ok(path, n):
        return "weight scale does not broadcast per output channel (per-K or block scales)"
    return None


def _absorb(user: fx.Node, cur: fx.Node, factor: Factor | None, ep: Epilogue) -> list[fx.Node] | None:
    """One per-channel multiply (if the weight carried no scale), then one bias add."""
    if factor is None or factor.kind == "row" or not _is_channel_vector(factor.source):
        return None
    if is_call(user, MUL_OPS) and ep.col_scale is None and ep.bias is None:
        if not _is_float_scalar_or_tensor(factor.source):
            return None
        ep.col_scale = factor.source
        ep.scale_operand = user.args[1] if user.args[0] is cur else user.args[0]
    elif is_call(user, ADD_OPS) and ep.bias is None and isinstance(factor.source, fx.Node):
        ep.bias = factor.source
    else:
        return None
    return [user]


def _match(site: MatmulSite) -> Candidate | None:
    """The woq-int8 linear at a matmul site, a rejection naming its blocker, or None (not a candidate)."""
    mm, x = site.output, site.x
    path = _trace_weight(site.operand)
    xv, mmv = tensor_val(x), tensor_val(mm)
    if path is None or xv is None or mmv is None:
        return None
    m = xv.shape[0]
    base = dict(
        family=FAMILY, anchor=mm, device=xv.device, dtype=xv.dtype, shape=(m, xv.shape[1], mmv.shape[1])
    )
    if isinstance(path, str) or dynamic_int8.describes(mm):
        return Rejection(reason=path if isinstance(path, str) else DYNAMIC_ACTIVATION, **base)
    dims = _weight_dims(path)
    if isinstance(dims, str):
        return Rejection(reason=dims, **base)
    k, n = dims
    base["shape"] = (m, k, n)
    bias = site_bias(site.bias, mmv)
    why = _weight_problem(path, xv, mmv, k, n) or (bias if isinstance(bias, str) else None)
    if why is not None:
        return Rejection(reason=why, **base)
    ep = Epilogue(chain=list(site.nodes), bias=bias, col_scale=path.scale, scale_operand=path.scale_operand)
    ep = walk_epilogue(mm, m, n, _absorb, ep)
    devices = tensor_devices(x, path.source, ep.col_scale, ep.bias)
    if len(devices) > 1:
        return Rejection(reason=f"mixed devices {sorted(map(str, devices))}", **base)
    return _record(site, path, ep, (m, k, n))


def _record(site: MatmulSite, path: _WeightPath, ep: Epilogue, shape: tuple[Any, Any, Any]) -> QuantLinear:
    """The record of a verified site: the scale where the graph multiplies it, and its fp32 cast if any."""
    mmv, outv = tensor_val(site.output), tensor_val(ep.output)
    assert mmv is not None and outv is not None and ep.output is not None
    cast = _scale_cast(ep.scale_operand, ep.col_scale, mmv.dtype)
    on = (
        ScaleSite.WEIGHT if path.scale is not None else ScaleSite.OUTPUT if ep.col_scale is not None else None
    )
    m, k, n = shape
    return QuantLinear(
        family=FAMILY,
        x=site.x,
        weight=path.source,
        weight_layout=weight_layout(path.flips),
        weight_scale=ep.col_scale,
        bias=ep.bias,
        compute_dtype=mmv.dtype,
        out_dtype=outv.dtype,
        m=m,
        k=k,
        n=n,
        output=ep.output,
        out_shape=ep.out_shape,
        nodes=(*ep.chain, *path.nodes, *(cast[1] if cast is not None else ())),
        matmul=site.kind,
        scale_site=on,
        scale_cast=cast[0] if cast is not None else None,
    )


def find(graph: fx.Graph) -> list[Candidate]:
    """Every woq-int8 candidate in `graph`, as records or rejections (non-candidates are not listed)."""
    found: list[Candidate] = []
    for node in list(graph.nodes):
        site = matmul_site(node)
        if site is not None:
            cand = _match(site)
            if cand is not None:
                found.append(cand)
    return found
