"""Emit a triton_op into a post-AOT graph already decomposed, as AOTAutograd would have done.

qlower's pass runs after functionalization, so a triton_op node emitted as-is would stay an opaque custom op
(a Python fallback under torch.compile, the proxy executor under AOTInductor). Tracing the op under
FunctionalTensorMode yields the `triton_kernel_wrapper_functional` nodes (plus the allocations and the
SymInt arithmetic of the grid) that Inductor compiles itself; they are copied in before the anchor node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from qlower.lowerings.emit import triton_access_cache
from qlower.lowerings.emit.common import EMITTED_BRANCH, Emitter


def emit_traced(em: Emitter, fn: Callable[..., torch.Tensor], tensors: Sequence[fx.Node]) -> fx.Node:
    """Trace `fn(*tensor values)` (non-tensor arguments are closed over) and splice it in before `em.before`."""
    triton_access_cache.install()  # one TTIR access analysis per kernel configuration, not per launch
    fakes = [t.meta["val"] for t in tensors]
    fake_mode = detect_fake_mode(fakes)
    if fake_mode is None:
        raise RuntimeError("qlower: no fake mode found for the inputs of a Triton lowering")
    with fake_mode:
        # Inductor's decompositions too: the post-grad graph must not hold ops it only decomposes (an
        # `aten.zeros` there fails its lowering with "both a fallback and a decomp")
        sub = make_fx(
            dispatch_functionalize(fn, FunctionalTensorMode()),
            decomposition_table=select_decomp_table(),
            tracing_mode="real",
        )(*fakes)
    _adopt_submodules(em.graph, sub)
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    val_map: dict[fx.Node, Any] = dict(zip(placeholders, tensors, strict=True))
    before = set(em.graph.nodes)
    with em.graph.inserting_before(em.before):
        out = em.graph.graph_copy(sub.graph, val_map)
    for node in em.graph.nodes:
        if node not in before:
            node.meta["qlower"] = True
    assert isinstance(out, fx.Node)
    return out


def _adopt_submodules(graph: fx.Graph, sub: fx.GraphModule) -> None:
    """Move the branch graphs of `sub`'s `torch.cond` nodes (its get_attr targets) onto `graph`'s module under
    names free there, and point the get_attr nodes at them, so the copied nodes find their branches. Each is
    marked as qlower's (nested ones too): Inductor runs the joint passes, qlower's among them, on subgraphs a
    pass created, and qlower's own output is no candidate."""
    gm = graph.owning_module
    for node in sub.graph.nodes:
        if node.op != "get_attr":
            continue
        if gm is None:
            raise RuntimeError("qlower: a traced lowering holds subgraphs but the target graph has no module")
        name, i = node.target, 0
        while hasattr(gm, name):
            i += 1
            name = f"{node.target}_{i}"
        branch = getattr(sub, node.target)
        for module in branch.modules():
            if isinstance(module, fx.GraphModule):
                module.meta[EMITTED_BRANCH] = True
        gm.add_submodule(name, branch)
        node.target = name
