"""MX linears (MXFP8, MXFP4): y = dequant_mx(x or x_q) @ dequant_mx(w).T [+ bias].

Anchored on every matmul (`mm`, `addmm`, or the decomposed matrix-vector form of M = 1 on GPUs; see
`graph_utils.matmul_site`). An MX dequantization is a multiply of decoded elements by decoded block
scales; graphs spell both halves in many ways (torchao's EMULATED MXTensor flattened: bit-twiddled fp4
unpacking, `pow(2, e - 127)` with a NaN guard, the weight's scales un-swizzled from 128x4 tiles;
hand-written `q.float().view(N, K // 32, 32) * 2 ** (e - 127)`, `exp2`, `e8m0.float()`,
`repeat_interleave`). Rather than enumerate spellings, the recognizer finds the two inputs the multiply
depends on (the element tensor and the 8-bit scale codes, where all paths of pointwise/layout ops meet) and
*runs* the subgraph between them on probe values covering every code (shrunk to a few rows), checking it
computes elem(q) * 2 ** (code - 127) exactly, special codes included (NaN/Inf elements; e8m0 codes 0 and
255, where a decode may give 0 or +Inf instead of the spec's 2 ** -127 and NaN: the record keeps which, see
`mx_format.E8M0_SPECIAL_ALTERNATIVES`), NaN compared as NaN. Packed fp4 in either nibble order, a partial
last block (K % 32), and lookup tables whose values are known at compile time (constants, attributes,
frozen parameters) are recognized by what they compute; an fp4 table that is a run-time input (a module
buffer under torch.compile) is verified as a gather by code and read at run time by the lowering
(`_verify_runtime_table`); a decode that differs is left alone with the reason. Both sides of the matmul dequantized: dynamic activation MX (the
activation's quantize nodes are kept as the record's ActQuant); only the weight: weight-only MX. A matmul
whose weight is computed from 8-bit data but is not verified MX gets a rejection naming the blocker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from math import isfinite, prod
from typing import Any

import torch
from torch import fx

from qlower.patterns import mx_format as fmt
from qlower.patterns.graph_utils import (
    ADD_OPS,
    FLOAT_DTYPES,
    HOST_DEVICE,
    LAYOUT_OPS,
    VIEW_OPS,
    MatmulSite,
    aten,
    bias_label,
    convert_target_dtype,
    epilogue_factor,
    factor_kind,
    graph_memo,
    has_single_user,
    is_call,
    is_static,
    is_transpose_2d,
    keeps_rows,
    matmul_site,
    prims,
    tensor_val,
)
from qlower.patterns.record import ActQuant, Candidate, QuantLinear, Rejection
from qlower.patterns.structure_key import structure_key, tensor_key

FAMILY = "mx"
BLOCK = fmt.BLOCK
_MAX_DECODE_NODES = 400
_PROBE_NUMEL = 1 << 16  # evaluate at full size up to this many elements, else shrink the rows
_FULL_EVAL_LIMIT = 1 << 24

_LAYOUT_OPS = {
    *LAYOUT_OPS,
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
    prims.iota.default,  # `arange` (decomposed): block indices k // 32 that gather a scale per element
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
# Storage dtypes of MX data (elements, scale codes): a weight computed from these is an MX candidate.
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

    The probe needs its values: `_stored_value` has them when they are fixed at compile time.
    """
    v = tensor_val(node)
    return (
        node.op in ("placeholder", "get_attr")
        and v is not None
        and v.dtype not in (*_MX_STORAGE, torch.int8)
        and all(is_static(s) for s in v.shape)
        and v.numel() <= _TABLE_NUMEL
    )


def _frozen_param(node: fx.Node) -> torch.Tensor | None:
    """The real tensor behind a placeholder that Inductor's freezing folds into a constant, else None.

    Freezing (global config, inference) makes Dynamo's lifted parameters and buffers constants; they are
    the first placeholders, their tensors in `TracingContext.params_flat` (the backend
    function `weight_is_frozen` reads the same facts).
    """
    from torch._inductor import config

    if not config.freezing or torch.is_grad_enabled():
        return None
    ctx = torch._guards.TracingContext.try_get()
    params = getattr(ctx, "params_flat", None) if ctx is not None else None
    if not params:
        return None
    index = [n for n in node.graph.nodes if n.op == "placeholder"].index(node)
    return params[index] if index < len(params) else None


