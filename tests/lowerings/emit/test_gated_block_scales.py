"""The CUTLASS MXFP4 GEMM's block scales built for a symbolic M (`emit.mx.block_scale_bits` with
`emit.common.m_range_gate_node`): inside the GEMM's M range they are the ungated scales bit for bit; outside it
they have no rows, so the kernel that builds them launches nothing at an M the GEMM does not run (the Triton
kernels' M under CUDA graphs). The graph is run as Python on CPU at M on both sides of each range end."""

from __future__ import annotations

import random

import pytest
import torch

from qlower.lowerings.emit.common import m_range_gate_node
from qlower.lowerings.emit.mx import block_scale_bits
from qlower.lowerings.graph.builder import Emitter
from qlower.patterns import FAMILIES
from qlower.patterns.record import QuantLinear
from tests.forms.mx import MXLinear, trace

BF16 = torch.bfloat16


def _gated_and_full(n: int, k: int, lo: int, hi: int | None, e8m0: bool = False):
    """A dynamic-M MXFP4 linear's graph whose outputs are its block scales gated to [lo, hi] and ungated."""
    model = MXLinear(None, "e2m1", n, k, e8m0=e8m0).eval()
    gm = trace(model, torch.randn(3, k, dtype=BF16), dynamic=True)
    (rec,) = [c for c in FAMILIES["mx"](gm.graph) if isinstance(c, QuantLinear)]
    assert not isinstance(rec.m, int), "M must be symbolic for this test"
    out = next(n for n in gm.graph.nodes if n.op == "output")
    em = Emitter(gm.graph, rec.output)
    gated = block_scale_bits(em, rec, m_range_gate_node(em, rec, lo, hi))
    full = block_scale_bits(em, rec)
    out.args = ((gated, full),)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm, model


def _check(gm, model: MXLinear, k: int, lo: int, hi: int | None, m: int) -> None:
    """Run the graph at M = m: its inputs are M itself, x and the model's weight and codes (told apart by shape)."""
    x = torch.randn(m, k, dtype=BF16)
    by_shape = {tuple(t.shape): t for t in (model.q, model.e)}
    args = []
    for p in (p for p in gm.graph.nodes if p.op == "placeholder"):
        v = p.meta["val"]
        args.append(m if isinstance(v, torch.SymInt) else x if v.shape[-1] == k else by_shape[tuple(v.shape)])
    gated, full = gm(*args)
    inside = lo <= m and (hi is None or m <= hi)
    assert tuple(full.shape) == (k // 128, full.shape[1], 4)
    if inside:
        assert gated.shape == full.shape and torch.equal(gated.view(torch.int16), full.view(torch.int16))
    else:
        assert gated.shape[0] == 0, (m, lo, hi)


@pytest.mark.parametrize("lo, hi", [(33, 256), (33, None), (129, 4096)])
def test_gated_scales_exist_only_inside_the_range(lo: int, hi: int | None) -> None:
    n, k = 16, 512
    gm, model = _gated_and_full(n, k, lo, hi)
    for m in (1, 2, lo - 1, lo, lo + 1, *((hi - 1, hi, hi + 1) if hi else (4 * lo,))):
        _check(gm, model, k, lo, hi, m)


@pytest.mark.parametrize("seed", range(8))
def test_fuzz_gated_scales(seed: int) -> None:
    """Random shapes (N a multiple of 8, K of 128), e8m0-typed or uint8 codes, ranges and Ms around their ends."""
    rng = random.Random(seed)
    n, k = 8 * rng.randint(1, 6), 128 * rng.randint(1, 5)
    lo = rng.randint(2, 200)
    hi = None if rng.random() < 0.3 else lo + rng.randint(0, 300)
    gm, model = _gated_and_full(n, k, lo, hi, e8m0=rng.random() < 0.5)
    edges = [lo - 1, lo, hi if hi else lo + 7, (hi or lo) + 1, 1, rng.randint(1, 600)]
    for m in edges:
        if m >= 1:
            _check(gm, model, k, lo, hi, m)
