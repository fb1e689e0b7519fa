"""Graphs as Inductor's decompositions leave them on a GPU (or any device), traced on any machine with fake
tensors (shared by tests)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def fake_cuda_trace(
    fn: Callable[..., torch.Tensor], *tensors: torch.Tensor, coordinate_descent: bool = True
) -> torch.fx.GraphModule:
    """`fn` traced with Inductor's decomposition table, every tensor a fake CUDA copy of `tensors`'s. With
    `coordinate_descent_tuning` on (torchao's `quantize_` turns it on), an `mm` or `bmm` with M = 1 becomes
    Inductor's fp32 matvec `sum(a * b)`; the graph's ops name no device, so it also runs on CPU tensors."""
    with torch._inductor.config.patch(coordinate_descent_tuning=coordinate_descent), FakeTensorMode():
        fakes = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in tensors]
        return make_fx(fn, decomposition_table=select_decomp_table())(*fakes)


def woq(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w.to(x.dtype)) * s


def fake_woq_graph(
    device: str, m: int = 4, k: int = 64, n: int = 32, dtype: torch.dtype = torch.bfloat16
) -> torch.fx.GraphModule:
    """A woq-int8 graph whose tensors live on `device`, traced with fake tensors (no hardware needed)."""
    with FakeTensorMode():
        x = torch.empty(m, k, dtype=dtype, device=device)
        w = torch.empty(n, k, dtype=torch.int8, device=device)
        s = torch.empty(n, dtype=dtype, device=device)
        return make_fx(woq, decomposition_table=select_decomp_table())(x, w, s)


def symbolic_m_woq_graph(k: int, n: int) -> torch.fx.GraphModule:
    """A woq-int8 graph on fake CUDA tensors whose M is a size symbol (a dynamic batch)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    m = env.create_symintnode(env.create_symbol(4, ConstantSource("m")), hint=4)
    with FakeTensorMode(shape_env=env):
        x = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(n, k, dtype=torch.int8, device="cuda")
        s = torch.empty(n, dtype=torch.bfloat16, device="cuda")

    return make_fx(woq, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(x, w, s)
