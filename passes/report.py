"""What qlower decided for every candidate linear of a compile, as data, a printable table and INFO logs.

`QLOWER_LOG=1` sends each decision to the `qlower` logger at INFO. `QLOWER_DUMP_GRAPHS=DIR` writes every
graph the pass receives, before any rewrite, to DIR/graph_<pid>_<n>.txt (one line per node with its dtype and
shape): what a pattern saw when a linear was not recognized, on a machine where only the log comes back.
One report per compile whose Inductor config carries qlower's pass (`note_compile`, `start_graph`).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

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


def dump_graph(graph: Any) -> None:
    """Write `graph` to $QLOWER_DUMP_GRAPHS/graph_<pid>_<n>.txt when that variable is set."""
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
    reason: str | None  # why it was left alone, or which faster lowerings were passed over and why
    kind: str | None = None  # the chosen lowering's KernelPreference kind
    form: str = ""  # the graph form the pattern matched
    node: str = ""  # name of the replaced node in the graph

    @property
    def lowered(self) -> bool:
        return self.lowering is not None


@dataclass
class Report:
    """The decisions of one compile (all graphs Inductor compiled under one compile id)."""

    compile_id: str | None
    entries: list[Decision] = field(default_factory=list)
    # False when a compile that carried qlower's pass never ran it: Inductor served the graph whole from its
    # AOTAutograd cache (decisions were made, and reported, when it was first compiled).
    pass_ran: bool = True

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

    def table(self) -> str:
        head = ("family", "device", "M, K, N", "dtype", "lowering", "form", "reason")
        rows = [
            (
                d.family,
                d.device,
                ", ".join(str(s) for s in d.shape),
                d.dtype.replace("torch.", ""),
                d.lowering or "-- left alone --",
                d.form,
                d.reason or "",
            )
            for d in self.entries
        ]
        if not self.pass_ran:
            return (
                f"qlower report (compile {self.compile_id}): qlower's pass did not run in this compile "
                "(served whole from Inductor's AOTAutograd cache; its decisions were reported when it was "
                "first compiled)"
            )
        if not rows:
            return f"qlower report (compile {self.compile_id}): no candidate linears"
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in [head, *rows]
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return (
            f"qlower report (compile {self.compile_id}): {len(self.lowered)}/{len(self)} lowered\n"
            + "\n".join(lines)
        )

    __str__ = table


_lock = threading.Lock()
_reports: list[Report] = []
# The report of each compile that carried qlower's pass, by the compile's TracingContext (one per Dynamo
# compile; a lazily compiled backward runs under its forward's context again). Weak: a context is freed
# with its compile.
_by_context: weakref.WeakKeyDictionary[object, Report] = weakref.WeakKeyDictionary()


def _current_compile() -> tuple[str | None, object | None]:
    """The compile id and the tracing context object: a new context means a new compile."""
    cid = torch._guards.CompileContext.current_compile_id()
    return (None if cid is None else str(cid)), torch._guards.TracingContext.try_get()


def _append(report: Report) -> None:
    _reports.append(report)
    del _reports[:-64]


def note_compile() -> None:
    """A compile whose Inductor config carries qlower's pass asks for the pass's cache key: open its report.

    The FX-graph and AOTAutograd caches key on `QLowerPass.uuid()` before they look up a graph, so a compile
    they serve whole, which never runs the pass, still gets a report saying so (`pass_ran=False`). Compiles
    without qlower's pass never get here (tests/test_report_and_errors.py::test_unrelated_compile_*), and a
    lazy backward finds its forward's report open already
    (tests/test_report_and_errors.py::test_report_after_backward_*).
    """
    cid, context = _current_compile()
    if context is None:  # not inside a compile: the key asked for by hand
        return
    with _lock:
        if context not in _by_context:
            report = Report(cid, pass_ran=False)
            _by_context[context] = report
            _append(report)


def start_graph() -> Report:
    """The report that decisions of the graph being compiled now belong to (a new compile, a new report)."""
    cid, context = _current_compile()
    with _lock:
        report = _by_context.get(context) if context is not None else None
        if report is None:
            report = Report(cid)
            _append(report)
            if context is not None:
                _by_context[context] = report
        report.pass_ran = True
        return report


def add(report: Report, decision: Decision) -> None:
    with _lock:
        report.entries.append(decision)
    if decision.lowered:
        log.info(
            "%s %s M,K,N=%s %s -> %s%s",
            decision.family,
            decision.device,
            decision.shape,
            decision.dtype,
            decision.lowering,
            f" ({decision.reason})" if decision.reason else "",
        )
    else:
        log.info(
            "%s %s M,K,N=%s %s left alone: %s",
            decision.family,
            decision.device,
            decision.shape,
            decision.dtype,
            decision.reason,
        )


def last_report() -> Report:
    """The report of the most recent compile that carried qlower's pass (empty if none has run).

    Compiles without qlower's options leave it alone; a lazily compiled backward adds its rows, if the pass
    ran in it, to its forward's report instead of opening a new one."""
    with _lock:
        return _reports[-1] if _reports else Report(None)


def all_reports() -> list[Report]:
    with _lock:
        return list(_reports)


def clear_reports() -> None:
    with _lock:
        _reports.clear()
        _by_context.clear()