def _stored_value(node: fx.Node) -> torch.Tensor | None:
    """A stored tensor's values on the host when they are fixed at compile time (an attribute: constants built
    in the graph, export and AOTInductor parameters; a frozen parameter), None for a run-time input."""
    from torch._subclasses.fake_tensor import FakeTensor

    obj: Any = None
    if node.op == "get_attr":
        obj = node.graph.owning_module
        for name in str(node.target).split("."):
            obj = getattr(obj, name, None)
    elif node.op == "placeholder":
        obj = _frozen_param(node)
    v = tensor_val(node)
    if not isinstance(obj, torch.Tensor) or isinstance(obj, FakeTensor) or obj.is_meta or v is None:
        return None
    if obj.dtype != v.dtype or list(obj.shape) != [int(s) for s in v.shape]:
        return None
    return obj.detach().to(HOST_DEVICE)


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
    tables: list[fx.Node] = field(default_factory=list)  # stored lookup tables the decode reads


def _meet(start: fx.Node, accept: Callable[[fx.Node], bool], order: dict[fx.Node, int]) -> _Decode | None:
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
                return _Decode(only, inner, consts, list(dict.fromkeys(tables)))
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
        if n.op == "get_attr" and module is not None and (stored := _stored_value(n)) is not None:
            return stored
        if isinstance(v, torch.SymInt):
            return _hint(v)
        raise _NoShrink(f"no value for {n}")

    for node in nodes:
        if (
            bitcast_is_identity and node.target is aten.view.dtype
        ) or node.target is prims.device_put.default:
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


def _probe_codes(numel: int, start: int = 0) -> torch.Tensor:
    """`numel` codes along a fixed permutation of 0..255 from position `start` (neighbours differ); the
    starts 0, numel, 2 * numel, ... of `_rounds(numel)` probes together hold every code."""
    perm = torch.arange(256) * 37 % 256
    return perm[(torch.arange(numel) + start) % 256].to(torch.uint8)


