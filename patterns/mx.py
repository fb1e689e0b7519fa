"""MX linears (MXFP8, MXFP4): y = dequant_mx(x or x_q) @ dequant_mx(w).T [+ bias].

Anchored on every matmul (`mm`, `addmm`, or the decomposed matrix-vector form of M = 1 on GPUs; see
`graph_utils.matmul_site`). An MX dequantization is a multiply of decoded elements by decoded block
scales; graphs spell both halves in many ways (torchao's EMULATED MXTensor flattened: bit-twiddled fp4
unpacking, `pow(2, e - 127)` with a NaN guard, the weight's scales un-swizzled from 128x4 tiles;
hand-written `q.float().view(N, K // 32, 32) * 2 ** (e - 127)`, `exp2`, `e8m0.float()`,
`repeat_interleave`). Rather than enumerate spellings, the recognizer finds the two inputs the multiply
depends on (the element tensor and the 8-bit scale codes, where all paths of pointwise/layout ops meet) and
*runs* the subgraph between them on probe values covering every code (shrunk to a few rows), checking it
computes elem(q) * 2 ** (code - 127) exactly. Both sides of the matmul dequantized: dynamic activation MX
(the activation's quantize nodes are kept as the record's ActQuant); only the weight: weight-only MX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch
from torch import fx

from . import mx_format as fmt
from .graph_utils import (
    ADD_OPS,
    FLOAT_DTYPES,
    HOST_DEVICE,
    VIEW_OPS,
    MatmulSite,
    aten,
    broadcasts_along_last_dim,
    convert_target_dtype,
    has_single_user,
    is_call,
    is_static,
    is_transpose_2d,
    matmul_site,
    prims,
    tensor_val,
)
from .record import ActQuant, Candidate, QuantLinear, Rejection

FAMILY = "mx"
BLOCK = fmt.BLOCK
_MAX_DECODE_NODES = 400
_PROBE_NUMEL = 1 << 16  # evaluate at full size up to this many elements, else shrink the rows
_FULL_EVAL_LIMIT = 1 << 24

_LAYOUT_OPS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.expand.default,
    aten.clone.default,
    aten.alias.default,
    aten.slice.Tensor,
    aten.cat.default,
    aten.stack.default,
    aten.view.dtype,
    aten.lift_fresh_copy.default,
}
# Constants and moves: a table built on the host and moved to the data's device (`torch.tensor(list,
# device=...)` traces under dynamic shapes as scalar_tensor + cat, then prims.device_put; `.to(device)`
# reaches the pass decomposed into the same prims.device_put).
_DECODE_EXTRA = {
    aten.index_put.default,
    aten.index.Tensor,
    aten.full.default,
    aten.scalar_tensor.default,
    prims.device_put.default,
}
# Ops whose argument (position) is an output shape: rewritten when the probe runs on fewer rows.
_SHAPE_ARG = {
    aten.view.default: 1,
    aten.reshape.default: 1,
    aten._unsafe_view.default: 1,
    aten.expand.default: 1,
    aten.full.default: 0,
}
_BITCAST_8BIT = (torch.uint8, torch.int8, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)


def _is_decode_op(node: fx.Node) -> bool:
    """Pointwise, layout or constant ops: what may sit between stored MX data and its decoded values."""
    if node.op != "call_function":
        return False
    t = node.target
    if t in _LAYOUT_OPS or t in _DECODE_EXTRA or t is prims.convert_element_type.default:
        return True
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags


def _is_const_leaf(node: fx.Node) -> bool:
    """Inputs the probe can evaluate without the real data: small tensor attributes and symbolic sizes."""
    v = node.meta.get("val")
    if isinstance(v, (int, float, torch.SymInt, torch.SymFloat)):
        return True
    return node.op == "get_attr" and isinstance(v, torch.Tensor) and v.numel() <= 64


def _hint(x: Any) -> Any:
    if isinstance(x, torch.SymInt):
        if x.node.hint is not None:
            return int(x.node.hint)
        return int(x.node.shape_env.size_hint(x.node.expr))
    return x


def _concrete_shape(node: fx.Node) -> list[int]:
    v = tensor_val(node)
    assert v is not None
    return [int(_hint(s)) for s in v.shape]


@dataclass
class _Decode:
    """Where all paths from a decoded value meet in one stored tensor, and the ops in between."""

    boundary: fx.Node
    inner: list[fx.Node]  # graph order
    consts: list[fx.Node] = field(default_factory=list)


def _meet(start: fx.Node, accept: Callable[[fx.Node], bool], order: dict[fx.Node, int]) -> _Decode | None:
    """Walk back from `start` through decode ops until every path passes one node that `accept`s.

    Popping the latest node of the frontier keeps the frontier a cut of the subgraph, so a frontier of one
    node is a dominator of `start` (all its inputs flow through it).
    """
    frontier: dict[fx.Node, None] = {start: None}
    inner: list[fx.Node] = []
    consts: list[fx.Node] = []
    while frontier:
        if len(frontier) == 1:
            (only,) = frontier
            if only is not start and accept(only):
                inner.sort(key=order.__getitem__)
                return _Decode(only, inner, consts)
        node = max(frontier, key=order.__getitem__)
        del frontier[node]
        if not _is_decode_op(node) or len(inner) >= _MAX_DECODE_NODES:
            return None
        inner.append(node)
        for inp in node.all_input_nodes:
            if _is_const_leaf(inp):
                consts.append(inp)
            elif inp not in inner:
                frontier[inp] = None
    return None


class _NoShrink(Exception):
    pass


def _shrink(shape: list[int], rows: int, new_rows: int) -> list[int]:
    """The same row-major shape for `new_rows` rows instead of `rows` (the first prefix holding whole rows)."""
    if new_rows == rows or prod(shape) % rows:
        return list(shape)
    acc = 1
    for d, s in enumerate(shape):
        acc *= s
        if acc % rows == 0:
            if (s * new_rows) % rows:
                raise _NoShrink(shape)
            return [*shape[:d], s * new_rows // rows, *shape[d + 1 :]]
    raise _NoShrink(shape)


def _evaluate(
    nodes: list[fx.Node],
    leaves: dict[fx.Node, torch.Tensor],
    rows: int,
    new_rows: int,
    graph: fx.Graph,
    bitcast_is_identity: bool = False,
) -> dict[fx.Node, Any]:
    """Run `nodes` (graph order) on the host with `leaves` bound, shape arguments rewritten for `new_rows` rows.

    `bitcast_is_identity` passes same-width `view.dtype` through unchanged (index probes of layouts).
    """
    env: dict[fx.Node, Any] = dict(leaves)
    module = graph.owning_module

    def value(n: fx.Node) -> Any:
        if n in env:
            return env[n]
        v = n.meta.get("val")
        if n.op == "get_attr" and module is not None:
            return getattr(module, str(n.target)).detach().to(HOST_DEVICE)
        if isinstance(v, torch.SymInt):
            return _hint(v)
        raise _NoShrink(f"no value for {n}")

    for node in nodes:
        if (bitcast_is_identity and node.target is aten.view.dtype) or node.target is prims.device_put.default:
            env[node] = value(node.args[0])  # the probe runs on the host: a device move is the identity
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
        args = list(args)
        kwargs = dict(kwargs)
        if "device" in kwargs:
            kwargs["device"] = HOST_DEVICE
        if "pin_memory" in kwargs:
            kwargs["pin_memory"] = False
        pos = _SHAPE_ARG.get(node.target)
        if pos is not None:
            args[pos] = _shrink(_concrete_shape(node), rows, new_rows)
        if node.target is aten.slice.Tensor and new_rows != rows:
            src = tensor_val(node.args[0])
            dim = args[1] if len(args) > 1 else 0
            assert src is not None
            old, new = int(_hint(src.shape[dim])), args[0].shape[dim]
            end = args[3] if len(args) > 3 else None
            if old != new and end is not None and end < old:
                raise _NoShrink("slice along the rows")
        env[node] = node.target(*args, **kwargs)
    return env


def _probe_rows(rows: int, per_row: int) -> int:
    """How many rows the probe evaluates: all when small, else a divisor of `rows` covering all 256 codes."""
    if rows * per_row <= _PROBE_NUMEL:
        return rows
    want = max(2, -(-256 * BLOCK // per_row))
    for r in range(want, min(rows, 4 * want + 64) + 1):
        if rows % r == 0:
            return r
    return rows


def _code_probe(numel: int, exclude: tuple[int, ...] = ()) -> torch.Tensor:
    codes = torch.arange(numel) * 37 % 256  # a permutation of 0..255 repeated: neighbours differ
    for c in exclude:
        codes[codes == c] = 0
    return codes.to(torch.uint8)


_FP8_NAN = {"e4m3": (0x7F, 0xFF), "e5m2": tuple(range(0x7C, 0x80)) + tuple(range(0xFC, 0x100))}


@dataclass
class _MXOperand:
    """One MX-dequantized matmul operand: value[r, k] = elem(q)[r, k] * 2 ** (e[r, k // 32] - 127)."""

    elem: str
    q: fx.Node  # element boundary, logically [rows, K] (fp8) or [rows, K / 2] (packed e2m1)
    e: fx.Node  # scale-code boundary (uint8 / e8m0), numel rows * K / 32
    e_assoc: str  # "nk": e's row-major order is [rows, K / 32]; "kn": it is [K / 32, rows]
    rows: Any
    k: int
    nodes: list[fx.Node]  # mul, the decode ops and the chain up to the matmul


def _elem_of(node: fx.Node, rows: Any, k: int) -> str | None:
    v = tensor_val(node)
    if v is None or v.numel() == 0:
        return None
    elem = fmt.elem_of_dtype(v.dtype)
    numel = rows * (k // 2 if elem == "e2m1" else k)
    if elem is None or not _same(v.numel(), numel):
        return None
    return elem


def _same(a: Any, b: Any) -> bool:
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def _is_codes(node: fx.Node, numel: Any) -> bool:
    v = tensor_val(node)
    return v is not None and v.dtype in (torch.uint8, torch.float8_e8m0fnu) and _same(v.numel(), numel)


def _verify(
    mul: fx.Node, q: _Decode, e: _Decode, elem: str, rows: Any, k: int, graph: fx.Graph
) -> str | None:
    """Run the dequant subgraph on probes; returns the association of the scale codes, or None."""
    nrows = int(_hint(rows))
    new_rows = _probe_rows(nrows, k)
    per_q_row = k // 2 if fmt.packed(elem) else k
    nodes = sorted({*q.inner, *e.inner, mul}, key=lambda n: _order_of(graph)[n])
    for r in dict.fromkeys((new_rows, nrows)):
        if r * k > _FULL_EVAL_LIMIT:
            continue
        qbytes = _code_probe(r * per_q_row, _FP8_NAN.get(elem, ()))
        ecodes = _code_probe(r * (k // BLOCK))
        qv, ev = tensor_val(q.boundary), tensor_val(e.boundary)
        assert qv is not None and ev is not None
        try:
            q_in = qbytes.view(qv.dtype).reshape(_shrink(_concrete_shape(q.boundary), nrows, r))
            e_in = ecodes.view(ev.dtype).reshape(_shrink(_concrete_shape(e.boundary), nrows, r))
            with torch.no_grad():
                out = _evaluate(nodes, {q.boundary: q_in, e.boundary: e_in}, nrows, r, graph)[mul]
        except (_NoShrink, RuntimeError, TypeError, ValueError, IndexError):
            continue
        if out.numel() != r * k or not out.dtype.is_floating_point:
            return None
        out = out.reshape(r, k)
        q_logical = qbytes.reshape(r, per_q_row)
        if elem in fmt.FP8_DTYPE:
            q_logical = q_logical.view(fmt.FP8_DTYPE[elem])
        for assoc in ("nk", "kn"):
            codes = ecodes.reshape(r, k // BLOCK) if assoc == "nk" else ecodes.reshape(k // BLOCK, r).t()
            want = fmt.dequantize_f64(q_logical, codes, elem).to(out.dtype)
            check = (codes != 0) & (codes != fmt.E8M0_NAN)
            mask = check.repeat_interleave(BLOCK, dim=1)
            if torch.equal(out[mask], want[mask]):
                return assoc
        return None
    return None


_ORDER_CACHE: dict[int, tuple[int, dict[fx.Node, int]]] = {}


def _order_of(graph: fx.Graph) -> dict[fx.Node, int]:
    key = id(graph)
    n = len(graph.nodes)
    hit = _ORDER_CACHE.get(key)
    if hit is None or hit[0] != n:
        hit = (n, {node: i for i, node in enumerate(graph.nodes)})
        _ORDER_CACHE.clear()
        _ORDER_CACHE[key] = hit
    return hit[1]


def _walk_to_mul(operand: fx.Node, want_flips: int) -> tuple[fx.Node, list[fx.Node]] | None:
    """From a matmul operand back through transposes, float converts and views to the dequant multiply."""
    cur, flips, chain = operand, 0, []
    for _ in range(8):
        if not isinstance(cur, fx.Node) or tensor_val(cur) is None:
            return None
        if is_call(cur, (aten.mul.Tensor,)):
            return (cur, chain) if flips % 2 == want_flips else None
        dtype = convert_target_dtype(cur)
        if is_transpose_2d(cur):
            flips += 1
        elif dtype is not None:
            src = tensor_val(cur.args[0])
            if src is None or not src.dtype.is_floating_point or src.dtype in _BITCAST_8BIT:
                return None
        elif not is_call(cur, (*VIEW_OPS, aten.clone.default)):
            return None
        chain.append(cur)
        cur = cur.args[0]
    return None


def _find_operand(operand: fx.Node, want_flips: int, graph: fx.Graph) -> _MXOperand | Rejection | None:
    walked = _walk_to_mul(operand, want_flips)
    if walked is None:
        return None
    mul, chain = walked
    ov = tensor_val(operand)
    assert ov is not None
    rows, k = (ov.shape[1], ov.shape[0]) if want_flips else (ov.shape[0], ov.shape[1])
    if not is_static(k):
        return None
    k = int(k)
    order = _order_of(graph)
    a, b = mul.args[:2]
    for data, scale in ((a, b), (b, a)):
        if not isinstance(data, fx.Node) or not isinstance(scale, fx.Node):
            continue
        q = _meet(data, lambda n: _elem_of(n, rows, k) is not None, order)
        if q is None:
            continue
        elem = _elem_of(q.boundary, rows, k)
        assert elem is not None
        blocks = -(-k // BLOCK)
        e = _meet(scale, lambda n, c=rows * blocks: _is_codes(n, c), order)
        if e is None:
            continue
        if k % BLOCK:
            return Rejection(
                family=FAMILY,
                anchor=mul,
                reason=f"K={k} is not a multiple of the MX block size {BLOCK} (partial last block)",
                dtype=tensor_val(q.boundary).dtype,  # type: ignore[union-attr]
            )
        assoc = _verify(mul, q, e, elem, rows, k, graph)
        if assoc is None:
            continue
        return _MXOperand(elem, q.boundary, e.boundary, assoc, rows, k, [*chain, mul, *q.inner, *e.inner])
    return None


# ---- from the boundaries to the stored tensors: transposes of the elements, layout of the scales ----


def _q_source(q: fx.Node) -> tuple[fx.Node, int]:
    """Follow transposes / no-op views / 8-bit bitcasts from the element boundary to the stored tensor."""
    flips = 0
    while isinstance(q, fx.Node) and q.op == "call_function":
        v, src = tensor_val(q), tensor_val(q.args[0]) if q.args else None
        if v is None or src is None:
            break
        if is_transpose_2d(q):
            flips += 1
        elif q.target is aten.view.dtype and v.dtype in _BITCAST_8BIT and src.dtype in _BITCAST_8BIT:
            pass
        elif is_call(q, (*VIEW_OPS, aten.clone.default, aten.alias.default)) and list(v.shape) == list(
            src.shape
        ):
            pass
        else:
            break
        q = q.args[0]
    return q, flips


_RESHAPE_ONLY = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.alias.default,
    aten.clone.default,
}


def _scale_source(e: fx.Node, rows: Any, cols: int, assoc: str, graph: fx.Graph) -> tuple[fx.Node, str]:
    """The stored scale tensor behind the code boundary and its layout: plain, plain_t, swizzled or other.

    plain: source.reshape(rows, cols) are the codes; plain_t: source.reshape(cols, rows).t(); swizzled: the
    flat 128x4-tiled tensor (`mx_format.swizzle_offsets`); other: only the boundary node itself is known.
    """
    chain: list[fx.Node] = []
    src = e
    while (
        src.op == "call_function"
        and src.target in _LAYOUT_OPS - {aten.cat.default, aten.stack.default, aten.lift_fresh_copy.default}
        and tensor_val(src.args[0]) is not None
        and (src.target is not aten.view.dtype or tensor_val(src.args[0]).dtype in _BITCAST_8BIT)  # type: ignore[union-attr]
    ):
        chain.append(src)
        src = src.args[0]
    if not chain:
        return e, "plain" if assoc == "nk" else "plain_t"
    if not is_static(rows) or not all(is_static(s) for s in tensor_val(src).shape):  # type: ignore[union-attr]
        if all(n.target in _RESHAPE_ONLY or n.target is aten.view.dtype for n in chain):
            return src, "plain" if assoc == "nk" else "plain_t"
        return e, "other"
    rows = int(rows)
    sv = tensor_val(src)
    assert sv is not None
    index = torch.arange(sv.numel()).reshape(list(sv.shape))
    order = _order_of(graph)
    chain.sort(key=order.__getitem__)
    try:
        with torch.no_grad():
            idx = _evaluate(chain, {src: index}, rows, rows, graph, bitcast_is_identity=True)[e]
    except (_NoShrink, RuntimeError, TypeError, ValueError, IndexError, KeyError):
        return e, "other"
    logical = idx.reshape(rows, cols) if assoc == "nk" else idx.reshape(cols, rows).t()
    n = rows * cols
    if torch.equal(logical, torch.arange(n).reshape(rows, cols)):
        return src, "plain"
    if torch.equal(logical, torch.arange(n).reshape(cols, rows).t()):
        return src, "plain_t"
    if sv.numel() == fmt.swizzled_numel(rows, cols) and torch.equal(logical, fmt.swizzle_offsets(rows, cols)):
        return src, "swizzled"
    return e, "other"


def _rounding(x_q: fx.Node, x_scale: fx.Node) -> str:
    """Best-effort name of the activation's scale rounding (for reports): floor, rceil or unknown."""
    seen, todo, targets = set(), [x_scale, x_q], set()
    while todo and len(seen) < 200:
        n = todo.pop()
        if not isinstance(n, fx.Node) or n in seen:
            continue
        seen.add(n)
        targets.add(n.target)
        if n.target in (aten.amax.default, aten.max.dim):
            continue
        todo.extend(n.all_input_nodes)
    if aten.ceil.default in targets and aten.log2.default in targets:
        return "rceil"
    if targets & {aten.bitwise_right_shift.Tensor_Scalar, aten.__rshift__.Scalar, aten.floor.default}:
        return "floor"
    return "unknown"


def _x_float(x_q: fx.Node, m: Any, k: int) -> fx.Node | None:
    """The float activation the in-graph quantization started from, if any (first-argument chain)."""
    cur, found = x_q, None
    for _ in range(64):
        if not isinstance(cur, fx.Node) or cur.op != "call_function" or not cur.args:
            break
        cur = cur.args[0]
        v = tensor_val(cur)
        if isinstance(cur, fx.Node) and v is not None and v.dtype in FLOAT_DTYPES and _same(v.numel(), m * k):
            found = cur
    return found


def _forward(mm: fx.Node, bias: Any) -> tuple[fx.Node, list[fx.Node], list[Any] | None, Any]:
    """Views, one bias add and one dtype convert after the matmul: the node whose value the lowering replaces."""
    cur, chain, out_shape = mm, [mm], None
    while has_single_user(cur):
        user = next(iter(cur.users))
        uv = tensor_val(user)
        if uv is None:
            break
        if is_call(user, VIEW_OPS) and user.args[0] is cur:
            out_shape = list(user.args[1])
        elif is_call(user, ADD_OPS) and bias is None and user.kwargs.get("alpha", 1) == 1:
            other = user.args[1] if user.args[0] is cur else user.args[0]
            if other is cur or not isinstance(other, fx.Node) or not broadcasts_along_last_dim(other, uv):
                break
            bias = other
        elif convert_target_dtype(user) in FLOAT_DTYPES and out_shape is None:
            pass
        else:
            break
        chain.append(user)
        cur = user
    return cur, chain, out_shape, bias


def _match(site: MatmulSite, graph: fx.Graph) -> Candidate | None:
    mm, bias, x, w_op = site.output, site.bias, site.x, site.operand
    if not isinstance(w_op, fx.Node) or not isinstance(x, fx.Node):
        return None
    w = _find_operand(w_op, 1, graph)
    if w is None:
        return None
    xv, mmv = tensor_val(x), tensor_val(mm)
    if xv is None or mmv is None:
        return None
    m = xv.shape[0]
    if isinstance(w, Rejection):
        w.shape, w.device, w.anchor = (m, tensor_val(w_op).shape[0], tensor_val(w_op).shape[1]), xv.device, mm  # type: ignore[union-attr]
        return w
    k, n = w.k, int(w.rows)
    base = dict(family=FAMILY, anchor=mm, device=xv.device, dtype=xv.dtype, shape=(m, k, n))
    a = _find_operand(x, 0, graph)
    if isinstance(a, Rejection):
        a.shape, a.device, a.anchor = base["shape"], xv.device, mm
        return a
    act_quant = None
    nodes = list(w.nodes)
    if a is not None:
        x_q, x_flips = _q_source(a.q)
        if x_flips % 2:
            return Rejection(reason="quantized activation is stored transposed ([K, M])", **base)
        x_scale, x_layout = _scale_source(a.e, m, k // BLOCK, a.e_assoc, graph)
        act_quant = ActQuant(
            scheme="mx_block",
            x_q=x_q,
            x_scale=x_scale,
            x_float=_x_float(x_q, m, k),
            details={
                "elem": a.elem,
                "scale_layout": x_layout,
                "scale_codes": a.e,
                "scale_assoc": a.e_assoc,
                "rounding": _rounding(x_q, x_scale),
            },
        )
        nodes += a.nodes
    elif xv.dtype not in FLOAT_DTYPES:
        return Rejection(reason=f"activation dtype {xv.dtype} is neither float nor MX-dequantized", **base)
    w_src, flips = _q_source(w.q)
    w_scale, w_layout = _scale_source(w.e, n, k // BLOCK, w.e_assoc, graph)
    devices = {v.device for v in map(tensor_val, (x, w_src, w_scale, bias)) if v is not None and v.dim() > 0}
    if len(devices) > 1:
        return Rejection(reason=f"mixed devices {sorted(map(str, devices))}", **base)
    out, chain, out_shape, bias = _forward(mm, bias)
    outv = tensor_val(out)
    assert outv is not None
    form = "+".join(
        p
        for p in (
            "dynamic" if act_quant else "weight_only",
            f"{act_quant.details['elem']}x{w.elem}" if act_quant else w.elem,
            f"w_scale_{w_layout}",
            site.kind,
            "bias" if bias is not None else "",
            "nd" if out_shape is not None else "",
        )
        if p
    )
    return QuantLinear(
        family=FAMILY,
        x=x,
        weight=w_src,
        weight_layout="NK" if flips % 2 == 0 else "KN",
        weight_scale=w_scale,
        bias=bias,
        compute_dtype=mmv.dtype,
        out_dtype=outv.dtype,
        m=m,
        k=k,
        n=n,
        output=out,
        out_shape=out_shape,
        nodes=tuple(dict.fromkeys(chain + list(site.nodes) + nodes)),
        act_quant=act_quant,
        weight_block=BLOCK,
        form=form,
        details={
            "w_elem": w.elem,
            "w_scale_layout": w_layout,
            "w_scale_codes": w.e,
            "w_scale_assoc": w.e_assoc,
        },
    )


def _inside_outer_matvec(site: MatmulSite) -> bool:
    """The `sum` of a matrix-vector form whose dtype convert is a site too: only the outer one is a record."""
    if site.kind != "matvec" or not has_single_user(site.output):
        return False
    outer = matmul_site(next(iter(site.output.users)))
    return outer is not None and site.output in outer.nodes


def find(graph: fx.Graph) -> list[Candidate]:
    """Every MX linear candidate in `graph`, as records or rejections (non-candidates are not listed)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    found: list[Candidate] = []
    with unset_fake_temporarily():  # the probes run on real host tensors, inside Inductor's fake mode
        for node in list(graph.nodes):
            site = matmul_site(node)
            if site is None or _inside_outer_matvec(site):
                continue
            cand = _match(site, graph)
            if cand is not None:
                found.append(cand)
    _ORDER_CACHE.clear()
    return found


__all__ = ["BLOCK", "FAMILY", "find"]
