"""Dynamic int8 linears: per-token int8 activations x int8 weights, int32 accumulation, float rescale.

y = ((x_q - zx) @ (w_q - zw).T) * x_scale[M, 1] * w_scale[N] (+ bias), with x_q quantized in the graph.

Anchored on every matmul (`_int_mm`, `mm`, `addmm`) whose two operands both come from int8 tensors. One
structural walk per operand and one forward walk over the epilogue cover the forms users write:

- torchao `Int8DynamicActivationInt8WeightConfig` after flattening: `_int_mm(x_q, w.t())` (s8s8), or on
  CPUs with VNNI and no AMX `_int_mm((x_q + 128).to(uint8), w.t()) - 128 * w.sum(0)` (u8s8), then
  `* x_scale * w_scale (+ bias)`;
- int32 matmul spellings: `_int_mm`, `out_dtype(aten.mm, torch.int32, ...)` (traced to `mm` on int32
  operands), `torch.mm(x_q.to(int32), w_q.to(int32))`, and int8 values carried in float;
- the PT2E reference form: `quantized_decomposed` dequantize per token / per tensor on the activation and
  per channel on the weight, then a float `linear` — zero points become compensation terms;
- hand-written dequantize-then-float-matmul (`(x_q * s) @ (w_q * ws).T`).

Nothing here knows devices: the record says what the graph computes; lowerings decide how.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from qlower.patterns.epilogue import Absorb, Epilogue, site_bias, stored_nk, walk_epilogue, weight_layout
from qlower.patterns.graph_utils import (
    ADD_OPS,
    FLOAT_DTYPES,
    MUL_OPS,
    VIEW_OPS,
    Factor,
    aten,
    convert_target_dtype,
    factor_kind,
    has_single_user,
    is_call,
    is_static,
    is_transpose_2d,
    known_eq,
    tensor_devices,
    tensor_val,
)
from qlower.patterns.record import ActQuant, Candidate, QuantLinear, Rejection

FAMILY = "dynamic_int8"
_MAX_WALK = 16
_SUB_OPS = (aten.sub.Tensor,)
_DIV_OPS = (aten.div.Tensor,)
_INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)


def _qd(name: str) -> Any:
    """A `quantized_decomposed` overload, or None when that library is not loaded (torch without ao)."""
    ns = getattr(torch.ops, "quantized_decomposed", None)
    try:
        packet, _, overload = name.partition(".")
        return getattr(getattr(ns, packet), overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _qd_ops(*names: str) -> tuple[Any, ...]:
    return tuple(op for op in (_qd(n) for n in names) if op is not None)


@dataclass
class _Operand:
    """One matmul operand traced back to its int8 tensor: operand = (source - zero_point) * scale."""

    source: fx.Node
    flips: int = 0  # transposes between source and the matmul operand
    zero_point: fx.Node | int | None = None
    scale: fx.Node | float | None = None
    nodes: list[fx.Node] = field(default_factory=list)
    via: str = ""  # how the int8 values reach the matmul: "int", "float", "u8", "qdq"


def _is_dtype(node: Any, *dtypes: torch.dtype) -> bool:
    v = tensor_val(node)
    return v is not None and v.dtype in dtypes


def _strip(node: Any) -> Any:
    """The node under any views, expands and dtype converts (to compare scales by identity)."""
    for _ in range(_MAX_WALK):
        if not isinstance(node, fx.Node):
            return node
        if is_call(node, (*VIEW_OPS, aten.expand.default)) or convert_target_dtype(node) is not None:
            node = node.args[0]
        else:
            return node
    return node


def _scalar(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int_const(x: Any) -> int | None:
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return None


def _numel_one(x: Any) -> bool:
    v = tensor_val(x)
    return _scalar(x) or (v is not None and known_eq(v.numel(), 1))


def _dequant_ops() -> dict[str, tuple[Any, ...]]:
    return {
        "per_token": _qd_ops("dequantize_per_token"),
        "per_tensor": _qd_ops("dequantize_per_tensor", "dequantize_per_tensor.tensor"),
        "per_channel": _qd_ops("dequantize_per_channel"),
    }


def _dequant_path_op(node: fx.Node) -> bool:
    """Ops a dequantized int8 value flows through on its way into a matmul."""
    if is_transpose_2d(node) or convert_target_dtype(node) is not None or _is_row_of_vector(node):
        return True
    if is_call(node, (*VIEW_OPS, *MUL_OPS, *_SUB_OPS, *ADD_OPS)):
        return True
    return is_call(node, sum(_dequant_ops().values(), ()))


def _reaches_int8(node: Any, depth: int = 8) -> bool:
    """Whether an int8 tensor feeds `node` through dequant-path ops only (never through another matmul)."""
    if not isinstance(node, fx.Node) or depth == 0:
        return False
    if _is_dtype(node, torch.int8):
        return True
    if node.op != "call_function" or not _dequant_path_op(node):
        return False
    if is_call(node, (*MUL_OPS, *_SUB_OPS, *ADD_OPS)):
        return any(_reaches_int8(a, depth - 1) for a in node.args[:2])
    return _reaches_int8(node.args[0], depth - 1)


def _operand_factor(factor: Any, data: Any, role: str, flips: int) -> Factor | str:
    """An operand-side scale or zero point, proven per token on the activation, per output channel on the
    weight (or per tensor), as its un-expanded source; else why not.

    Walking back from the weight operand [K, N], `data` is [K, N] after an even number of transposes
    (per channel = varies along its last dim) and [N, K] after an odd one (varies along its first dim).
    """
    v = tensor_val(data)
    found = factor_kind(factor, v) if v is not None else None
    want = "row" if role == "x" or flips % 2 == 1 else "col"
    if found is None or found.kind not in ("one", want):
        return f"not per {'token' if role == 'x' else 'output channel'}"
    return found


def _is_row_of_vector(node: fx.Node) -> bool:
    """`unsqueeze(x, 0)` of a 1-D activation [K]: the one-row [1, K] matrix a vector-matrix product
    (`F.linear` / `@` of a 1-D input) multiplies."""
    if not is_call(node, (aten.unsqueeze.default,)) or node.args[1] != 0:
        return False
    v = tensor_val(node.args[0])
    return v is not None and v.dim() == 1


def _trace_operand(operand: Any, role: str) -> _Operand | str | None:
    """Walk from a matmul operand back to an int8 tensor.

    `role` is "x" (the [M, K] activation: views allowed, no transposes) or "w" (the weight operand [K, N]:
    transposes allowed). Returns the operand, a rejection reason, or None when int8 is not its source.
    """
    op = _Operand(source=operand)
    cur: Any = operand
    dq = _dequant_ops()
    for _ in range(_MAX_WALK):
        v = tensor_val(cur)
        if not isinstance(cur, fx.Node) or v is None:
            return None
        if role == "w" and is_transpose_2d(cur):
            op.flips += 1
        elif role == "x" and (is_call(cur, VIEW_OPS) or _is_row_of_vector(cur)):
            pass
        elif v.dtype == torch.int8:
            op.source, op.via = cur, op.via or "int"
            return op
        elif v.dtype == torch.uint8:
            # torchao's u8s8 trick: (x_q.to(int32) + 128).to(uint8); anything else is a uint8 activation.
            found = _u8_from_int8(cur)
            if found is None or role != "x" or op.zero_point is not None:
                return "uint8 operand that is not a shifted int8 tensor"
            source, shift, extra = found
            op.nodes += extra
            op.source, op.zero_point, op.via = source, -shift, "u8"
            return op
        elif convert_target_dtype(cur) is not None:
            src = tensor_val(cur.args[0])
            if src is not None and v.dtype.is_floating_point and not src.dtype.is_floating_point:
                op.via = op.via or "float"
        elif is_call(cur, dq["per_token"] + dq["per_tensor"] + dq["per_channel"]):
            return _dequant(op, cur, role, dq)
        elif is_call(cur, MUL_OPS) and op.scale is None and op.zero_point is None:
            a, b = cur.args[:2]
            data, scale = (a, b) if _reaches_int8(a) else (b, a)
            if not _reaches_int8(data) or _reaches_int8(scale):
                return None
            factor = _operand_factor(scale, data, role, op.flips)
            if isinstance(factor, str):
                return f"scale is {factor}"
            op.scale = factor.source
            op.nodes.append(cur)
            cur = data
            continue
        elif is_call(cur, _SUB_OPS) and op.zero_point is None and cur.kwargs.get("alpha", 1) == 1:
            a, b = cur.args[:2]
            if not _reaches_int8(a) or _reaches_int8(b):
                return None
            factor = _operand_factor(b, a, role, op.flips)
            if isinstance(factor, str):
                return f"zero point is {factor}"
            op.zero_point = factor.source
            op.nodes.append(cur)
            cur = a
            continue
        elif any(_reaches_int8(a) for a in cur.args if isinstance(a, fx.Node)):
            return f"int8 {role} reaches the matmul through {cur.target}, which dynamic_int8 does not express"
        else:
            return None
        op.nodes.append(cur)
        cur = cur.args[0]
    return None


def _dequant(op: _Operand, node: fx.Node, role: str, dq: dict[str, tuple[Any, ...]]) -> _Operand | str:
    """A `quantized_decomposed` dequantize ends the walk: (q - zero_point) * scale."""
    if op.scale is not None or op.zero_point is not None:
        return "two dequantize steps on one operand"
    q, scale, zp = node.args[:3]
    per_channel = is_call(node, dq["per_channel"])
    dtype = node.args[6] if per_channel else node.args[5]
    if not _is_dtype(q, torch.int8) or dtype != torch.int8:
        return f"{node.target} of a non-int8 tensor"
    if is_call(node, dq["per_token"]) and role != "x":
        return "per-token dequantize on the weight"
    if per_channel:
        if role != "w":
            return "per-channel dequantize on the activation"
        n_axis = 1 if op.flips % 2 == 0 else 0  # the int8 source is [K, N] after an even number of flips
        if node.args[3] % 2 != n_axis:
            return "weight dequantized per input channel (axis is K, not N)"
    op.nodes.append(node)
    op.source, op.scale, op.via = q, scale, "qdq"
    op.zero_point = None if _zero_by_definition(zp) else zp
    return op


def _zero_by_definition(zp: Any) -> bool:
    """A zero point known to be 0 at compile time: the constant 0, a constant tensor of zeros (export and
    AOTInductor see parameters as get_attr), or what `choose_qparams_per_token` (symmetric) returns."""
    if _int_const(zp) == 0:
        return True
    if isinstance(zp, fx.Node) and zp.op == "get_attr":
        value = _get_attr(zp)
        return isinstance(value, torch.Tensor) and not value.is_meta and not bool(value.any())
    if not is_call(zp, (operator.getitem,)) or zp.args[1] != 1:
        return False
    return is_call(zp.args[0], _qd_ops("choose_qparams_per_token"))


def _get_attr(node: fx.Node) -> Any:
    obj: Any = node.graph.owning_module
    for name in str(node.target).split("."):
        obj = getattr(obj, name, None)
    return obj


def _qdq_producers(x_q: fx.Node) -> list[fx.Node]:
    """A PT2E quantize node and the choose_qparams node (and getitems) that feed it.

    They join the record's nodes so the pass erases them once a lowering has inlined their computation.
    """
    qd = "quantized_decomposed"
    if not (isinstance(x_q.target, torch._ops.OpOverload) and x_q.target.namespace == qd):
        return []
    out = [x_q]
    for arg in x_q.args[1:3]:
        if is_call(arg, (operator.getitem,)):
            parent = arg.args[0]
            out.append(arg)
            if isinstance(parent.target, torch._ops.OpOverload) and parent.target.namespace == qd:
                out.append(parent)
    return list(dict.fromkeys(out))


def _u8_from_int8(node: fx.Node) -> tuple[fx.Node, int, list[fx.Node]] | None:
    """(int8 source, shift, nodes) when `node` is `(source.to(int) + shift).to(uint8)` with shift 128."""
    if convert_target_dtype(node) != torch.uint8:
        return None
    add = node.args[0]
    if not is_call(add, ADD_OPS) or _int_const(add.args[1]) != 128:
        return None
    widened = add.args[0]
    if convert_target_dtype(widened) is None or not _is_dtype(widened.args[0], torch.int8):
        return None
    return widened.args[0], 128, [node, add, widened]


def _shift_compensation(sub: fx.Node, acc: fx.Node, w_operand: fx.Node, shift: int) -> list[fx.Node] | None:
    """Nodes of `acc - shift * w_operand.sum(0, keepdim=True)` when `sub` is exactly that."""
    if not is_call(sub, _SUB_OPS) or sub.args[0] is not acc or sub.kwargs.get("alpha", 1) != 1:
        return None
    comp = sub.args[1]
    if not is_call(comp, MUL_OPS):
        return None
    a, b = comp.args[:2]
    total, factor = (a, b) if isinstance(a, fx.Node) else (b, a)
    if _int_const(factor) != shift or not is_call(total, (aten.sum.dim_IntList,)):
        return None
    if total.args[0] is not w_operand or list(total.args[1]) not in ([0], [-2]):
        return None
    return [sub, comp, total]


def _absorber(mm: fx.Node, w_operand: fx.Node, shift: int | None, need_row: bool, need_col: bool) -> Absorb:
    """The rescale chain after the matmul (`epilogue.walk_epilogue`): the u8s8 compensation, converts, the
    missing scales (row, column: `graph_utils.epilogue_factor`), then one bias; the op it stops at is the
    blocker a rejection names."""

    def absorb(user: fx.Node, cur: fx.Node, factor: Factor | None, ep: Epilogue) -> list[fx.Node] | None:
        uv = tensor_val(user)
        if uv is None:
            return None
        comp = _shift_compensation(user, mm, w_operand, shift) if shift is not None and cur is mm else None
        if comp is not None:
            ep.cancelled_shift = True
            return comp
        if convert_target_dtype(user) is not None and uv.dtype.is_floating_point:
            return [user]
        if is_call(user, MUL_OPS) and ep.bias is None and factor is not None:
            if factor.kind in ("row", "one") and need_row and ep.row_scale is None:
                ep.row_scale = factor.source
            elif factor.kind in ("col", "one") and need_col and ep.col_scale is None:
                ep.col_scale = factor.source
            else:
                return None
            return [user]
        bias_ok = factor is not None and factor.kind == "col" and isinstance(factor.source, fx.Node)
        if (
            is_call(user, ADD_OPS)
            and ep.bias is None
            and bias_ok
            and (not need_row or ep.row_scale is not None)
        ):
            ep.bias = factor.source  # type: ignore[union-attr]
            return [user]
        ep.blocker = user
        return None

    return absorb


def _no_row_scale_reason(blocker: fx.Node | None, n: int) -> str:
    """Why no per-token scale was found after the matmul: the op the epilogue walk stopped at, named."""
    if blocker is None:
        return "no per-token activation scale after the int matmul (an int-only matmul)"
    bv = tensor_val(blocker)
    what = f"{blocker.target}"
    if is_call(blocker, VIEW_OPS):
        shape = list(bv.shape) if bv is not None else "?"
        return f"a view to {shape} changes the last dim (N = {n}) before any per-token scale"
    if is_call(blocker, (*_SUB_OPS, *ADD_OPS)) and bv is not None and not bv.dtype.is_floating_point:
        return (
            f"the int matmul's product goes through {what}, an integer correction term dynamic_int8 does not "
            "express (only the u8s8 shift's), before any per-token scale"
        )
    if is_call(blocker, MUL_OPS):
        return "the int matmul's product is multiplied by a factor that is neither per token nor per channel"
    return f"the int matmul's product goes through {what} before any per-token scale"


def _describe_prologue(x_q: fx.Node) -> dict[str, Any]:
    """What produced the int8 activation: x_float, qmin/qmax, the quantize scale (best effort, for reports).

    Lowerings never depend on this: the matmul rewrite is exact for whatever produced x_q.
    """
    info: dict[str, Any] = {"qmin": -128, "qmax": 127, "x_float": None, "quant_scale": None}
    qpt = _qd_ops("quantize_per_token", "quantize_per_tensor", "quantize_per_tensor.tensor")
    if is_call(x_q, qpt):
        info.update(x_float=x_q.args[0], quant_scale=x_q.args[1], qmin=x_q.args[3], qmax=x_q.args[4])
        return info
    cur: Any = x_q
    for _ in range(_MAX_WALK):
        if not isinstance(cur, fx.Node) or cur.op != "call_function" or not cur.args:
            return info
        if cur.target is aten.clamp_min.default and _int_const(cur.args[1]) is not None:
            info["qmin"] = _int_const(cur.args[1])
        elif cur.target is aten.clamp_max.default and _int_const(cur.args[1]) is not None:
            info["qmax"] = _int_const(cur.args[1])
        elif cur.target is aten.clamp.default:
            lo, hi = (list(cur.args[1:3]) + [None, None])[:2]
            if _int_const(lo) is not None:
                info["qmin"] = _int_const(lo)
            if _int_const(hi) is not None:
                info["qmax"] = _int_const(hi)
        elif cur.target in _DIV_OPS:
            info.update(x_float=cur.args[0], quant_scale=cur.args[1])
            return info
        elif cur.target in MUL_OPS:
            a, b = cur.args[:2]
            av, bv = tensor_val(a), tensor_val(b)
            if av is not None and bv is not None and av.shape[-1] != 1 and known_eq(bv.shape[-1], 1):
                info.update(x_float=a, quant_scale=_reciprocal_of(b))
            elif av is not None and bv is not None and bv.shape[-1] != 1 and known_eq(av.shape[-1], 1):
                info.update(x_float=b, quant_scale=_reciprocal_of(a))
            return info
        cur = cur.args[0]
    return info


def _reciprocal_of(node: Any) -> Any:
    """s for `reciprocal(s)` or `reciprocal(s) * 1.0` (torchao's spelling), else the node itself."""
    if is_call(node, MUL_OPS) and _scalar(node.args[1]) and float(node.args[1]) == 1.0:
        node = node.args[0]
    return node.args[0] if is_call(node, (aten.reciprocal.default,)) else None


def _row_dtype(mm: fx.Node) -> torch.dtype | None:
    """The float dtype a report row shows (every family's rows show the activation's float dtype): the
    matmul's own where it is float, else the first float result of its rescale chain, else None."""
    cur: Any = mm
    for _ in range(_MAX_WALK):
        v = tensor_val(cur)
        if v is not None and v.dtype in FLOAT_DTYPES:
            return v.dtype
        if not has_single_user(cur):
            return None
        cur = next(iter(cur.users))
    return None


def _operands(mm: fx.Node) -> tuple[Any, fx.Node, fx.Node] | None:
    """(bias, a, b) of `_int_mm(a, b)`, `mm(a, b)` or `addmm(bias, a, b)` (beta = alpha = 1) on 2-D operands
    both computed from int8 tensors (an `_int_mm`'s are by definition), else None."""
    if mm.target is aten.addmm.default:
        if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1:
            return None
        bias, a, b = mm.args[:3]
    else:
        bias, (a, b) = None, mm.args[:2]
    av, bv, mmv = tensor_val(a), tensor_val(b), tensor_val(mm)
    if av is None or bv is None or mmv is None or av.dim() != 2 or bv.dim() != 2:
        return None
    if mm.target is not aten._int_mm.default and not (_reaches_int8(a) and _reaches_int8(b)):
        return None
    return bias, a, b


def _match(mm: fx.Node) -> Candidate | None:
    """The dynamic-int8 linear at an int matmul, a rejection naming its blocker, or None (not a candidate)."""
    found = _operands(mm)
    if found is None:
        return None
    bias, a, b = found
    x_op, w_op = _trace_operand(a, "x"), _trace_operand(b, "w")
    if x_op is None or w_op is None:
        return None
    av, bv = tensor_val(a), tensor_val(b)
    assert av is not None and bv is not None
    m = av.shape[0]
    base = dict(
        family=FAMILY, anchor=mm, device=av.device, dtype=_row_dtype(mm), shape=(m, av.shape[1], bv.shape[1])
    )
    for op, role in ((x_op, "activation"), (w_op, "weight")):
        if isinstance(op, str):
            return Rejection(reason=f"{role}: {op}", **base)
    assert isinstance(x_op, _Operand) and isinstance(w_op, _Operand)
    wv = tensor_val(w_op.source)
    if wv is None or wv.dim() != 2 or not all(is_static(d) for d in wv.shape):
        return Rejection(reason="weight is not a 2-D tensor of static shape", **base)
    n, k = (int(d) for d in stored_nk(wv, w_op.flips))
    base["shape"] = (m, k, n)
    xqv = tensor_val(x_op.source)
    if xqv is None or not known_eq(xqv.shape[-1], k):
        return Rejection(reason="activation is not an int8 [..., K] tensor flattened into the matmul", **base)
    if bias is not None and x_op.scale is None:
        return Rejection(reason="addmm adds its bias to an unscaled integer product", **base)
    bias = site_bias(bias, tensor_val(mm), kinds=("col",))
    if isinstance(bias, str):
        return Rejection(reason=bias, **base)
    return _rescaled(mm, b, x_op, w_op, bias, base)


def _rescaled(
    mm: fx.Node, w_operand: fx.Node, x_op: _Operand, w_op: _Operand, bias: Any, base: dict[str, Any]
) -> Candidate:
    """The record once the operands are known: the rescale after the matmul found, its scales complete."""
    m, k, n = base["shape"]
    shift = -x_op.zero_point if x_op.via == "u8" else None  # type: ignore[operator]
    need_row, need_col = x_op.scale is None and bias is None, w_op.scale is None and bias is None
    # the walk starts with the addmm's bias: a per-channel add after it stays in the graph (not a second bias)
    ep = walk_epilogue(
        mm,
        m,
        n,
        _absorber(mm, w_operand, shift, need_row, need_col),
        Epilogue(bias=bias),
        # a training graph's backward reads the product before its per-token scale (that scale's gradient):
        # without the scale there is no record, so the walk goes on and the rewrite keeps what it reads
        through_shared=lambda ep: need_row and ep.row_scale is None,
    )
    x_scale = x_op.scale if x_op.scale is not None else ep.row_scale
    w_scale = w_op.scale if w_op.scale is not None else ep.col_scale
    if x_scale is None:
        return Rejection(reason=_no_row_scale_reason(ep.blocker, n), **base)
    outv = tensor_val(ep.output)
    assert ep.output is not None and outv is not None
    if not outv.dtype.is_floating_point:
        return Rejection(reason=f"result stays {outv.dtype}", **base)
    if len(tensor_devices(x_op.source, w_op.source, x_scale, w_scale, ep.bias)) > 1:
        return Rejection(reason="mixed devices", **base)
    out_shape = None
    if outv.dim() != 2:
        out_shape = ep.out_shape if ep.out_shape is not None else list(outv.shape)
    w_zero = w_op.zero_point is None or _int_const(w_op.zero_point) == 0
    act = _act_quant(x_op, x_scale, ep.cancelled_shift)
    xfv = tensor_val(act.x_float)
    return QuantLinear(
        family=FAMILY,
        x=x_op.source,
        weight=w_op.source,
        weight_layout=weight_layout(w_op.flips),
        weight_scale=w_scale,
        bias=ep.bias,
        compute_dtype=xfv.dtype if xfv is not None and xfv.dtype in FLOAT_DTYPES else outv.dtype,
        out_dtype=outv.dtype,
        m=m,
        k=k,
        n=n,
        output=ep.output,
        out_shape=out_shape,
        nodes=(mm, *ep.chain, *x_op.nodes, *w_op.nodes, *_qdq_producers(x_op.source)),
        kept=_kept(mm, ep),
        matmul=_spelling(mm, x_op),
        act_quant=act,
        weight_zero_point=None if w_zero else w_op.zero_point,
    )


def _kept(mm: fx.Node, ep: Epilogue) -> tuple[fx.Node, ...]:
    """The matmul and the epilogue nodes up to the last one other nodes also read (`Epilogue.shared`): the
    rewrite leaves them in the graph for those readers."""
    if not ep.shared:
        return ()
    walked = [mm, *ep.chain]
    return tuple(walked[: walked.index(ep.shared[-1]) + 1])


def _spelling(mm: fx.Node, x_op: _Operand) -> str:
    """The record's `matmul`: how the graph multiplies the int8 values (see `QuantLinear.matmul`)."""
    if x_op.via == "float":
        return "dequant_mm" if x_op.scale is not None else "float_mm"
    if x_op.via in ("int", "u8"):
        return "int_mm" if mm.target is aten._int_mm.default else "int32_mm"
    return x_op.via


def _act_quant(x_op: _Operand, x_scale: Any, cancelled_shift: bool) -> ActQuant:
    """The activation's quantization: scheme, zero point, and what produced x_q (`_describe_prologue`)."""
    pro = _describe_prologue(x_op.source)
    zero_point = None if cancelled_shift else x_op.zero_point
    per = "per_tensor" if _numel_one(x_scale) else "per_token"
    sym = "symmetric" if zero_point is None or _int_const(zero_point) == 0 else "asymmetric"
    matched = pro["quant_scale"] is not None and _strip(pro["quant_scale"]) is _strip(x_scale)
    return ActQuant(
        scheme=f"{per}_{sym}",
        x_q=x_op.source,
        x_scale=x_scale,
        qmin=int(pro["qmin"]),
        qmax=int(pro["qmax"]),
        x_float=pro["x_float"],
        zero_point=zero_point,
        u8_shift="compensated" if cancelled_shift else "zero_point" if x_op.via == "u8" else None,
        prologue="matched" if matched else "opaque",
        quantized_decomposed=x_op.via == "qdq",
    )


def describes(mm: fx.Node) -> bool:
    """Whether this family records the matmul `mm` exactly (a QuantLinear, not a rejection): another
    family's recognizer must then leave it to this one, whichever families are enabled and in any order."""
    return is_call(mm, (aten._int_mm.default, aten.mm.default, aten.addmm.default)) and isinstance(
        _match(mm), QuantLinear
    )


def find(graph: fx.Graph) -> list[Candidate]:
    """Every dynamic-int8 candidate in `graph`, as records or rejections (non-candidates are not listed)."""
    found: list[Candidate] = []
    for node in list(graph.nodes):
        if is_call(node, (aten._int_mm.default, aten.mm.default, aten.addmm.default)):
            cand = _match(node)
            if cand is not None:
                found.append(cand)
    return found