def _rounds(*numels: int) -> int:
    return max(-(-256 // n) for n in numels)


@dataclass(frozen=True)
class _Decoding:
    """What a verified decode computes: elem(q) * 2 ** (code - 127) on every code, up to these facts."""

    assoc: str  # "nk": the scale codes' row-major order is [rows, blocks]; "kn": it is [blocks, rows]
    nibbles: str = "low_first"  # packed e2m1: the nibble holding the even element
    special: dict[int, float] = field(default_factory=dict)  # e8m0 code -> value, where not the spec's


class _NotMX(Exception):
    """The probe ran and its numbers are not those of an MX dequantization (the message says where)."""


@dataclass
class _MXOperand:
    """One MX-dequantized matmul operand: value[r, k] = elem(q)[r, k] * 2 ** (e[r, k // 32] - 127)."""

    elem: str
    q: fx.Node  # element boundary, logically [rows, K] (fp8) or [rows, K / 2] (packed e2m1)
    e: fx.Node  # scale-code boundary (uint8 / e8m0), numel rows * ceil(K / 32)
    decoding: _Decoding
    rows: Any
    k: int
    nodes: list[fx.Node]  # mul, the decode ops and the chain up to the matmul
    table: fx.Node | None = None  # e2m1: the value table the decode reads at run time (a graph input)

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


@dataclass
class _Probe:
    """Runs the decode subgraph (q and e boundaries to `mul`) on given bytes, for `r` of its `rows` rows."""

    nodes: list[fx.Node]
    mul: fx.Node
    q: fx.Node
    e: fx.Node
    tables: dict[fx.Node, torch.Tensor]
    elem: str
    rows: int
    r: int
    k: int
    graph: fx.Graph

    @property
    def q_numel(self) -> int:
        return self.r * (self.k // 2 if fmt.packed(self.elem) else self.k)

    @property
    def e_numel(self) -> int:
        return self.r * fmt.blocks(self.k)

    def __call__(self, qbytes: torch.Tensor, ecodes: torch.Tensor) -> torch.Tensor:
        """The decoded [r, K] values of element bytes `qbytes` and scale codes `ecodes` (both flat uint8)."""
        qv, ev = tensor_val(self.q), tensor_val(self.e)
        assert qv is not None and ev is not None
        q_in = qbytes.view(qv.dtype).reshape(_shrink(_concrete_shape(self.q), self.rows, self.r))
        e_in = ecodes.view(ev.dtype).reshape(_shrink(_concrete_shape(self.e), self.rows, self.r))
        leaves = {**self.tables, self.q: q_in, self.e: e_in}
        with torch.no_grad():
            out = _evaluate(self.nodes, leaves, self.rows, self.r, self.graph)[self.mul]
        if isinstance(out, torch.Tensor) and out.numel() != self.r * self.k and self.r != self.rows:
            raise _NoShrink("the decode's shape depends on the rows in a way the probe did not rewrite")
        if (
            not isinstance(out, torch.Tensor)
            or out.numel() != self.r * self.k
            or not out.dtype.is_floating_point
        ):
            raise _NotMX(f"the decoded weight is not a float [rows, {self.k}] tensor")
        return out.reshape(self.r, self.k)

    def logical_q(self, qbytes: torch.Tensor) -> torch.Tensor:
        q = qbytes.reshape(self.r, -1)
        return q.view(fmt.FP8_DTYPE[self.elem]) if self.elem in fmt.FP8_DTYPE else q

    def logical_e(self, ecodes: torch.Tensor, assoc: str) -> torch.Tensor:
        """[r, blocks] codes of flat `ecodes` read in order `assoc`."""
        cols = fmt.blocks(self.k)
        return ecodes.reshape(self.r, cols) if assoc == "nk" else ecodes.reshape(cols, self.r).t()


def _num(x: Any) -> str:
    return f"{float(x):g}"


_Run = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # element bytes, scale codes (flat), decoded [r, K]


def _expand(probe: _Probe, per_block: torch.Tensor) -> torch.Tensor:
    """[r, blocks] -> [r, K]: each block's value on its elements (the last block partial when K % 32)."""
    return per_block.repeat_interleave(BLOCK, dim=1)[:, : probe.k]


def _elem_codes(probe: _Probe, qb: torch.Tensor, nibbles: str = "low_first") -> torch.Tensor:
    """[r, K] element codes of flat bytes `qb` (fp4 nibbles in order `nibbles`)."""
    q = probe.logical_q(qb)
    return fmt.unpack_codes(q, nibbles) if fmt.packed(probe.elem) else q.view(torch.uint8)


def _want(probe: _Probe, run: _Run, d: _Decoding) -> torch.Tensor:
    qb, ec, got = run
    codes = probe.logical_e(ec, d.assoc)
    return fmt.dequantize_f64(probe.logical_q(qb), codes, probe.elem, d.nibbles, d.special).to(got.dtype)


def _scale_codes(probe: _Probe, run: _Run, d: _Decoding) -> torch.Tensor:
    """[r, K]: the scale code of each element's block."""
    return _expand(probe, probe.logical_e(run[1], d.assoc))


def _ordinary_scale(probe: _Probe, run: _Run, d: _Decoding) -> torch.Tensor:
    return ~torch.isin(_scale_codes(probe, run, d), torch.tensor(list(fmt.E8M0_SPECIAL)))


def _ordinary(probe: _Probe, run: _Run, d: _Decoding) -> torch.Tensor:
    """Positions whose element and scale codes both have finite, plain values."""
    special = torch.tensor(fmt.ELEM_SPECIAL_CODES[probe.elem] or [-1])
    return ~torch.isin(_elem_codes(probe, run[0], d.nibbles), special) & _ordinary_scale(probe, run, d)


def _differs(half: str, name: str, code: str, got: float, want: float) -> _NotMX:
    return _NotMX(
        f"{half} decode differs from {name} at code {code} ({_num(got)} where {name} is {_num(want)})"
    )


def _matches(probe: _Probe, runs: list[_Run], d: _Decoding, where: Callable[[_Run], torch.Tensor]) -> bool:
    return all(fmt.same_values(run[2], _want(probe, run, d))[where(run)].all() for run in runs)


def _check_decode(probe: _Probe) -> _Decoding:
    """Elements and scale codes varying together over every code: what the decode computes, or _NotMX.

    Ordinary codes fix the scale codes' association and the nibble order; then special element codes must
    decode as the format says, and e8m0 codes 0 / 255 as the spec or one of the alternatives the emulation
    reproduces. Only the product is checked, so a decode may split a constant factor between its halves.
    """
    nq, ne = probe.q_numel, probe.e_numel
    runs = [
        (qb, ec, probe(qb, ec))
        for j in range(_rounds(nq, ne))
        for qb, ec in [(_probe_codes(nq, j * nq), _probe_codes(ne, j * ne + 101))]
    ]
    orders = fmt.NIBBLE_ORDERS if fmt.packed(probe.elem) else fmt.NIBBLE_ORDERS[:1]
    plain = [_Decoding(a, o) for a in ("nk", "kn") for o in orders]
    d = next((d for d in plain if _matches(probe, runs, d, lambda r, d=d: _ordinary(probe, r, d))), None)
    if d is None:
        _diagnose(probe)
        raise _NotMX("decode is not fp8 / fp4 elements times e8m0 block scales")
    _check_special_elements(probe, runs, d)
    special: dict[int, float] = {}
    for code, spec in fmt.E8M0_SPECIAL.items():

        def in_blocks(run: _Run, code: int = code) -> torch.Tensor:
            return _scale_codes(probe, run, d) == code

        for i, value in enumerate((spec, *fmt.E8M0_SPECIAL_ALTERNATIVES[code])):
            trial = _Decoding(d.assoc, d.nibbles, {**special, code: value})
            if _matches(probe, runs, trial, in_blocks):
                special = trial.special if i else special
                break
        else:
            raise _differs("scale", "e8m0", str(code), _effective_scale(probe, runs, d, code), spec)
    return _Decoding(d.assoc, d.nibbles, special)


def _check_special_elements(probe: _Probe, runs: list[_Run], d: _Decoding) -> None:
    """NaN / Inf element codes under ordinary scales decode as the format says, or _NotMX (lowest code)."""
    diffs = []
    for run in runs:
        qb, _, got = run
        scale = fmt.scale_f64(_scale_codes(probe, run, d))
        bad = ~fmt.same_values(got, _want(probe, run, d)) & _ordinary_scale(probe, run, d)
        want = fmt.elements_f64(probe.logical_q(qb), probe.elem, d.nibbles)
        codes = _elem_codes(probe, qb, d.nibbles)
        diffs += zip(
            codes[bad].tolist(), (got.double() / scale)[bad].tolist(), want[bad].tolist(), strict=True
        )
    if diffs:
        code, got, want = min(diffs, key=lambda t: t[0])
        raise _differs("element", probe.elem, f"{code:#04x}", got, want)


def _effective_scale(probe: _Probe, runs: list[_Run], d: _Decoding, code: int) -> float:
    """What the decode multiplies a plain element by in a block of scale code `code` (for messages)."""
    for run in runs:
        elems = fmt.elements_f64(probe.logical_q(run[0]), probe.elem, d.nibbles)
        hit = (_scale_codes(probe, run, d) == code) & elems.isfinite() & (elems != 0)
        if hit.any():
            return float(run[2].double()[hit][0] / elems[hit][0])
    return float("nan")


def _diagnose(probe: _Probe) -> None:
    """Raise _NotMX naming the half of a failing decode that differs: elements under scale code 127, or
    scale codes times element 1.0. A constant factor off on every element is blamed on the scales, and so is
    every element difference when code 127 itself does not decode to 1.0 (the element probe then says
    nothing about the elements: e4m3 scale bytes read 0x7f as NaN; tests/test_report_rows.py)."""
    nq, ne = probe.q_numel, probe.e_numel
    unit = torch.full((ne,), fmt.E8M0_BIAS, dtype=torch.uint8)
    one = torch.full((nq,), fmt.ELEM_ONE_BYTE[probe.elem], dtype=torch.uint8)
    elem_runs = [(qb, unit, probe(qb, unit)) for qb in (_probe_codes(nq, j * nq) for j in range(_rounds(nq)))]
    scale_runs = [(one, ec, probe(one, ec)) for ec in (_probe_codes(ne, j * ne) for j in range(_rounds(ne)))]
    orders = fmt.NIBBLE_ORDERS if fmt.packed(probe.elem) else fmt.NIBBLE_ORDERS[:1]
    elem_diffs = min((_diffs(probe, elem_runs, _Decoding("nk", o), "elem") for o in orders), key=len)
    scale_diffs = min((_diffs(probe, scale_runs, _Decoding(a), "scale") for a in ("nk", "kn")), key=len)
    ratios = {g / w if w and isfinite(w) and isfinite(g) else None for _, g, w in elem_diffs}
    unit_scale_wrong = any(code == fmt.E8M0_BIAS for code, _, _ in scale_diffs)
    if elem_diffs and not unit_scale_wrong and (len(ratios) > 1 or None in ratios or not scale_diffs):
        code, got, want = min(elem_diffs, key=lambda t: t[0])
        raise _differs("element", probe.elem, f"{code:#04x}", got, want)
    if scale_diffs:
        code, got, want = min(scale_diffs, key=lambda t: t[0])
        raise _differs("scale", "e8m0", str(code), got, want)


def _diffs(probe: _Probe, runs: list[_Run], d: _Decoding, half: str) -> list[tuple[int, float, float]]:
    """(code, got, want) wherever the probe of one half differs from MX, ordinary scale codes only."""
    out = []
    for run in runs:
        got, want = run[2], _want(probe, run, d)
        bad = ~fmt.same_values(got, want) & _ordinary_scale(probe, run, d)
        codes = _elem_codes(probe, run[0], d.nibbles) if half == "elem" else _scale_codes(probe, run, d)
        out += zip(codes[bad].tolist(), got.double()[bad].tolist(), want.double()[bad].tolist(), strict=True)
    return out


def _probe_of(
    mul: fx.Node,
    q: _Decode,
    e: _Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor],
    r: int,
) -> _Probe:
    """The probe of the decode subgraph between the boundaries `q`, `e` and `mul`, run on `r` of its rows."""
    nodes = sorted({*q.inner, *e.inner, mul}, key=lambda n: _order_of(graph)[n])
    return _Probe(nodes, mul, q.boundary, e.boundary, tables, elem, int(_hint(rows)), r, k, graph)


def _verify(
    mul: fx.Node,
    q: _Decode,
    e: _Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor],
) -> _Decoding | str | None:
    """Run the dequant subgraph on probes of every element and scale code: what it decodes (`_Decoding`), a
    reason where it differs from MX, or None where the probe cannot run it. Once per decode structure per
    graph (`structure_key`): a model's linears decode alike."""
    key = _verify_key(mul, q, e, elem, rows, k, tables)
    memo = graph_memo(graph, "mx_verify")
    if key is None or key not in memo:
        found = _verify_probes(mul, q, e, elem, rows, k, graph, tables)
        if key is None:
            return found
        memo[key] = found
    found = memo[key]
    return replace(found, special=dict(found.special)) if isinstance(found, _Decoding) else found


def _verify_key(
    mul: fx.Node, q: _Decode, e: _Decode, elem: str, rows: Any, k: int, tables: dict[fx.Node, torch.Tensor]
) -> Any:
    """What `_verify_probes` reads: the decode's structure (`_evaluate`'s inputs), the format and the sizes."""

    def outside(n: fx.Node) -> Any:  # as `_evaluate` reads a node outside the decode
        if n.op == "get_attr" and (stored := _stored_value(n)) is not None:
            return stored
        v = n.meta.get("val")
        return _hint(v) if isinstance(v, torch.SymInt) else None

    nodes = sorted({*q.inner, *e.inner, mul}, key=lambda n: _order_of(mul.graph)[n])
    leaves = {q.boundary: "q", e.boundary: "e", **{t: tensor_key(v) for t, v in tables.items()}}
    shape = structure_key(nodes, leaves, outside, _hint)
    return None if shape is None else (shape, elem, int(_hint(rows)), k)


def _verify_probes(
    mul: fx.Node,
    q: _Decode,
    e: _Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor],
) -> _Decoding | str | None:
    nrows = int(_hint(rows))
    for r in dict.fromkeys((_probe_rows(nrows, k), nrows)):
        if r * k > _FULL_EVAL_LIMIT:
            continue
        probe = _probe_of(mul, q, e, elem, rows, k, graph, tables, r)
        try:
            return _check_decode(probe)
        except _NotMX as err:
            return str(err)
        except (_NoShrink, RuntimeError, TypeError, ValueError, IndexError):
            continue
    return None


