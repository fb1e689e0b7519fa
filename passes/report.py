"""What qlower decided for every candidate linear of a compile, as data, a printable table and INFO logs.

`QLOWER_LOG=1` sends each decision to the `qlower` logger at INFO. `QLOWER_DUMP_GRAPHS=DIR` writes every
graph the pass receives, before any rewrite, to DIR/graph_<pid>_<n>.txt (one line per node with its dtype and
shape): what a pattern saw when a linear was not recognized, on a machine where only the log comes back.
One report per compile in which qlower's pass runs (`start_graph`). A compile Inductor serves whole from its
AOTAutograd cache never runs the pass (an FX graph cache hit does: Inductor runs the joint-graph passes before
it looks up that cache); such a compile gets a report of its own that says so (`pass_ran=False`,
`SERVED_FROM_CACHE`), so `last_report()` never shows another compile's rows (`note_cache_key`,
tests/end_to_end/test_report.py).

A row names the module its linear came from (`module`: the innermost entry of the `nn_module_stack` Dynamo
keeps in each node's meta, as a qualified name such as `layers.3.mlp.down_proj`), prints a symbolic M as its
range (`2..inf`), and shows one short reason; `Report.table(full=True)` and `Report.explain(i)` give the whole
text (tests/tools/test_first_use.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

log = logging.getLogger("qlower")
if os.environ.get("QLOWER_LOG", "") not in ("", "0") and not log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[qlower] %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)


def _node_line(node: Any) -> str:
    val = node.meta.get("val")
    desc = (
        f"{val.dtype}{list(val.shape)} strides={list(val.stride())}" if isinstance(val, torch.Tensor) else ""
    )
    if node.op in ("call_function", "call_method"):
        call = f"{getattr(node.target, '__name__', node.target)}{node.args}"
        if node.kwargs:
            call += f" {node.kwargs}"
    else:
        call = f"{node.op} {node.target}"
    return f"{node.name} = {call} :: {desc}"


_dump_count = iter(range(1 << 62))
# The graph the pass is lowering in this thread as `dump_graph` saw it before any rewrite: its nodes by name
# (weakly: a decision's nodes, erased by its rewrite, stay alive while the pass holds the record, which is when
# `add` runs), each node's input names and the names of the matmuls. Reset by `start_graph`.
_local = threading.local()


def dump_graph(graph: Any) -> None:
    """The pass hands every graph it receives here, before any rewrite: note its nodes, so that `add` can name
    each decision's source module (its node may be erased by the rewrite before the decision is made), and
    write `graph` to $QLOWER_DUMP_GRAPHS/graph_<pid>_<n>.txt when that variable is set."""
    _local.nodes = weakref.WeakValueDictionary((n.name, n) for n in graph.nodes)
    _local.inputs = {n.name: tuple(a.name for a in n.all_input_nodes) for n in graph.nodes}
    _local.matmuls = {n.name for n in graph.nodes if n.target in _MATMULS}
    out_dir = os.environ.get("QLOWER_DUMP_GRAPHS", "")
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"graph_{os.getpid()}_{next(_dump_count)}.txt")
    with open(path, "w") as f:
        f.write("\n".join(_node_line(n) for n in graph.nodes) + "\n")


@dataclass(frozen=True)
class Decision:
    """One candidate quantized linear and what happened to it."""

    family: str
    device: str
    shape: tuple[Any, Any, Any]  # (M, K, N); M may be symbolic (printed as its expression)
    dtype: str
    lowering: str | None  # the chosen lowering's name, None when left alone
    reason: str | None  # why it was left alone (None when lowered)
    kind: str | None = None  # the chosen lowering's KernelPreference kind
    form: str = ""  # the graph form the pattern matched
    node: str = ""  # name of the replaced node in the graph
    module: str = ""  # qualified name of the source module (`module_of`); "" when the graph did not say
    why: str = ""  # why the chosen lowering was chosen ("" when left alone)
    passed_over: tuple[tuple[str, str], ...] = ()  # (lowering, why not) ranked above the chosen one
    shape_label: str = ""  # `shape_text` as computed when the decision was made ("" to compute it now)

    @property
    def lowered(self) -> bool:
        return self.lowering is not None

    @property
    def shape_text(self) -> str:
        """M, K, N with a symbolic size printed as its range (`2..inf, 4096, 4096`)."""
        return self.shape_label or shape_label(self.shape)

    @property
    def short_reason(self) -> str:
        """The row's "why" column: the choice's own reason when lowered, else why it was left alone."""
        if self.lowered:
            return _cut(self.why)
        return short_reason(self.reason)

    @property
    def passed_over_text(self) -> str:
        """'a, b: reason' for the lowerings passed over for the same reason, joined by '; '."""
        by_reason: dict[str, list[str]] = {}
        for name, why in self.passed_over:
            by_reason.setdefault(why, []).append(name)
        return "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())


# The root of a Dynamo source (`L['self']`, `L['fn']`, `G['model']`, `L['args'][0]` when a module is called
# through a wrapper, as transformers' models are) and the spellings of a child inside one.
_SOURCE_ROOT = re.compile(r"^[A-Z]\[['\"][^'\"]*['\"]\](?:\[\d+\])*")
_CHILD_ITEM = re.compile(r"(?:\._modules)?\[['\"]?([^'\"\]]*)['\"]?\]")
_GETATTR = re.compile(r"getattr\((.*), ['\"]([^'\"]*)['\"]\)")


def _qualified_name(path: str) -> str:
    """Dynamo's source of a module (`L['self'].layers[3].mlp`, `L['self']._modules['layers']._modules['3']`)
    as `named_modules()` spells it (`layers.3.mlp`); the root module itself is ""."""
    while (m := _GETATTR.search(path)) is not None:
        path = path[: m.start()] + f"{m.group(1)}.{m.group(2)}" + path[m.end() :]
    path = _SOURCE_ROOT.sub("", path)
    path = _CHILD_ITEM.sub(lambda m: "." + m.group(1), path)
    return path.strip(".")


def _own_module(node: Any) -> str | None:
    meta = getattr(node, "meta", None) or {}
    # A backward node carries the stack of the forward node it differentiates.
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path, cls = list(stack.values())[-1]
    name = _qualified_name(str(path))
    if name:
        return name
    cls_name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
    return f"<{cls_name}>"  # the compiled module itself


def module_of(node: Any) -> str:
    """The innermost module a graph node was traced in, as a qualified name (`layers.3.mlp.down_proj`;
    `<ClassName>` when the stack names only the compiled root), from its `nn_module_stack`; "" if it has none
    (a node emitted after the trace, or one traced in the compiled module's own forward)."""
    return _own_module(node) or ""


_aten = torch.ops.aten
# The products a record's matmul is traced as: its module is the linear's (the output may be a view of the
# parent's code, e.g. an attention's head split of q_proj's result).
_MATMULS = frozenset(
    (
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten._int_mm.default,
        _aten._scaled_mm.default,
    )
)
MATMUL_HOPS = 8  # how far up from a decision's node `add` looks for its matmul


def _decision_module(name: str) -> str:
    """The module of the matmul nearest above node `name` of the graph `dump_graph` noted, else of the node."""
    nodes = getattr(_local, "nodes", None)
    if not nodes or name not in nodes:
        return ""
    inputs, matmuls = _local.inputs, _local.matmuls
    frontier, seen = [name], {name}
    for _ in range(MATMUL_HOPS + 1):
        for n in frontier:
            if n in matmuls and (node := nodes.get(n)) is not None and (module := module_of(node)):
                return module
        frontier = [a for n in frontier for a in inputs.get(n, ()) if a not in seen]
        seen.update(frontier)
        if not frontier:
            break
    node = nodes.get(name)
    return module_of(node) if node is not None else ""


def _bounds(value: Any, exported: bool = False) -> tuple[str, str] | None:
    """The range of a symbolic size. Tracing assumes every size symbol is at least 2 (0/1 specialization):
    a compiled graph is guarded to that, but an exported one runs from the user's `Dim` minimum, so with
    `exported` a symbol whose lower bound is that default counts from 1."""
    node = getattr(value, "node", None)
    shape_env = getattr(node, "shape_env", None)
    if shape_env is None:
        return None
    try:
        from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

        ranges = dict(shape_env.var_to_range)
        if exported and shape_env.specialize_zero_one:
            default = shape_env._default_value_range().lower
            for sym in node.expr.free_symbols:
                vr = ranges.get(sym)
                if vr is not None and vr.lower == default:
                    ranges[sym] = ValueRanges(1, vr.upper)
        vr = bound_sympy(node.expr, ranges)
        return _bound_text(vr.lower), _bound_text(vr.upper)
    except Exception:  # a report must never fail a compile: an expression it cannot bound prints as it is
        return None


def _bound_text(b: Any) -> str:
    if getattr(b, "is_Integer", False) or isinstance(b, int):
        return str(int(b))
    from torch.utils._sympy.numbers import IntInfinity, NegativeIntInfinity

    if isinstance(b, IntInfinity) or b == sympy.oo:  # torch's int_oo says is_finite, sympy's oo does not
        return "inf"
    if isinstance(b, NegativeIntInfinity) or b == -sympy.oo:
        return "-inf"
    return str(b)


def dim_text(value: Any, exported: bool = False) -> str:
    """A size of a report row: an int as itself, a symbolic size as the range its ShapeEnv allows (`2..inf`;
    one number when the range is a point), else as its expression (`s81`). `exported`: see `_bounds`."""
    if isinstance(value, torch.SymInt):
        bounds = _bounds(value, exported)
        if bounds is not None:
            lo, hi = bounds
            return lo if lo == hi else f"{lo}..{hi}"
    return str(value)


def _in_aot_compile() -> bool:
    from torch._inductor.virtualized import V

    return bool(getattr(V, "aot_compilation", False))


def shape_label(shape: Any) -> str:
    """The text of a row's (M, K, N), computed where the decision is made: in an AOTInductor compile a size
    whose lower bound only 0/1 specialization raised to 2 starts at 1, as the package runs it
    (`torch.export.Dim("batch", min=1, max=4096)` prints `1..4096`; tests/end_to_end/test_report.py)."""
    exported = _in_aot_compile()
    return ", ".join(dim_text(s, exported) for s in shape)


REASON_WIDTH = 80
# What a report says when it holds no decisions for one of two reasons a user cannot see
# (tests/tools/test_first_use.py).
NO_COMPILE_YET = (
    "qlower's pass has not run in this process yet. torch.compile compiles at the first call of the "
    "compiled callable; HF `generate` calls the model's own forward, so compile that "
    "(`model.forward = torch.compile(model.forward, options=qlower.inductor_options())`, "
    "docs/hf-generate.md). A compile Inductor serves whole from its cache does not run the pass either: "
    "see its decisions by recompiling without the caches (TORCHINDUCTOR_FORCE_DISABLE_CACHES=1), "
    "or set QLOWER_LOG=1 where it is first compiled"
)
SERVED_FROM_CACHE = (
    "qlower's pass did not run in this compile: Inductor served it whole from its cache, and the decisions "
    "were made when it was first compiled. To see them here, recompile without the caches "
    "(TORCHINDUCTOR_FORCE_DISABLE_CACHES=1, or torch._inductor.config.force_disable_caches = True), or "
    "set QLOWER_LOG=1 where it is first compiled"
)


def _cut(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def short_reason(reason: str | None, width: int = REASON_WIDTH) -> str:
    """The first clause of a reason (clauses are separated by "; "), marked when more follow, cut to `width`."""
    if not reason:
        return ""
    first, sep, _ = reason.partition("; ")
    return _cut(first + (" (+more)" if sep else ""), width)


@dataclass
class Report:
    """The decisions of one compile (all graphs Inductor compiled under one compile id)."""

    compile_id: str | None
    entries: list[Decision] = field(default_factory=list)
    # True for every report a compile opens (the pass opens it when it runs); False marks a report built to say
    # that a compile was served whole from Inductor's AOTAutograd cache (`SERVED_FROM_CACHE`).
    pass_ran: bool = True
    options: str = ""  # a served compile's pass configuration (`QLowerPass.__repr__`)
    # False for the stand-in `last_report()` returns before any compile carrying qlower's pass opened one.
    opened: bool = True

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def lowered(self) -> list[Decision]:
        return [d for d in self.entries if d.lowered]

    @property
    def left_alone(self) -> list[Decision]:
        return [d for d in self.entries if not d.lowered]

    def table(self, full: bool = False) -> str:
        """One row per decision; the reason column shows each reason's first clause, cut to REASON_WIDTH
        characters, unless `full` (`explain(i)` gives every field of row i)."""
        head = ("#", "module", "family", "device", "M, K, N", "dtype", "lowering", "form", "why")
        rows = [
            (
                str(i),
                d.module or "-",
                d.family,
                d.device,
                d.shape_text,
                "-" if d.dtype == "None" else d.dtype.replace("torch.", ""),
                d.lowering or "-- left alone --",
                d.form,
                _full_why(d) if full else d.short_reason,
            )
            for i, d in enumerate(self.entries)
        ]
        if not self.opened:
            return f"qlower report: {NO_COMPILE_YET}"
        if not self.pass_ran:
            with_options = f" with {self.options}" if self.options else ""
            return f"qlower report (compile {self.compile_id}{with_options}): {SERVED_FROM_CACHE}"
        if not rows:
            return f"qlower report (compile {self.compile_id}): no candidate linears"
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [head, *rows]
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        shortened = not full and any(d.short_reason != _full_why(d) for d in self.entries)
        return (
            f"qlower report (compile {self.compile_id}): {len(self.lowered)}/{len(self)} lowered\n"
            + "\n".join(lines)
            + (
                "\n(reasons shortened: report.explain(#) or report.table(full=True) for the whole text)"
                if shortened
                else ""
            )
        )

    def explain(self, row: int | Decision) -> str:
        """Every field of one decision (a row number of `table()` or the Decision), the reason in full."""
        d = self.entries[row] if isinstance(row, int) else row
        m = d.shape[0] if d.shape else None
        shape = d.shape_text + (f" (M = {m})" if isinstance(m, torch.SymInt) else "")
        lines = [
            f"module:   {d.module or '- (the graph did not say)'}",
            f"family:   {d.family} on {d.device}, {d.dtype.replace('torch.', '')}, form {d.form or '-'}",
            f"M, K, N:  {shape}",
            f"node:     {d.node or '-'}",
            f"lowering: {d.lowering or '-- left alone --'}" + (f" (kind {d.kind})" if d.kind else ""),
        ]
        if d.lowered:
            lines.append(f"chosen:   {d.why or '-'}")
            lines.append("passed over:" + ("" if d.passed_over else " -"))
            lines += [f"  - {c}" for c in d.passed_over_text.split("; ") if c]
        else:
            lines.append("left alone because:" + ("" if d.reason else " -"))
            lines += [f"  - {c}" for c in (d.reason or "").split("; ") if c]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


_lock = threading.Lock()
_reports: list[Report] = []
# The report of each compile that ran qlower's pass, by the compile's TracingContext (one per Dynamo compile;
# a lazily compiled backward runs under its forward's context again). Weak: a context is freed with its
# compile.
_by_context: weakref.WeakKeyDictionary[object, Report] = weakref.WeakKeyDictionary()


def _full_why(d: Decision) -> str:
    """The whole text of a row's "why" column: the choice's reason, or why it was left alone."""
    return d.why if d.lowered else (d.reason or "")


def _current_compile() -> tuple[str | None, object | None]:
    """The compile id and the tracing context object: a new context means a new compile."""
    cid = torch._guards.CompileContext.current_compile_id()
    return (None if cid is None else str(cid)), torch._guards.TracingContext.try_get()


def _append(report: Report) -> None:
    _reports.append(report)
    del _reports[:-64]


# The Dynamo compiles running now that involve qlower, by compile id: [the configuration of the qlower pass
# Inductor's caches asked for its key (`QLowerPass.__repr__`), or None; whether the pass ran]. Either may come
# first: an inference compile runs the pass before the FX graph cache asks for the key.
_compiles: dict[str, list] = {}


def _compile_ended(args: Any) -> None:
    """Dynamo's end-of-compile callback: a compile that carried a qlower pass which never ran in it was served
    whole from the AOTAutograd cache, and gets a report of its own saying so. (A lazily compiled backward
    belongs to its forward's compile, whose report it keeps.)"""
    from torch._dynamo.callback import CallbackTrigger

    with _lock:
        entry = _compiles.pop(str(args.compile_id), None)
        if args.callback_trigger != CallbackTrigger.DYNAMO:
            return
        if entry is not None and entry[0] is not None and not entry[1]:
            _append(Report(str(args.compile_id), pass_ran=False, options=entry[0]))


def _track(cid: str) -> list:
    """The entry of compile `cid` (created with Dynamo's end callback registered: `torch._dynamo.reset()`
    clears callbacks). Call with `_lock` held."""
    from torch._dynamo.callback import callback_handler

    if _compile_ended not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(_compile_ended)
    return _compiles.setdefault(cid, [None, False])


def note_cache_key(pass_config: str) -> None:
    """Inductor's caches asked a qlower pass for its key: the Dynamo compile running now (if any) carries it."""
    cid = torch._guards.CompileContext.current_compile_id()
    if cid is None:  # outside a Dynamo compile: a pass manager asking from its configuration, AOTInductor
        return
    with _lock:
        entry = _track(str(cid))
        entry[0] = entry[0] or pass_config


def start_graph() -> Report:
    """The report that decisions of the graph being compiled now belong to (a new compile, a new report)."""
    cid, context = _current_compile()
    with _lock:
        if cid is not None:
            _track(cid)[1] = True
        report = _by_context.get(context) if context is not None else None
        if report is None:
            report = Report(cid)
            _append(report)
            if context is not None:
                _by_context[context] = report
        _local.nodes = None  # until `dump_graph` notes the new graph's nodes
        return report


def add(report: Report, decision: Decision) -> None:
    if not decision.module and decision.node and (module := _decision_module(decision.node)):
        decision = dataclasses.replace(decision, module=module)
    with _lock:
        report.entries.append(decision)
    where = f" [{decision.module}]" if decision.module else ""
    if decision.lowered:
        log.info(
            "%s%s %s M,K,N=%s %s -> %s%s",
            decision.family,
            where,
            decision.device,
            decision.shape_text,
            decision.dtype,
            decision.lowering,
            f" ({decision.why})" if decision.why else "",
        )
    else:
        log.info(
            "%s%s %s M,K,N=%s %s left alone: %s",
            decision.family,
            where,
            decision.device,
            decision.shape_text,
            decision.dtype,
            decision.reason,
        )


def last_report() -> Report:
    """The report of the most recent compile that ran qlower's pass (an empty one saying the pass has not run,
    if it has not: `NO_COMPILE_YET`).

    Compiles without qlower's options leave it alone; a lazily compiled backward adds its rows, if the pass
    ran in it, to its forward's report instead of opening a new one."""
    with _lock:
        return _reports[-1] if _reports else Report(None, opened=False)


def all_reports() -> list[Report]:
    with _lock:
        return list(_reports)


def clear_reports() -> None:
    with _lock:
        _reports.clear()
        _by_context.clear()
