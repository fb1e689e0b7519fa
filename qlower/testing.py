"""Helpers for expect-tests on traced graphs: the graph exactly as qlower's pass sees it, without codegen.

gm = qlower.testing.trace_for_inductor(model, x)          # aten graph, Inductor's decompositions
report = qlower.testing.apply_pass(gm)                     # rewrite in place, like inside Inductor
self.assertExpectedInline(qlower.testing.graph_summary(gm), '''...''')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

from qlower.lowerings import KernelPreference
from qlower.passes import QLowerPass, Report, report
from qlower.patterns import FAMILIES


def trace_for_inductor(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> fx.GraphModule:
    """The inference graph Inductor's joint pass receives for `fn(*args)` (Dynamo + AOTAutograd, no codegen)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    captured: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        # No copy: the graph runs once during this call, before the caller rewrites it (and deepcopy fails
        # on some tensor-subclass constants).
        captured.append(gm)
        return gm.forward

    backend = aot_autograd(fw_compiler=keep, inference_compiler=keep, decompositions=select_decomp_table())
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=dynamic, fullgraph=True)(*args)
    assert len(captured) == 1, f"expected one graph, got {len(captured)}"
    return captured[0]


def apply_pass(
    gm: fx.GraphModule,
    *,
    families: Iterable[str] | None = None,
    kernel_preference: KernelPreference = KernelPreference.AUTO,
) -> Report:
    """Run qlower's pass on a traced graph in place and return its decisions."""
    qpass = QLowerPass(tuple(FAMILIES) if families is None else tuple(families), kernel_preference)
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    context = torch._guards.tracing(torch._guards.TracingContext(fake_mode)) if fake_mode else _null()
    with context:
        qpass(gm.graph)
        out = report.last_report()
    gm.recompile()
    return out


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _fmt(arg: Any) -> str:
    if isinstance(arg, fx.Node):
        return arg.name
    if isinstance(arg, (list, tuple)):
        return "[" + ", ".join(_fmt(a) for a in arg) + "]"
    if isinstance(arg, torch.dtype):
        return str(arg).replace("torch.", "")
    return repr(arg)


def _target_name(node: fx.Node) -> str:
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        ns, name = t.namespace, t._schema.name.split("::")[-1]
        overload = t._overloadname
        return f"{ns}.{name}" + ("" if overload == "default" else f".{overload}")
    return getattr(t, "__name__", str(t))


def graph_summary(gm: fx.GraphModule | fx.Graph) -> str:
    """One line per op node, `name: dtype[shape] = op(args)`: stable text for expect-tests."""
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    lines = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        v = node.meta.get("val")
        ty = f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}" if isinstance(v, torch.Tensor) else "sym"
        args = [_fmt(a) for a in node.args] + [f"{k}={_fmt(v)}" for k, v in node.kwargs.items()]
        lines.append(f"{node.name}: {ty} = {_target_name(node)}({', '.join(args)})")
    return "\n".join(lines)