def _runtime_table_reason(names: list[str], detail: str) -> str:
    return (
        f"decode table is a runtime input ({', '.join(names)}: {detail}; a constant, an exported or a frozen "
        "one is verified)"
    )


def _verify_runtime_table(
    mul: fx.Node,
    q: _Decode,
    e: _Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor | None],
    unknown: list[fx.Node],
) -> _MXOperand | str:
    """An fp4 decode whose 16-entry value table is a graph input (a module buffer under torch.compile): its
    values are unknown at compile time, so the decode is verified as a gather, not as e2m1. With the e2m1
    values in the table it must be MX (`_verify`), and with random values T it must compute T[code] *
    2 ** (e - 127) on ordinary codes: then a lowering that gathers from the same table at run time computes
    what the graph computes for any table the module holds (`emit/mx.py::elements_f32`). Else a reason."""
    names = [t.name for t in unknown]
    tv = tensor_val(unknown[0])
    if elem != "e2m1" or len(unknown) != 1 or tv is None or tv.numel() != len(fmt.E2M1_VALUES):
        return _runtime_table_reason(names, "its values are not known at compile time")
    spec = {**tables, unknown[0]: torch.tensor(fmt.E2M1_VALUES, dtype=tv.dtype).reshape(tv.shape)}
    found = _verify(mul, q, e, elem, rows, k, graph, spec)  # type: ignore[arg-type]
    if not isinstance(found, _Decoding):
        return _runtime_table_reason(names, "with the e2m1 values it does not decode MX")
    rand = torch.randn(tv.numel(), generator=torch.Generator().manual_seed(7)).to(tv.dtype)
    probe_tables = {**tables, unknown[0]: rand.reshape(tv.shape)}
    probe = _probe_of(mul, q, e, elem, rows, k, graph, probe_tables, _probe_rows(int(_hint(rows)), k))
    try:
        for j in range(_rounds(probe.q_numel, probe.e_numel)):
            qb, ec = (
                _probe_codes(probe.q_numel, j * probe.q_numel),
                _probe_codes(probe.e_numel, j * probe.e_numel),
            )
            got = probe(qb, ec)
            run = (qb, ec, got)
            values = rand.double()[_elem_codes(probe, qb, found.nibbles).long()]
            want = (values * fmt.scale_f64(_scale_codes(probe, run, found), found.special)).to(got.dtype)
            if not fmt.same_values(got, want)[_ordinary_scale(probe, run, found)].all():
                return _runtime_table_reason(names, "the decode does not gather from it by the fp4 codes")
    except (_NotMX, _NoShrink, RuntimeError, TypeError, ValueError, IndexError):
        return _runtime_table_reason(names, "the probe could not run it with other values")
    return _MXOperand(elem, q.boundary, e.boundary, found, rows, k, [], table=unknown[0])


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
    order = _order_of(graph)
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
        tables = {t: _stored_value(t) for t in dict.fromkeys([*q.tables, *e.tables])}
        unknown = [t for t, v in tables.items() if v is None]
        if unknown:
            found = _verify_runtime_table(mul, q, e, elem, rows, k, graph, tables, unknown)
            if isinstance(found, _MXOperand):
                found.nodes = [*chain, mul, *q.inner, *e.inner]
                return found
            why = found
        else:
            found = _verify(mul, q, e, elem, rows, k, graph, tables)  # type: ignore[arg-type]
            if isinstance(found, _Decoding):
                nodes = [*chain, mul, *q.inner, *e.inner]
                return _MXOperand(elem, q.boundary, e.boundary, found, rows, k, nodes)
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


