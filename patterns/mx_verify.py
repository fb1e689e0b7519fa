"""Whether a decode subgraph computes MX, proven by running it: elem(q) * 2 ** (code - 127) on every code.

Why: graphs spell an MX dequantization in many ways, so the recognizer (`mx.py`) does not enumerate spellings;
it finds the element and scale-code boundaries and this module runs the subgraph between them on probe values
covering every code (shrunk to a few rows), special codes included (NaN/Inf elements; e8m0 codes 0 and 255,
where a decode may give 0 or +Inf instead of the spec's 2 ** -127 and NaN: `Decoding.special`, see
`mx_format.E8M0_SPECIAL_ALTERNATIVES`), NaN compared as NaN. A decode that differs gets a reason naming the
half (elements or scales) and the first code that differs. Once per decode structure per graph
(`structure_key`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from math import isfinite
from typing import Any

import torch
from torch import fx

from qlower.patterns import mx_format as fmt
from qlower.patterns.graph_utils import graph_memo, tensor_val
from qlower.patterns.host_eval import (
    NoShrink,
    concrete_shape,
    evaluate,
    graph_order,
    hint,
    shrink,
    stored_value,
)
from qlower.patterns.structure_key import structure_key, tensor_key

BLOCK = fmt.BLOCK

_PROBE_NUMEL = 1 << 16  # evaluate at full size up to this many elements, else shrink the rows


_FULL_EVAL_LIMIT = 1 << 24


@dataclass
class Decode:
    """Where all paths from a decoded value meet in one stored tensor, and the ops in between."""

    boundary: fx.Node
    inner: list[fx.Node]  # graph order
    consts: list[fx.Node] = field(default_factory=list)
    tables: list[fx.Node] = field(default_factory=list)  # stored lookup tables the decode reads


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
class Decoding:
    """What a verified decode computes: elem(q) * 2 ** (code - 127) on every code, up to these facts."""

    assoc: str  # "nk": the scale codes' row-major order is [rows, blocks]; "kn": it is [blocks, rows]
    nibbles: str = "low_first"  # packed e2m1: the nibble holding the even element
    special: dict[int, float] = field(default_factory=dict)  # e8m0 code -> value, where not the spec's


class _NotMX(Exception):
    """The probe ran and its numbers are not those of an MX dequantization (the message says where)."""


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
        q_in = qbytes.view(qv.dtype).reshape(shrink(concrete_shape(self.q), self.rows, self.r))
        e_in = ecodes.view(ev.dtype).reshape(shrink(concrete_shape(self.e), self.rows, self.r))
        leaves = {**self.tables, self.q: q_in, self.e: e_in}
        with torch.no_grad():
            out = evaluate(self.nodes, leaves, self.rows, self.r, self.graph)[self.mul]
        if isinstance(out, torch.Tensor) and out.numel() != self.r * self.k and self.r != self.rows:
            raise NoShrink("the decode's shape depends on the rows in a way the probe did not rewrite")
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


def _want(probe: _Probe, run: _Run, d: Decoding) -> torch.Tensor:
    qb, ec, got = run
    codes = probe.logical_e(ec, d.assoc)
    return fmt.dequantize_f64(probe.logical_q(qb), codes, probe.elem, d.nibbles, d.special).to(got.dtype)


def _scale_codes(probe: _Probe, run: _Run, d: Decoding) -> torch.Tensor:
    """[r, K]: the scale code of each element's block."""
    return _expand(probe, probe.logical_e(run[1], d.assoc))


def _ordinary_scale(probe: _Probe, run: _Run, d: Decoding) -> torch.Tensor:
    return ~torch.isin(_scale_codes(probe, run, d), torch.tensor(list(fmt.E8M0_SPECIAL)))


def _ordinary(probe: _Probe, run: _Run, d: Decoding) -> torch.Tensor:
    """Positions whose element and scale codes both have finite, plain values."""
    special = torch.tensor(fmt.ELEM_SPECIAL_CODES[probe.elem] or [-1])
    return ~torch.isin(_elem_codes(probe, run[0], d.nibbles), special) & _ordinary_scale(probe, run, d)


def _differs(half: str, name: str, code: str, got: float, want: float) -> _NotMX:
    return _NotMX(
        f"{half} decode differs from {name} at code {code} ({_num(got)} where {name} is {_num(want)})"
    )


def _matches(probe: _Probe, runs: list[_Run], d: Decoding, where: Callable[[_Run], torch.Tensor]) -> bool:
    return all(fmt.same_values(run[2], _want(probe, run, d))[where(run)].all() for run in runs)


def _check_decode(probe: _Probe) -> Decoding:
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
    plain = [Decoding(a, o) for a in ("nk", "kn") for o in orders]
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
            trial = Decoding(d.assoc, d.nibbles, {**special, code: value})
            if _matches(probe, runs, trial, in_blocks):
                special = trial.special if i else special
                break
        else:
            raise _differs("scale", "e8m0", str(code), _effective_scale(probe, runs, d, code), spec)
    return Decoding(d.assoc, d.nibbles, special)


def _check_special_elements(probe: _Probe, runs: list[_Run], d: Decoding) -> None:
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


