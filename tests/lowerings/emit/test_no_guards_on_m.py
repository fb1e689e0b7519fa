"""A symbolic M's lowering adds no guard on M: a guard makes Dynamo compile the graph again at the next batch
size that breaks it, so a serving loop (batch 16, then 64, then 128) compiles once per range instead of once.

Every family whose kernels run a symbolic M per range (woq-int8 with and without the CUTLASS branch, dynamic int8,
MXFP4 with and without the CUTLASS branch, MXFP8), on shapes that take split-K ranges and dense ranges, under CUDA
graphs (gated launches: scratch and K sized by M * gate) and without (host branches): the pass is applied to a
graph traced with a size symbol for M, on fake sm_90 tensors, and the shape environment must hold no new guard
that names M's symbol (`lowerings/graph/triton_inline.py: unguarded_gated_sizes`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.source import ConstantSource
from torch._inductor import config as inductor_config
from torch._inductor.decomposition import select_decomp_table
from torch._inductor.fx_passes.post_grad import post_grad_passes
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from qlower.lowerings.devices.cuda import override_cuda_capability
from qlower.lowerings.kernels.cutlass import build as cutlass_build
from qlower.lowerings.kernels.triton import triton_unavailable
from qlower.patterns import mx_format as fmt
from qlower.testing import apply_pass, fake_sm90
from tests.forms.dynamic_int8 import per_token

BF16 = torch.bfloat16
HINT = 16  # M's example value: inside the small-M ranges, so every other range is gated off at the hint


def woq(x, w, s):
    return F.linear(x, w.to(x.dtype)) * s


def dynamic_int8(x, w, s):
    xq, sx = per_token(x)
    return (torch._int_mm(xq, w.t()) * sx * s).to(x.dtype)


def mxfp4(x, q, e):
    return F.linear(x, fmt.dequantize(q, e, "e2m1", x.dtype))


def mxfp8(x, q, e):
    return F.linear(x, fmt.dequantize(q, e, "e4m3", x.dtype))


def _operands(family: str, m, k: int, n: int) -> tuple[torch.Tensor, ...]:
    if family in ("woq_int8", "dynamic_int8"):
        scale_dtype = BF16 if family == "woq_int8" else torch.float32
        w = torch.empty(n, k, dtype=torch.int8, device="cuda")
        return (
            torch.empty(m, k, dtype=BF16, device="cuda"),
            w,
            torch.empty(n, dtype=scale_dtype, device="cuda"),
        )
    cols = k // 2 if family == "mxfp4" else k
    dtype = torch.uint8 if family == "mxfp4" else torch.float8_e4m3fn
    return (
        torch.empty(m, k, dtype=BF16, device="cuda"),
        torch.empty(n, cols, dtype=dtype, device="cuda"),
        torch.empty(n, k // 32, dtype=torch.uint8, device="cuda"),
    )


FAMILIES: dict[str, tuple[Callable, str]] = {
    "woq_int8": (woq, "woq_int8"),
    "dynamic_int8": (dynamic_int8, "dynamic_int8"),
    "mxfp4": (mxfp4, "mx"),
    "mxfp8": (mxfp8, "mx"),
}


def _symbolic_graph(
    family: str, k: int, n: int, hint: int = HINT
) -> tuple[torch.fx.GraphModule, ShapeEnv, object]:
    env = ShapeEnv()
    symbol = env.create_symbol(hint, ConstantSource("m"))
    m = env.create_symintnode(symbol, hint=hint)
    with FakeTensorMode(shape_env=env):
        args = _operands(family, m, k, n)
    fn = FAMILIES[family][0]
    gm = make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(*args)
    return gm, env, symbol


@pytest.fixture
def sm90():
    """Fake sm_90 device facts for the kernels' launch rules (`qlower.testing.fake_sm90`): capability,
    multiprocessors, name; restored after, so no other test sees the fake GPU."""
    with fake_sm90():
        yield


def _check(
    monkeypatch, family: str, k: int, n: int, cutlass: bool, cudagraphs: bool, hint: int = HINT
) -> None:
    library = Path("/nonexistent/libqlower_cutlass_sm90.so") if cutlass else "nvcc not found (test)"
    monkeypatch.setattr(cutlass_build, "library", lambda: library)
    gm, env, symbol = _symbolic_graph(family, k, n, hint)
    before = len(env.guards)
    with override_cuda_capability((9, 0)), inductor_config.patch({"triton.cudagraphs": cudagraphs}):
        report = apply_pass(gm, families=(FAMILIES[family][1],))
    (entry,) = report.entries
    assert entry.lowering is not None, report.table()
    # woq's CUTLASS branch of a symbolic M runs under CUDA graphs (devices/cuda_cutlass.py), MXFP4's in both
    takes_cutlass = cutlass and (family == "mxfp4" or (family == "woq_int8" and cudagraphs))
    assert ("cutlass" in entry.lowering) == takes_cutlass, report.table()
    added = [str(g.expr) for g in env.guards[before:] if symbol in g.expr.free_symbols]
    assert not added, (entry.lowering, added[:5])
    # Inductor's own passes after qlower's re-evaluate the nodes' fake values (a slice's sizes, say): a gated
    # size there must not become a guard either (it did for views narrowed to K * gate: a recompile per range)
    with override_cuda_capability((9, 0)), _fake_mode_of(gm):
        post_grad_passes(gm, is_inference=True)
    added = [str(g.expr) for g in env.guards[before:] if symbol in g.expr.free_symbols]
    assert not added, ("Inductor's post-grad passes", entry.lowering, added[:5])


def _fake_mode_of(gm: torch.fx.GraphModule):
    from torch._guards import detect_fake_mode
    from torch._inductor.virtualized import V

    return V.set_fake_mode(detect_fake_mode([n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]))


needs_triton = pytest.mark.skipif(triton_unavailable() is not None, reason=str(triton_unavailable()))


@needs_triton
@pytest.mark.parametrize("cudagraphs", [True, False], ids=["gated", "host_branch"])
@pytest.mark.parametrize("cutlass", [True, False], ids=["cutlass", "no_cutlass"])
@pytest.mark.parametrize("k,n", [(4096, 14336), (14336, 4096)])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lowering_a_symbolic_m_adds_no_guard_on_m(sm90, monkeypatch, family, k, n, cutlass, cudagraphs):
    if not cutlass and family not in ("woq_int8", "mxfp4"):
        pytest.skip("no CUTLASS lowering for this family: the other parameter covers it")
    _check(monkeypatch, family, k, n, cutlass, cudagraphs)


def fuzz_cases(count: int, seed: int = 0) -> list[tuple[str, int, int, bool, bool, int]]:
    """Random (family, K, N, CUTLASS built, CUDA graphs, M's hint): shapes of 128-multiples from 256 to 16384 on
    either side of N = K (split-K and dense ranges), hints in every range up to past the CUTLASS ranges."""
    rng = random.Random(seed)
    sizes = [256 * i for i in range(1, 65)]
    return [
        (
            rng.choice(sorted(FAMILIES)),
            rng.choice(sizes),
            rng.choice(sizes),
            rng.random() < 0.5,
            rng.random() < 0.5,
            rng.randint(2, 600),
        )
        for _ in range(count)
    ]


@needs_triton
@pytest.mark.parametrize("case", fuzz_cases(16), ids=lambda c: "-".join(map(str, c)))
def test_fuzz_no_guard_on_m(sm90, monkeypatch, case):
    family, k, n, cutlass, cudagraphs, hint = case
    _check(monkeypatch, family, k, n, cutlass, cudagraphs, hint)