def _forward(
    mm: fx.Node, bias: Any, m: Any, n: int
) -> tuple[fx.Node, list[fx.Node], list[Any] | None, Any] | str:
    """Views that keep N, one per-channel bias add and one dtype convert after the matmul: the node whose
    value the lowering replaces (`graph_utils.epilogue_factor` proves the bias's meaning on [M, N]).
    A reason instead when an `addmm` adds something that is not a bias."""
    if bias is not None:
        site_bias = factor_kind(bias, tensor_val(mm))
        if site_bias is None or site_bias.kind == "row" or not isinstance(site_bias.source, fx.Node):
            return f"addmm adds a {list(tensor_val(bias).shape)} tensor, not a per-channel bias"
        bias = site_bias.source
    cur, chain, out_shape = mm, [mm], None
    while has_single_user(cur):
        user = next(iter(cur.users))
        factor = epilogue_factor(user, cur, m)
        if keeps_rows(user, n) and user.args[0] is cur:
            out_shape = list(user.args[1])
        elif is_call(user, ADD_OPS) and bias is None and factor is not None and factor.kind != "row":
            if not isinstance(factor.source, fx.Node):
                break
            bias = factor.source
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
    xv, mmv, wv = tensor_val(x), tensor_val(mm), tensor_val(w_op)
    if xv is None or mmv is None or wv is None:
        return None
    m = xv.shape[0]
    if w is None:
        why = _not_mx_reason(w_op)
        if why is None:
            return None
        w = Rejection(family=FAMILY, anchor=mm, reason=why, dtype=xv.dtype)
    if isinstance(w, Rejection):  # the row's dtype is the activation's, as for every row
        w.shape, w.device, w.anchor, w.dtype = (m, wv.shape[0], wv.shape[1]), xv.device, mm, xv.dtype
        return w
    k, n = w.k, int(w.rows)
    base = dict(family=FAMILY, anchor=mm, device=xv.device, dtype=xv.dtype, shape=(m, k, n))
    a = _find_operand(x, 0, graph)
    if isinstance(a, Rejection):
        a.shape, a.device, a.anchor, a.dtype = base["shape"], xv.device, mm, xv.dtype
        return a
    act_quant = None
    nodes = list(w.nodes)
    if a is not None and a.table is not None:
        return Rejection(reason="the activation's fp4 decode reads a table at run time", **base)
    if a is not None:
        x_q, x_flips = _q_source(a.q)
        if x_flips % 2:
            return Rejection(reason="quantized activation is stored transposed ([K, M])", **base)
        x_scale, x_layout = _scale_source(a.e, m, fmt.blocks(k), a.e_assoc, graph)
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
                "nibbles": a.decoding.nibbles,
                "scale_special": a.decoding.special,
            },
        )
        nodes += a.nodes
    elif xv.dtype not in FLOAT_DTYPES:
        return Rejection(reason=f"activation dtype {xv.dtype} is neither float nor MX-dequantized", **base)
    w_src, flips = _q_source(w.q)
    w_scale, w_layout = _scale_source(w.e, n, fmt.blocks(k), w.e_assoc, graph)
    devices = {v.device for v in map(tensor_val, (x, w_src, w_scale, bias)) if v is not None and v.dim() > 0}
    if len(devices) > 1:
        return Rejection(reason=f"mixed devices {sorted(map(str, devices))}", **base)
    walked = _forward(mm, bias, m, n)
    if isinstance(walked, str):
        return Rejection(reason=walked, **base)
    out, chain, out_shape, bias = walked
    outv = tensor_val(out)
    assert outv is not None
    form = "+".join(
        p
        for p in (
            "dynamic" if act_quant else "weight_only",
            f"{act_quant.details['elem']}x{w.elem}" if act_quant else w.elem,
            f"w_scale_{w_layout}",
            site.kind,
            bias_label(bias),
            "nd" if out_shape is not None else "",
            "high_nibble_first" if "high_first" in (w.decoding.nibbles, a and a.decoding.nibbles) else "",
            "partial_block" if k % BLOCK else "",
            "runtime_table" if w.table is not None else "",
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
            "w_nibbles": w.decoding.nibbles,  # packed e2m1: which nibble holds the even element
            "w_scale_special": w.decoding.special,  # e8m0 code -> decoded value where not the spec's
            "w_table": w.table,  # e2m1 values gathered from this graph input at run time, or None
        },
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
    _ORDER_CACHE.clear()
    return found


__all__ = ["BLOCK", "FAMILY", "find"]
