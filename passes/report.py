"""What qlower decided for every candidate linear of a compile, as data, a printable table and INFO logs.

`QLOWER_LOG=1` sends each decision to the `qlower` logger at INFO. `QLOWER_DUMP_GRAPHS=DIR` writes every
graph the pass receives, before any rewrite, to DIR/graph_<pid>_<n>.txt (one line per node with its dtype and
shape): what a pattern saw when a linear was not recognized, on a machine where only the log comes back.
"""

from __future__ import annotations

import logging
import os
import threading
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
    desc = f"{val.dtype}{list(val.shape)} strides={list(val.stride())}" if isinstance(val, torch.Tensor) else ""
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
    # False when a compile started but qlower's pass never ran in it: Inductor served the graph from its
    # FX-graph / AOTAutograd cache (decisions were made, and reported, when it was first compiled), or the
    # backend was not Inductor.
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
                "(served from Inductor's FX-graph/AOTAutograd cache, or not compiled by Inductor)"
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


_last_context: list[object] = []


def _current_compile() -> tuple[str | None, object | None]:
    """The compile id and the tracing context object: a new context means a new compile."""
    cid = torch._guards.CompileContext.current_compile_id()
    return (None if cid is None else str(cid)), torch._guards.TracingContext.try_get()


def _append(report: Report) -> None:
    _reports.append(report)
    del _reports[:-64]


def _on_compile_start(args: object) -> None:
    """Dynamo starts a compile: open its report now, so a compile the pass never sees still has one."""
    with _lock:
        _append(Report(str(getattr(args, "compile_id", None)), pass_ran=False))
        _last_context[:] = []


def start_graph() -> Report:
    """The report that decisions of the graph being compiled now belong to (a new compile, a new report)."""
    cid, context = _current_compile()
    with _lock:
        last = _reports[-1] if _reports else None
        if last is not None and not last.pass_ran:  # opened by Dynamo's compile-start callback
            last.pass_ran = True
            _last_context[:] = [context]
            return last
        same = last is not None and context is not None and _last_context and _last_context[0] is context
        if not same:
            _append(Report(cid))
            _last_context[:] = [context]
        return _reports[-1]


def watch_compiles() -> None:
    """Open a report at every Dynamo compile start (idempotent; `torch._dynamo.reset()` drops callbacks, so
    `inductor_options()` calls this before each compile it configures)."""
    handler = torch._dynamo.callback_handler
    if _on_compile_start not in handler.start_callbacks:
        handler.register_start_callback(_on_compile_start)


watch_compiles()


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
    """Decisions of the most recent compile that ran qlower's pass (empty if none has run)."""
    with _lock:
        return _reports[-1] if _reports else Report(None)


def all_reports() -> list[Report]:
    with _lock:
        return list(_reports)


def clear_reports() -> None:
    with _lock:
        _reports.clear()
        _last_context.clear()
