"""Weight-only int8 linears: y = (x @ (w_int8 -> float).T) * per-channel scale [+ bias].

Anchored on every matmul (`mm`, `addmm`, or the decomposed matrix-vector form; see
`graph_utils.matmul_site`) whose weight operand is a dequantized int8 tensor. One structural walk covers
the graph forms users write: gpt-fast (`F.linear(x, w.to(x.dtype)) * s`), scale on the weight
(`F.linear(x, w.to(x.dtype) * s[:, None])`), torchao `Int8WeightOnlyConfig` after flattening
(`mm(x, w.t().to(dtype)) * s`), with or without bias, any input rank (views around the mm), scales 1-D or
[N, 1] in any float dtype, weight [N, K] or stored [K, N].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from .graph_utils import (
    ADD_OPS,
    FLOAT_DTYPES,
    MUL_OPS,
    VIEW_OPS,
    MatmulSite,
    broadcasts_along_last_dim,
    convert_target_dtype,
    has_single_user,
    is_call,
    is_static,
    is_transpose_2d,
    known_eq,
    matmul_site,
    tensor_devices,
    tensor_val,
)
from .record import Candidate, QuantLinear, Rejection

FAMILY = "woq_int8"
_MAX_WALK = 12


@dataclass
class _WeightPath:
    source: fx.Node  # the int8 tensor
    flips: int  # transposes between the int8 source and the matmul operand
    scale: fx.Node | float | None = None
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
            path.scale, path.scale_flips = scale, path.flips
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


def _is_channel_vector(other: Any, out: torch.Tensor) -> bool:
    """A per-output-channel scale or bias: a number, or a tensor of at most one dim along N.

    Only 0-d/1-d tensors qualify: at M = 1 a residual or a gate activation ([1, 1, N]) also broadcasts
    along N alone, but it is an activation, not part of this linear.
    """
    v = tensor_val(other)
    if v is not None and v.dim() > 1:
        return False
    return broadcasts_along_last_dim(other, out)


def _is_float_scalar_or_tensor(x: Any) -> bool:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return True
    v = tensor_val(x)
    return v is not None and v.dtype.is_floating_point


def _match(site: MatmulSite) -> Candidate | None:
    mm, x, operand, bias = site.output, site.x, site.operand, site.bias
    path = _trace_weight(operand)
    if path is None:
        return None
    xv, mmv = tensor_val(x), tensor_val(mm)
    if xv is None or mmv is None:
        return None
    m, k, n = xv.shape[0], xv.shape[1], mmv.shape[1]
    base = dict(family=FAMILY, anchor=mm, device=xv.device, dtype=xv.dtype, shape=(m, k, n))
    if isinstance(path, str):
        return Rejection(reason=path, **base)
    wv = tensor_val(path.source)
    if wv is None or wv.dim() != 2:
        return Rejection(reason="weight is not a 2-D tensor", **base)
    # K and N come from the weight: static for parameters even when Dynamo marks activation dims dynamic.
    n, k = (wv.shape[0], wv.shape[1]) if path.flips % 2 == 1 else (wv.shape[1], wv.shape[0])
    n, k = (int(n) if is_static(n) else n), (int(k) if is_static(k) else k)
    base["shape"] = (m, k, n)
    if xv.dtype not in FLOAT_DTYPES:
        return Rejection(reason=f"activation dtype {xv.dtype} is not bf16/fp16/fp32", **base)
    if not _weight_scale_ok(path, n):
        return Rejection(
            reason="weight scale does not broadcast per output channel (per-K or block scales)", **base
        )

    # Walk forward: views, one per-channel multiply (if the weight carried none), one bias add.
    scale, out_shape, cur = path.scale, None, mm
    chain: list[fx.Node] = list(site.nodes)
    while has_single_user(cur):
        user = next(iter(cur.users))
        uv = tensor_val(user)
        if uv is None:
            break
        if is_call(user, VIEW_OPS) and user.args[0] is cur:
            out_shape = list(user.args[1])
        elif is_call(user, MUL_OPS) and scale is None and bias is None:
            other = user.args[1] if user.args[0] is cur else user.args[0]
            if other is cur or not _is_channel_vector(other, uv) or not _is_float_scalar_or_tensor(other):
                break
            scale = other
        elif is_call(user, ADD_OPS) and bias is None and user.kwargs.get("alpha", 1) == 1:
            other = user.args[1] if user.args[0] is cur else user.args[0]
            if other is cur or not isinstance(other, fx.Node) or not _is_channel_vector(other, uv):
                break
            bias = other
        else:
            break
        chain.append(user)
        cur = user

    if len(tensor_devices(x, path.source, scale, bias)) > 1:
        return Rejection(
            reason=f"mixed devices {sorted(map(str, tensor_devices(x, path.source, scale, bias)))}", **base
        )
    outv = tensor_val(cur)
    form = "+".join(
        p
        for p in (
            site.kind,
            "weight_scale"
            if path.scale is not None
            else ("output_scale" if scale is not None else "no_scale"),
            "bias" if bias is not None else "",
            "nd" if out_shape is not None else "",
            "kn_weight" if path.flips % 2 == 0 else "",
        )
        if p
    )
    return QuantLinear(
        family=FAMILY,
        x=x,
        weight=path.source,
        weight_layout="NK" if path.flips % 2 == 1 else "KN",
        weight_scale=scale,
        bias=bias,
        compute_dtype=mmv.dtype,
        out_dtype=outv.dtype,
        m=m,
        k=k,
        n=n,
        output=cur,
        out_shape=out_shape,
        nodes=tuple(chain) + tuple(path.nodes),
        form=form,
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