def _effective_scale(probe: _Probe, runs: list[_Run], d: Decoding, code: int) -> float:
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
    nothing about the elements: e4m3 scale bytes read 0x7f as NaN; tests/end_to_end/test_report.py)."""
    nq, ne = probe.q_numel, probe.e_numel
    unit = torch.full((ne,), fmt.E8M0_BIAS, dtype=torch.uint8)
    one = torch.full((nq,), fmt.ELEM_ONE_BYTE[probe.elem], dtype=torch.uint8)
    elem_runs = [(qb, unit, probe(qb, unit)) for qb in (_probe_codes(nq, j * nq) for j in range(_rounds(nq)))]
    scale_runs = [(one, ec, probe(one, ec)) for ec in (_probe_codes(ne, j * ne) for j in range(_rounds(ne)))]
    orders = fmt.NIBBLE_ORDERS if fmt.packed(probe.elem) else fmt.NIBBLE_ORDERS[:1]
    elem_diffs = min((_diffs(probe, elem_runs, Decoding("nk", o), "elem") for o in orders), key=len)
    scale_diffs = min((_diffs(probe, scale_runs, Decoding(a), "scale") for a in ("nk", "kn")), key=len)
    ratios = {g / w if w and isfinite(w) and isfinite(g) else None for _, g, w in elem_diffs}
    unit_scale_wrong = any(code == fmt.E8M0_BIAS for code, _, _ in scale_diffs)
    if elem_diffs and not unit_scale_wrong and (len(ratios) > 1 or None in ratios or not scale_diffs):
        code, got, want = min(elem_diffs, key=lambda t: t[0])
        raise _differs("element", probe.elem, f"{code:#04x}", got, want)
    if scale_diffs:
        code, got, want = min(scale_diffs, key=lambda t: t[0])
        raise _differs("scale", "e8m0", str(code), got, want)


def _diffs(probe: _Probe, runs: list[_Run], d: Decoding, half: str) -> list[tuple[int, float, float]]:
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
    q: Decode,
    e: Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor],
    r: int,
) -> _Probe:
    """The probe of the decode subgraph between the boundaries `q`, `e` and `mul`, run on `r` of its rows."""
    nodes = sorted({*q.inner, *e.inner, mul}, key=lambda n: graph_order(graph)[n])
    return _Probe(nodes, mul, q.boundary, e.boundary, tables, elem, int(hint(rows)), r, k, graph)


def verify(
    mul: fx.Node,
    q: Decode,
    e: Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor],
) -> Decoding | str | None:
    """Run the dequant subgraph on probes of every element and scale code: what it decodes (`Decoding`), a
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
    return replace(found, special=dict(found.special)) if isinstance(found, Decoding) else found


def _verify_key(
    mul: fx.Node, q: Decode, e: Decode, elem: str, rows: Any, k: int, tables: dict[fx.Node, torch.Tensor]
) -> Any:
    """What `_verify_probes` reads: the decode's structure (`evaluate`'s inputs), the format and the sizes."""

    def outside(n: fx.Node) -> Any:  # as `evaluate` reads a node outside the decode
        if n.op == "get_attr" and (stored := stored_value(n)) is not None:
            return stored
        v = n.meta.get("val")
        return hint(v) if isinstance(v, torch.SymInt) else None

    nodes = sorted({*q.inner, *e.inner, mul}, key=lambda n: graph_order(mul.graph)[n])
    leaves = {q.boundary: "q", e.boundary: "e", **{t: tensor_key(v) for t, v in tables.items()}}
    shape = structure_key(nodes, leaves, outside, hint)
    return None if shape is None else (shape, elem, int(hint(rows)), k)


def _verify_probes(
    mul: fx.Node,
    q: Decode,
    e: Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor],
) -> Decoding | str | None:
    nrows = int(hint(rows))
    for r in dict.fromkeys((_probe_rows(nrows, k), nrows)):
        if r * k > _FULL_EVAL_LIMIT:
            continue
        probe = _probe_of(mul, q, e, elem, rows, k, graph, tables, r)
        try:
            return _check_decode(probe)
        except _NotMX as err:
            return str(err)
        except (NoShrink, RuntimeError, TypeError, ValueError, IndexError):
            continue
    return None


def _runtime_table_reason(names: list[str], detail: str) -> str:
    return (
        f"decode table is a runtime input ({', '.join(names)}: {detail}; a constant, an exported or a frozen "
        "one is verified)"
    )


def verify_runtime_table(
    mul: fx.Node,
    q: Decode,
    e: Decode,
    elem: str,
    rows: Any,
    k: int,
    graph: fx.Graph,
    tables: dict[fx.Node, torch.Tensor | None],
    unknown: list[fx.Node],
) -> Decoding | str:
    """An fp4 decode whose 16-entry value table is a graph input (a module buffer under torch.compile): its
    values are unknown at compile time, so the decode is verified as a gather, not as e2m1. With the e2m1
    values in the table it must be MX (`verify`), and with random values T it must compute T[code] *
    2 ** (e - 127) on ordinary codes: then a lowering that gathers from the same table at run time computes
    what the graph computes for any table the module holds (`emit/mx.py::elements_f32`): what it decodes,
    or a reason."""
    names = [t.name for t in unknown]
    tv = tensor_val(unknown[0])
    if elem != "e2m1" or len(unknown) != 1 or tv is None or tv.numel() != len(fmt.E2M1_VALUES):
        return _runtime_table_reason(names, "its values are not known at compile time")
    spec = {**tables, unknown[0]: torch.tensor(fmt.E2M1_VALUES, dtype=tv.dtype).reshape(tv.shape)}
    found = verify(mul, q, e, elem, rows, k, graph, spec)  # type: ignore[arg-type]
    if not isinstance(found, Decoding):
        return _runtime_table_reason(names, "with the e2m1 values it does not decode MX")
    rand = torch.randn(tv.numel(), generator=torch.Generator().manual_seed(7)).to(tv.dtype)
    probe_tables = {**tables, unknown[0]: rand.reshape(tv.shape)}
    probe = _probe_of(mul, q, e, elem, rows, k, graph, probe_tables, _probe_rows(int(hint(rows)), k))
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
    except (_NotMX, NoShrink, RuntimeError, TypeError, ValueError, IndexError):
        return _runtime_table_reason(names, "the probe could not run it with other values")
    return found
