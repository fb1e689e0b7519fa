"""MX linears (MXFP8, MXFP4): y = dequant_mx(x or x_q) @ dequant_mx(w).T [+ bias].

Anchored on every matmul (`mm`, `addmm`, or the decomposed matrix-vector form of M = 1; see
`graph_utils.matmul_site`). An MX dequantization is a multiply of decoded elements by decoded block
scales; graphs spell both halves in many ways (torchao's EMULATED MXTensor flattened: bit-twiddled fp4
unpacking, `pow(2, e - 127)` with a NaN guard, the weight's scales un-swizzled from 128x4 tiles;
hand-written `q.float().view(N, K // 32, 32) * 2 ** (e - 127)`, `exp2`, `e8m0.float()`,
`repeat_interleave`). Rather than enumerate spellings, the recognizer finds the two inputs the multiply
depends on (the element tensor and the 8-bit scale codes, where all paths of pointwise/layout ops meet) and
has `mx_verify` *run* the subgraph between them on probe values covering every code, checking it computes
elem(q) * 2 ** (code - 127) exactly. Packed fp4 in either nibble order, a partial last block (K % 32), and
lookup tables whose values are known at compile time (constants, attributes, frozen parameters) are
recognized by what they compute; an fp4 table that is a run-time input (a module buffer under torch.compile)
is verified as a gather by code and read at run time by the lowering (`mx_verify.verify_runtime_table`); a
decode that differs is left alone with the reason. Both sides of the matmul dequantized: dynamic activation
MX (the activation's quantize nodes are kept as the record's ActQuant); only the weight: weight-only MX. A
matmul whose weight is computed from 8-bit data but is not verified MX gets a rejection naming the blocker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from qlower.patterns import mx_format as fmt
from qlower.patterns.epilogue import Epilogue, site_bias, walk_epilogue
from qlower.patterns.graph_utils import (
    ADD_OPS,
    FLOAT_DTYPES,
    LAYOUT_OPS,
    VIEW_OPS,
    Factor,
    MatmulSite,
    aten,
    convert_target_dtype,
    has_single_user,
    is_call,
    is_static,
    is_transpose_2d,
    matmul_site,
    prims,
    tensor_devices,
    tensor_val,
)
from qlower.patterns.host_eval import NoShrink, evaluate, forget_graph_orders, graph_order, stored_value
from qlower.patterns.mx_verify import Decode, Decoding, verify, verify_runtime_table
from qlower.patterns.record import ActQuant, Candidate, MXOperand, QuantLinear, Rejection

FAMILY = "mx"
BLOCK = fmt.BLOCK
_MAX_DECODE_NODES = 400

_LAYOUT_OPS = {
    *LAYOUT_OPS,
    aten.alias.default,
    aten.slice.Tensor,
    aten.cat.default,
    aten.stack.default,
    aten.view.dtype,
    aten.lift_fresh_copy.default,
}


_DECODE_EXTRA = {
    aten.index_put.default,
    aten.index.Tensor,
    aten.full.default,
    aten.scalar_tensor.default,
    prims.iota.default,  # `arange` (decomposed): block indices k // 32 that gather a scale per element
    prims.device_put.default,
}


_BITCAST_8BIT = (torch.uint8, torch.int8, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2)


_MX_STORAGE = (
    torch.uint8,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
)


_TABLE_NUMEL = 256  # a stored tensor this small (and not 8-bit data) inside a decode is a lookup table


def _is_decode_op(node: fx.Node) -> bool:
    """Pointwise, layout or constant ops: what may sit between stored MX data and its decoded values."""
    if node.op != "call_function":
        return False
    t = node.target
    if t in _LAYOUT_OPS or t in _DECODE_EXTRA or t is prims.convert_element_type.default:
        return True
    return isinstance(t, torch._ops.OpOverload) and torch.Tag.pointwise in t.tags


def _is_const_leaf(node: fx.Node) -> bool:
    """Symbolic sizes and scalars: inputs the probe evaluates from their hints."""
    return isinstance(node.meta.get("val"), (int, float, torch.SymInt, torch.SymFloat))


def _is_table_leaf(node: fx.Node) -> bool:
    """A small stored tensor (graph input or attribute) that is not 8-bit data: a decode's lookup table.

    The probe needs its values: `stored_value` has them when they are fixed at compile time.
    """
    v = tensor_val(node)
    return (
        node.op in ("placeholder", "get_attr")
        and v is not None
        and v.dtype not in (*_MX_STORAGE, torch.int8)
        and all(is_static(s) for s in v.shape)
        and v.numel() <= _TABLE_NUMEL
    )


def _meet(start: fx.Node, accept: Callable[[fx.Node], bool], order: dict[fx.Node, int]) -> Decode | None:
    """Walk back from `start` through decode ops until every path passes one node that `accept`s.

    Popping the latest node of the frontier keeps the frontier a cut of the subgraph, so a frontier of one
    node is a dominator of `start` (all its inputs flow through it).
    """
    frontier: dict[fx.Node, None] = {start: None}
    inner: list[fx.Node] = []
    consts: list[fx.Node] = []
    tables: list[fx.Node] = []
    while frontier:
        if len(frontier) == 1:
            (only,) = frontier
            if only is not start and accept(only):
                inner.sort(key=order.__getitem__)
                return Decode(only, inner, consts, list(dict.fromkeys(tables)))
        node = max(frontier, key=order.__getitem__)
        del frontier[node]
        if not _is_decode_op(node) or len(inner) >= _MAX_DECODE_NODES:
            return None
        inner.append(node)
        for inp in node.all_input_nodes:
            if _is_const_leaf(inp):
                consts.append(inp)
            elif _is_table_leaf(inp) and not accept(inp):
                tables.append(inp)
            elif inp not in inner:
                frontier[inp] = None
    return None


@dataclass
class _Dequant:
    """One MX-dequantized matmul operand: value[r, k] = elem(q)[r, k] * 2 ** (e[r, k // 32] - 127)."""

    elem: str
    q: fx.Node  # element boundary, logically [rows, K] (fp8) or [rows, K / 2] (packed e2m1)
    e: fx.Node  # scale-code boundary (uint8 / e8m0), numel rows * ceil(K / 32)
    decoding: Decoding
    rows: Any
    k: int
    nodes: list[fx.Node]  # mul, the decode ops and the chain up to the matmul
    table: fx.Node | None = None  # e2m1: the value table the decode reads at run time (a graph input)
    mul: fx.Node | None = None  # the verified multiply (`MXOperand.decoded`)

    @property
    def e_assoc(self) -> str:
        return self.decoding.assoc


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


def _find_operand(operand: fx.Node, want_flips: int, graph: fx.Graph) -> _Dequant | Rejection | None:
    """The MX operand behind a matmul operand, a rejection when its decode is MX-shaped but not verified MX
    (the first one found, should no reading of the multiply verify), or None."""
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
    order = graph_order(graph)
    a, b = mul.args[:2]
    rejected: Rejection | None = None
    for data, scale in ((a, b), (b, a)):
        if not isinstance(data, fx.Node) or not isinstance(scale, fx.Node):
            continue
        q = _meet(data, lambda n: _elem_of(n, rows, k) is not None, order)
        if q is None:
            continue
        elem = _elem_of(q.boundary, rows, k)
        assert elem is not None
        ncodes = rows * fmt.blocks(k)
        e = _meet(scale, lambda n, c=ncodes: _is_codes(n, c), order)
        if e is None:
            continue
        qv = tensor_val(q.boundary)
        assert qv is not None
        tables = {t: stored_value(t) for t in dict.fromkeys([*q.tables, *e.tables])}
        unknown = [t for t, v in tables.items() if v is None]
        if unknown:
            found = verify_runtime_table(mul, q, e, elem, rows, k, graph, tables, unknown)
        else:
            found = verify(mul, q, e, elem, rows, k, graph, tables)  # type: ignore[arg-type]
        if isinstance(found, Decoding):
            nodes = [*chain, mul, *q.inner, *e.inner]
            table = unknown[0] if unknown else None
            return _Dequant(elem, q.boundary, e.boundary, found, rows, k, nodes, table=table, mul=mul)
        if found is None:
            continue
        why = found
        rejected = rejected or Rejection(family=FAMILY, anchor=mul, reason=why, dtype=qv.dtype)
    return rejected


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
    order = graph_order(graph)
    chain.sort(key=order.__getitem__)
    try:
        with torch.no_grad():
            idx = evaluate(chain, {src: index}, rows, rows, graph, bitcast_is_identity=True)[e]
    except (NoShrink, RuntimeError, TypeError, ValueError, IndexError, KeyError):
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


def _placed(rej: Rejection, mm: fx.Node, xv: torch.Tensor, shape: tuple[Any, ...]) -> Rejection:
    """An operand's rejection as the matmul's row: its anchor, shape, device and the activation's dtype."""
    rej.shape, rej.device, rej.anchor, rej.dtype = shape, xv.device, mm, xv.dtype
    return rej


def _mx_operand(found: _Dequant, layout: str) -> MXOperand:
    """The record's view of a verified operand whose stored scales have `layout` (`_scale_source`)."""
    d = found.decoding
    return MXOperand(found.elem, layout, found.e, d.assoc, d.nibbles, d.special, found.table, found.mul)


def _activation(
    x: fx.Node, m: Any, k: int, graph: fx.Graph
) -> tuple[ActQuant | None, list[fx.Node]] | Rejection | str:
    """The activation's MX quantization and its nodes ((None, []) for a float activation); else the operand's
    rejection, or why it is neither float nor a verified MX operand the lowerings take."""
    a = _find_operand(x, 0, graph)
    if isinstance(a, Rejection):
        return a
    if a is None:
        xv = tensor_val(x)
        assert xv is not None
        return (
            (None, [])
            if xv.dtype in FLOAT_DTYPES
            else f"activation dtype {xv.dtype} is neither float nor MX-dequantized"
        )
    if a.table is not None:
        return "the activation's fp4 decode reads a table at run time"
    x_q, x_flips = _q_source(a.q)
    if x_flips % 2:
        return "quantized activation is stored transposed ([K, M])"
    x_scale, layout = _scale_source(a.e, m, fmt.blocks(k), a.e_assoc, graph)
    act = ActQuant(
        scheme="mx_block",
        x_q=x_q,
        x_scale=x_scale,
        x_float=_x_float(x_q, m, k),
        mx=_mx_operand(a, layout),
        rounding=_rounding(x_q, x_scale),
    )
    return act, a.nodes


def _absorb(user: fx.Node, cur: fx.Node, factor: Factor | None, ep: Epilogue) -> list[fx.Node] | None:
    """One per-channel bias add and one dtype convert after the matmul (`epilogue.walk_epilogue`)."""
    if is_call(user, ADD_OPS) and ep.bias is None and factor is not None and factor.kind != "row":
        if not isinstance(factor.source, fx.Node):
            return None
        ep.bias = factor.source
        return [user]
    if convert_target_dtype(user) in FLOAT_DTYPES and ep.out_shape is None:
        return [user]
    return None


def _match(site: MatmulSite, graph: fx.Graph) -> Candidate | None:
    """The MX linear at a matmul site, a rejection naming its blocker, or None (not a candidate)."""
    mm, x, w_op = site.output, site.x, site.operand
    if not isinstance(w_op, fx.Node) or not isinstance(x, fx.Node):
        return None
    w = _find_operand(w_op, 1, graph)
    xv, mmv, wv = tensor_val(x), tensor_val(mm), tensor_val(w_op)
    if xv is None or mmv is None or wv is None:
        return None
    m = xv.shape[0]
    if w is None:
        why = _not_mx_reason(w_op)
        if why is None:
            return None
        w = Rejection(family=FAMILY, anchor=mm, reason=why)
    if isinstance(w, Rejection):  # the row's dtype is the activation's, as for every row
        return _placed(w, mm, xv, (m, wv.shape[0], wv.shape[1]))
    k, n = w.k, int(w.rows)
    base = dict(family=FAMILY, anchor=mm, device=xv.device, dtype=xv.dtype, shape=(m, k, n))
    act = _activation(x, m, k, graph)
    if isinstance(act, Rejection):
        return _placed(act, mm, xv, base["shape"])
    if isinstance(act, str):
        return Rejection(reason=act, **base)
    return _linear(site, w, act, graph, base)


def _linear(
    site: MatmulSite,
    w: _Dequant,
    act: tuple[ActQuant | None, list[fx.Node]],
    graph: fx.Graph,
    base: dict[str, Any],
) -> Candidate:
    """The record once both operands are known: the stored weight and its scales, one device, the epilogue."""
    mm, x, (m, k, n) = site.output, site.x, base["shape"]
    w_src, flips = _q_source(w.q)
    w_scale, w_layout = _scale_source(w.e, n, fmt.blocks(k), w.e_assoc, graph)
    devices = tensor_devices(x, w_src, w_scale, site.bias)
    if len(devices) > 1:
        return Rejection(reason=f"mixed devices {sorted(map(str, devices))}", **base)
    mmv = tensor_val(mm)
    assert mmv is not None
    bias = site_bias(site.bias, mmv)
    if isinstance(bias, str):
        return Rejection(reason=bias, **base)
    ep = walk_epilogue(mm, m, n, _absorb, Epilogue(chain=[mm], bias=bias))
    outv = tensor_val(ep.output)
    assert ep.output is not None and outv is not None
    return QuantLinear(
        family=FAMILY,
        x=x,
        weight=w_src,
        weight_layout="NK" if flips % 2 == 0 else "KN",
        weight_scale=w_scale,
        bias=ep.bias,
        compute_dtype=mmv.dtype,
        out_dtype=outv.dtype,
        m=m,
        k=k,
        n=n,
        output=ep.output,
        out_shape=ep.out_shape,
        nodes=tuple(dict.fromkeys([*ep.chain, *site.nodes, *w.nodes, *act[1]])),
        matmul=site.kind,
        act_quant=act[0],
        weight_block=BLOCK,
        weight_mx=_mx_operand(w, w_layout),
    )


def _not_mx_reason(operand: fx.Node) -> str | None:
    """Why a matmul weight computed from MX storage (uint8, fp8, e8m0, fp4x2 data) by decode ops is not a
    verified MX dequantization; None when it is not computed from such data (not a candidate)."""
    seen: set[fx.Node] = set()
    todo, stored, others = [operand], [], []
    while todo and len(seen) < _MAX_DECODE_NODES:
        node = todo.pop()
        if not isinstance(node, fx.Node) or node in seen:
            continue
        seen.add(node)
        if _is_decode_op(node):
            todo.extend(node.all_input_nodes)
            continue
        v = tensor_val(node)
        if v is not None and v.dtype in _MX_STORAGE:
            stored.append(f"{node.name}: {str(v.dtype).removeprefix('torch.')}")
        elif node.op == "call_function":
            others.append(str(node.target))
    if not stored:
        return None
    why = (
        f"weight is computed from 8-bit data ({', '.join(sorted(stored)[:3])}) but not as an MX "
        "dequantization qlower can verify (fp8 / packed fp4 elements times e8m0 / uint8 codes, one per "
        f"{BLOCK} elements along K, through pointwise and layout ops)"
    )
    wv = tensor_val(operand)
    if wv is not None and not all(is_static(s) for s in wv.shape):
        why += f"; the weight's shape {list(wv.shape)} is symbolic (MX blocks need a static K)"
    if others:
        why += f"; the decode also reads {', '.join(sorted(set(others))[:3])}"
    return why


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
            if site is None or _inside_outer_matvec(site) or site.output.meta.get("qlower"):
                continue
            cand = _match(site, graph)
            if cand is not None:
                found.append(cand)
    forget_graph_orders()
    return found


__all__ = ["BLOCK", "FAMILY", "find"]
