"""The TTIR access analysis torch runs per Triton launch is run once per kernel configuration
(`lowerings/graph/triton_access_cache.py`): counts, on CPU (the analysis itself needs no GPU to be counted)."""

from __future__ import annotations

import importlib.util

import pytest
import sympy
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from qlower import testing
from qlower.patterns import FAMILIES
from tests.forms.woq_int8 import WoqLinear

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    return copy_kernel


def test_one_analysis_per_configuration():
    """Sizes and symbols do not change the key; a constexpr, a dtype or an int value does; a real tensor or a
    host TMA descriptor is never cached; a hit returns a copy."""
    from qlower.lowerings.graph.triton_access_cache import cached

    kernel = _kernel()
    calls = []

    def analysis(kernel_, kwargs, tma):
        calls.append(sorted(kwargs))
        return ["y_ptr"]

    run = cached(analysis)
    with FakeTensorMode():
        a, b = torch.empty(8), torch.empty(1024)
        h = torch.empty(8, dtype=torch.float16)
    s0, s1 = sympy.Symbol("s0"), sympy.Symbol("s1")

    def args(x, n, block):
        return {"x_ptr": x, "y_ptr": x, "n": n, "BLOCK": block}

    assert run(kernel, args(a, s0, 64), {}) == ["y_ptr"]
    out = run(kernel, args(b, 2 * s1 + 1, 64), {})  # other sizes, another symbol: a hit
    assert len(calls) == 1
    out.append("x_ptr")  # the caller's copy
    assert run(kernel, args(a, s0, 64), {}) == ["y_ptr"] and len(calls) == 1
    run(kernel, args(a, s0, 128), {})  # another constexpr
    run(kernel, args(h, s0, 64), {})  # another dtype
    run(kernel, args(a, 16, 64), {})  # an int: Triton specializes on its value
    run(kernel, args(a, 17, 64), {})
    assert len(calls) == 5
    real = torch.empty(8)
    run(kernel, args(real, s0, 64), {})
    run(kernel, args(real, s0, 64), {})  # a real tensor: its address alignment matters, never cached
    run(kernel, args(a, s0, 64), {"x_ptr": ("stable", ([8],))})  # a host TMA descriptor: never cached
    assert len(calls) == 8


class _Stack(nn.Module):
    """`layers` woq linears of one shape, each on the same input (independent records)."""

    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(WoqLinear(64, 64, torch.bfloat16) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(layer(x) for layer in self.layers)


def _lower_stack(layers: int, monkeypatch) -> tuple[int, int]:
    """(analyses torch ran, Triton launches emitted) for `layers` woq linears lowered with a symbolic M."""
    from torch._higher_order_ops import triton_kernel_wrap

    from qlower.lowerings.devices import cuda as cuda_rules
    from qlower.lowerings.graph import triton_access_cache
    from qlower.lowerings.preference import KernelPreference

    name = next(n for n in triton_access_cache.ANALYSES if hasattr(triton_kernel_wrap, n))
    original = getattr(triton_kernel_wrap, name)
    original = getattr(original, "__wrapped__", original)  # under an earlier install's cache
    count = [0]

    def counted(*args, **kw):
        count[0] += 1
        return original(*args, **kw)

    monkeypatch.setattr(triton_kernel_wrap, name, counted)  # install() caches it afresh
    gm = testing.trace_for_inductor(_Stack(layers), torch.randn(2, 5, 64, dtype=torch.bfloat16), dynamic=True)
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        records = FAMILIES["woq_int8"](gm.graph)
        assert len(records) == layers
        for rec in records:
            rec.output.replace_all_uses_with(
                cuda_rules.WOQ_INT8_TRITON.emit(gm.graph, rec, KernelPreference.AUTO)
            )
        gm.graph.eliminate_dead_code()
    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    graphs = [sub.graph for _, sub in gm.named_modules() if isinstance(sub, torch.fx.GraphModule)]
    launches = sum(1 for g in graphs for n in g.nodes if n.target is hop)  # the branches' graphs too
    assert getattr(getattr(triton_kernel_wrap, name), "_qlower_cached", False)
    return count[0], launches


def test_a_stack_of_linears_is_analysed_as_one(monkeypatch):
    """Four woq linears of one shape with a symbolic M emit four times the launches of one, and torch's TTIR
    analysis runs as often as for one: once per kernel configuration, at most once per launch of a linear."""
    one, launches_one = _lower_stack(1, monkeypatch)
    four, launches_four = _lower_stack(4, monkeypatch)
    assert launches_one >= 3 and launches_four == 4 * launches_one, (launches_one, launches_four)
    assert 1 <= one <= launches_one and four == one, (one, four, launches_one)
