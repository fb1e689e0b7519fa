"""Emit a triton_op into a post-AOT graph already decomposed, as AOTAutograd would have done.

qlower's pass runs after functionalization, so a triton_op node emitted as-is would stay an opaque custom op
(a Python fallback under torch.compile, the proxy executor under AOTInductor). Tracing the op under
FunctionalTensorMode yields the `triton_kernel_wrapper_functional` nodes (plus the allocations and the
SymInt arithmetic of the grid) that Inductor compiles itself; they are copied in before the anchor node.

Tracing (make_fx + functionalization of every launch) is most of a Triton linear's emission time (BENCHMARKS.md,
"compile seconds"). Linears of one shape trace alike: a caller that passes a `key` (the op and its
non-tensor arguments) gets one trace per (key, input sizes, strides, dtypes) per graph, copied again for each
linear with fresh fake values (`_refresh_fakes`), so no two nodes share a fake tensor (Inductor's reinplacing
reads aliasing from them). The cache lives on the graph: a new compile, preference or device starts empty.

The copies of a trace also share its branch graphs (the `torch.cond` subgraphs of a symbolic M) under Python's
wrapper: Inductor lowers a subgraph once per get_attr target (`GraphLowering.seen_subgraphs`) and defines it
once as a function that every `if` calls, so a decoder's linears of one shape cost one lowering and one
codegen per M range, not one per linear (`tests/lowerings/emit/test_trace_reuse.py`). A C++ wrapper
(AOTInductor, `cpp_wrapper`) inlines each call of a subgraph; there each copy keeps branch graphs of its own.

A trace adds no guard on a symbolic M (`unguarded_gated_sizes`): a guard there would make Dynamo compile the
graph again at the next batch size (tests/lowerings/emit/test_no_guards_on_m.py).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._guards import detect_fake_mode
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from qlower.lowerings.graph import triton_access_cache
from qlower.lowerings.graph.builder import EMITTED_BRANCH, Emitter
from qlower.patterns.graph_utils import graph_memo


def unguarded_gated_sizes() -> contextlib.AbstractContextManager:
    """The tracing context of qlower's kernel launches: a symbolic M's gated launch sizes its scratch (and a
    gated dense GEMM its K) by M * gate, where the gate is 0 or 1 by M's range (`launch_args.m_range_gate`).
    Tracing such a size asks whether it is below 2 (make_fx's constant tracking) or 0 or 1 (contiguity), none
    of which M's range decides, so each would become a guard on M, and Dynamo would recompile the graph at the
    next range's batch size. Size-oblivious answers (as for a size of at least 2, true of every running range)
    need no guard; they only shape metadata, since a gated-off launch computes nothing."""
    from torch.fx.experimental import _config as fx_config

    if not hasattr(fx_config, "backed_size_oblivious"):
        return contextlib.nullcontext()
    return fx_config.patch(backed_size_oblivious=True)


def emit_traced(
    em: Emitter, fn: Callable[..., torch.Tensor], tensors: Sequence[fx.Node], key: Hashable | None = None
) -> fx.Node:
    """Trace `fn(*tensor values)` (non-tensor arguments are closed over) and splice it in before `em.before`.

    `key`: what besides the tensors' metadata determines the trace (the op and its other arguments); with it,
    a trace of this graph with the same key and tensor metadata is reused instead of traced again."""
    triton_access_cache.install()  # one TTIR access analysis per kernel configuration, not per launch
    fakes = [t.meta["val"] for t in tensors]
    fake_mode = detect_fake_mode(fakes)
    if fake_mode is None:
        raise RuntimeError("qlower: no fake mode found for the inputs of a Triton lowering")
    cache = graph_memo(em.graph, "traces")
    full_key = None if key is None else (key, tuple(_describe(f) for f in fakes))
    sub = cache.get(full_key) if full_key is not None else None
    reused = sub is not None
    if sub is None:
        with fake_mode, unguarded_gated_sizes():
            # Inductor's decompositions too: the post-grad graph must not hold ops it only decomposes (an
            # `aten.zeros` there fails its lowering with "both a fallback and a decomp")
            sub = make_fx(
                dispatch_functionalize(fn, FunctionalTensorMode()),
                decomposition_table=select_decomp_table(),
                tracing_mode="real",
            )(*fakes)
        _adopt_submodules(em.graph, sub)
        if full_key is not None:
            cache[full_key] = sub
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    val_map: dict[fx.Node, Any] = dict(zip(placeholders, tensors, strict=True))
    with em.graph.inserting_before(em.before):
        out = em.graph.graph_copy(sub.graph, val_map)
    new = _inserted_before(
        em.before, sum(1 for n in sub.graph.nodes if n.op not in ("placeholder", "output"))
    )
    for node in new:
        node.meta["qlower"] = True
    if reused:
        if not shares_branches():
            _copy_branches(em.graph, new)
        _refresh_fakes(em.graph, new, fake_mode)
    assert isinstance(out, fx.Node)
    return out


def _inserted_before(anchor: fx.Node, count: int) -> list[fx.Node]:
    """The `count` nodes just inserted before `anchor`, in graph order: walked back from it, not found by
    comparing the whole graph before and after (which costs a graph's size per linear)."""
    nodes, node = [], anchor
    for _ in range(count):
        node = node.prev
        nodes.append(node)
    return nodes[::-1]


def shares_branches() -> bool:
    """Whether copies of a trace point at its branch graphs rather than copies of them: under Python's
    wrapper, which lifts each subgraph into one function (see the module docstring)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.virtualized import V

    return not (inductor_config.cpp_wrapper or getattr(V, "aot_compilation", False))


def _describe(val: Any) -> Hashable:
    """What a trace reads of an input: sizes and strides (symbolic ones by expression), dtype, device."""
    if not isinstance(val, torch.Tensor):
        return ("value", str(val))
    return (
        tuple(str(s) for s in val.shape),
        tuple(str(s) for s in val.stride()),
        str(val.storage_offset()),
        val.dtype,
        val.device,
    )


def _copy_branches(graph: fx.Graph, nodes: Sequence[fx.Node]) -> None:
    """Point the copied get_attr nodes at copies of their branch graphs, under names free on the module: each
    `torch.cond` keeps branches of its own, as a fresh trace would give it (a C++ wrapper inlines every call
    of a subgraph, `shares_branches`)."""
    gm = graph.owning_module
    for node in nodes:
        branch = getattr(gm, node.target) if node.op == "get_attr" else None
        if not isinstance(branch, fx.GraphModule):
            continue
        node.target = _free_name(gm, node.target)
        gm.add_submodule(node.target, _copy_module(branch))


def _copy_module(branch: fx.GraphModule) -> fx.GraphModule:
    """A copy of a branch graph and of the branch graphs it holds (a cond tree), nodes' meta shallow-copied."""
    g = fx.Graph()
    out = g.output(g.graph_copy(branch.graph, {}))
    original = next(n for n in reversed(branch.graph.nodes) if n.op == "output")
    out.meta = dict(original.meta)  # graph_copy leaves the output node (and its meta) out
    dup = fx.GraphModule(branch, g)
    dup.meta.update(branch.meta)
    for node in g.nodes:
        inner = getattr(dup, node.target) if node.op == "get_attr" else None
        if isinstance(inner, fx.GraphModule):
            setattr(dup, node.target, _copy_module(inner))
    return dup


def _free_name(gm: torch.nn.Module, name: str) -> str:
    base, i = name, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name


@functools.cache
def fresh_output_ops() -> frozenset[Any]:
    """The higher-order ops whose outputs are tensors of their own (`_refresh_fakes`)."""
    hops = torch.ops.higher_order
    return frozenset({hops.cond, hops.triton_kernel_wrapper_functional})


def _refresh_fakes(graph: fx.Graph, nodes: Sequence[fx.Node], fake_mode: Any) -> None:
    """New fake values for copied nodes, from their (already fresh) inputs: each node runs under `fake_mode`,
    except the ops whose outputs are new tensors by contract (`fresh_output_ops`: a `torch.cond`'s outputs
    alias none of its operands, a functional Triton launch returns clones), which get fresh fakes of the traced
    outputs' sizes, strides and dtypes. A copy's operands have the trace's metadata (the cache key), so those
    outputs do too; running them under fake mode ran both branch graphs of every cond again (nested ones in
    turn) and each launch's argument handling, most of a copy's cost (`scripts/bench_pass.py`; the fakes:
    tests/lowerings/emit/test_trace_reuse.py). Other nodes (views among them, whose fakes must alias their
    base's) run."""
    gm = graph.owning_module
    fresh_outputs = fresh_output_ops()

    def fresh(t: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)

    def value(a: Any) -> Any:
        if not isinstance(a, fx.Node):
            return a
        if a.op == "get_attr":
            return getattr(gm, a.target)
        return a.meta["val"]

    with fake_mode, unguarded_gated_sizes():
        for node in nodes:
            if node.op != "call_function":
                continue
            traced = node.meta.get("val")
            if node.target in fresh_outputs and isinstance(traced, (list, tuple, dict)):
                node.meta["val"] = pytree.tree_map_only(torch.Tensor, fresh, traced)
                continue
            args = fx.node.map_aggregate(node.args, value)
            kwargs = fx.node.map_aggregate(node.kwargs, value)
            node.meta["val"] = node.target(*args, **kwargs)


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
        name = _free_name(gm, node.target)
        branch = getattr(sub, node.target)
        for module in branch.modules():
            if isinstance(module, fx.GraphModule):
                module.meta[EMITTED_BRANCH] = True
        gm.add_submodule(name, branch)
        node.target = name
