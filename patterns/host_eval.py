"""Running a slice of an FX graph on real host tensors, with the values Inductor's fake tensors stand for.

Why: a recognizer proves what a subgraph computes by running it (`mx_verify`), and reads a scale layout by
running its layout ops on indices (`mx._scale_source`). Shape arguments are rewritten so a probe may run on
fewer rows than the graph holds (`shrink`); symbolic sizes run at their hints; stored constants run at their
compile-time values (`stored_value`).
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import HOST_DEVICE, aten, prims, tensor_val

_SHAPE_ARG = {
    aten.view.default: 1,
    aten.reshape.default: 1,
    aten._unsafe_view.default: 1,
    aten.expand.default: 1,
    aten.full.default: 0,
}


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


def stored_value(node: fx.Node) -> torch.Tensor | None:
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


def hint(x: Any) -> Any:
    if isinstance(x, torch.SymInt):
        if x.node.hint is not None:
            return int(x.node.hint)
        return int(x.node.shape_env.size_hint(x.node.expr))
    return x


def concrete_shape(node: fx.Node) -> list[int]:
    v = tensor_val(node)
    assert v is not None
    return [int(hint(s)) for s in v.shape]


class NoShrink(Exception):
    pass


def shrink(shape: list[int], rows: int, new_rows: int) -> list[int]:
    """The same row-major shape for `new_rows` rows instead of `rows` (the first prefix holding whole rows)."""
    if new_rows == rows or prod(shape) % rows:
        return list(shape)
    acc = 1
    for d, s in enumerate(shape):
        acc *= s
        if acc % rows == 0:
            if (s * new_rows) % rows:
                raise NoShrink(shape)
            return [*shape[:d], s * new_rows // rows, *shape[d + 1 :]]
    raise NoShrink(shape)


def evaluate(
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
        if n.op == "get_attr" and module is not None and (stored := stored_value(n)) is not None:
            return stored
        if isinstance(v, torch.SymInt):
            return hint(v)
        raise NoShrink(f"no value for {n}")

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
            args[pos] = shrink(concrete_shape(node), rows, new_rows)
        if node.target is aten.slice.Tensor and new_rows != rows:
            src = tensor_val(node.args[0])
            dim = args[1] if len(args) > 1 else 0
            assert src is not None
            old, new = int(hint(src.shape[dim])), args[0].shape[dim]
            end = args[3] if len(args) > 3 else None
            if old != new and end is not None and end < old:
                raise NoShrink("slice along the rows")
        env[node] = node.target(*args, **kwargs)
    return env


_ORDER_CACHE: dict[int, tuple[int, dict[fx.Node, int]]] = {}


def forget_graph_orders() -> None:
    """Drop the cached order (a recognizer's `find` ends with this: the cache holds one graph's nodes)."""
    _ORDER_CACHE.clear()


def graph_order(graph: fx.Graph) -> dict[fx.Node, int]:
    """Each node's position in `graph` (cached for the graph being matched)."""
    key = id(graph)
    n = len(graph.nodes)
    hit = _ORDER_CACHE.get(key)
    if hit is None or hit[0] != n:
        hit = (n, {node: i for i, node in enumerate(graph.nodes)})
        _ORDER_CACHE.clear()
        _ORDER_CACHE[key] = hit
    return hit[1]
