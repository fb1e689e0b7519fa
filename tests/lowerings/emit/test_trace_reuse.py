"""Linears of one shape are traced once per graph (`lowerings/graph/triton_inline.emit_traced`'s key): the
copies get launches, branch graphs and fake values of their own. On CPU, for each Triton emitter (woq int8,
dynamic int8, MX): the structure of the emitted graph (its numbers on the GPU:
tests/end_to_end/test_dynamic_m_gpu.py's multi-linear models)."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import pytest
import torch
from torch import nn

from qlower import testing
from qlower.lowerings.preference import KernelPreference
from qlower.patterns import FAMILIES
from tests.forms import dynamic_int8 as dyn
from tests.forms import mx as mx_forms
from tests.forms.woq_int8 import WoqLinear

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _woq(k: int, n: int, seed: int) -> nn.Module:
    return WoqLinear(k, n, torch.bfloat16)


def _dyn(k: int, n: int, seed: int) -> nn.Module:
    return dyn.IntMMDivide(k, n, seed=seed)


def _mx(k: int, n: int, seed: int) -> nn.Module:
    return mx_forms.MXLinear(None, "e2m1", n, k, seed=seed)


def _emitter(family: str) -> Callable:
    """The CUDA Triton lowering's emitter of `family`, as the pass calls it under AUTO."""
    from qlower.lowerings.devices import cuda as cuda_rules

    lowering = {
        "woq_int8": cuda_rules.WOQ_INT8_TRITON,
        "dynamic_int8": cuda_rules.DYNAMIC_INT8_TRITON,
        "mx": cuda_rules.MX_TRITON,
    }[family]
    return functools.partial(lowering.emit, preference=KernelPreference.AUTO)


FAMILY_MODELS = {"woq_int8": _woq, "dynamic_int8": _dyn, "mx": _mx}


class _Stack(nn.Module):
    """Linears of the given (in, out) shapes (one in), each on the same input (independent records)."""

    def __init__(self, family: str, shapes: list[tuple[int, int]]) -> None:
        super().__init__()
        make = FAMILY_MODELS[family]
        self.layers = nn.ModuleList(make(k, n, i) for i, (k, n) in enumerate(shapes))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [layer(x) for layer in self.layers]


def _emit(family: str, shapes: list[tuple[int, int]], monkeypatch) -> tuple[torch.fx.GraphModule, int]:
    """The graph with every linear of `family` emitted as Triton launches (symbolic M), and how many traces ran."""
    from qlower.lowerings.graph import triton_inline as inline

    traces = [0]
    original = inline.make_fx

    def counted(*args, **kw):
        traces[0] += 1
        return original(*args, **kw)

    monkeypatch.setattr(inline, "make_fx", counted)
    x = torch.randn(5, shapes[0][0], dtype=torch.bfloat16)  # M one size symbol: a host `torch.cond`
    gm = testing.trace_for_inductor(_Stack(family, shapes), x, dynamic=True)
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    emit = _emitter(family)
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        records = FAMILIES[family](gm.graph)
        assert len(records) == len(shapes)
        for rec in records:
            rec.output.replace_all_uses_with(emit(gm.graph, rec))
        gm.graph.eliminate_dead_code()
    return gm, traces[0]


def _launches(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    graphs = [sub.graph for _, sub in gm.named_modules() if isinstance(sub, torch.fx.GraphModule)]
    return [n for g in graphs for n in g.nodes if n.target is hop]


def _branch_targets(gm: torch.fx.GraphModule) -> list[str]:
    return [
        n.target
        for n in gm.graph.nodes
        if n.op == "get_attr" and isinstance(getattr(gm, n.target), torch.fx.GraphModule)
    ]


# Every family with Inductor's Python wrapper; with cpp_wrapper (where each call of a subgraph is inlined,
# `graph.triton_inline`) one family: the reuse is family-blind, the inlining is the wrapper's.
REUSE_CASES = [(f, False) for f in FAMILY_MODELS] + [(next(iter(FAMILY_MODELS)), True)]


@pytest.mark.parametrize(("family", "cpp_wrapper"), REUSE_CASES)
def test_linears_of_one_shape_trace_once_and_copy_apart(family, cpp_wrapper, monkeypatch):
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_config, "cpp_wrapper", cpp_wrapper)
    one, traces_one = _emit(family, [(64, 96)], monkeypatch)
    four, traces_four = _emit(family, [(64, 96)] * 4, monkeypatch)
    assert traces_one == traces_four == 1
    one_targets, targets = _branch_targets(one), _branch_targets(four)
    assert one_targets and len(targets) == 4 * len(one_targets)  # a cond per range per linear
    if cpp_wrapper:
        # the C++ wrapper inlines each call: every linear has branch graphs of its own (no target shared, no
        # module object twice), each holding its launches
        assert len(set(targets)) == len(targets)
        assert len({id(getattr(four, t)) for t in targets}) == len(targets)
        assert len(_launches(four)) == 4 * len(_launches(one)) > 0
    else:
        # Python's wrapper lowers and defines a subgraph once per target: the four linears call the first
        # one's branch graphs, whose launches are all the module holds
        assert set(targets) == set(one_targets) and len(_launches(four)) == len(_launches(one)) > 0

    # the main graph's nodes have fake values of their own: two nodes sharing one fake tensor would read as
    # aliases to Inductor's reinplacing (one more copy per launch)
    fakes = [n.meta["val"] for n in four.graph.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    assert len({id(v) for v in fakes}) == len(fakes)
    _fresh_outputs_match_a_run(four)


def _fresh_outputs_match_a_run(gm: torch.fx.GraphModule) -> None:
    """A copied `torch.cond` or functional Triton launch gets fresh fakes of the traced node's outputs, not a run
    of the op (`triton_inline._refresh_fakes`): each output a fake of its own, with the sizes, strides and dtype
    that running the op on its operands' fakes gives."""
    from qlower.lowerings.graph.triton_inline import fresh_output_ops

    nodes = [n for n in gm.graph.nodes if n.target in fresh_output_ops()]
    outs = [t for n in nodes for t in torch.utils._pytree.tree_leaves(n.meta["val"])]
    assert len(nodes) > 1 and len({id(t) for t in outs}) == len(outs)
    fake_mode = torch._guards.detect_fake_mode(outs)

    def value(a):
        if not isinstance(a, torch.fx.Node):
            return a
        return getattr(gm, a.target) if a.op == "get_attr" else a.meta["val"]

    def meta(v):
        return [(t.shape, t.stride(), t.dtype) for t in torch.utils._pytree.tree_leaves(v)]

    with fake_mode:
        for node in nodes:
            ran = node.target(
                *torch.fx.node.map_aggregate(node.args, value),
                **torch.fx.node.map_aggregate(node.kwargs, value),
            )
            assert meta(ran) == meta(node.meta["val"]), node


@pytest.mark.parametrize("family", list(FAMILY_MODELS))
def test_gated_launch_copies_have_fresh_fakes(family, monkeypatch):
    """Under CUDA graphs (launches gated by M in the main graph) the copies' launches get fakes of their own."""
    from torch._inductor import config as inductor_config

    monkeypatch.setattr(inductor_config.triton, "cudagraphs", True)
    four, traces = _emit(family, [(64, 96)] * 4, monkeypatch)
    assert traces == 1
    _fresh_outputs_match_a_run(four)


@pytest.mark.parametrize("family", list(FAMILY_MODELS))
def test_other_shapes_trace_again(family, monkeypatch):
    _, traces = _emit(family, [(64, 96), (64, 96), (64, 128), (64, 32)], monkeypatch)
    assert traces == 3
