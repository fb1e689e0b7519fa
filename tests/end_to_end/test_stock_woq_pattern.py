"""A woq subgraph qlower leaves to stock Inductor must not crash the process.

Stock Inductor's own post-grad pattern turns `F.linear(x, w.to(bf16)) * s` into `aten._weight_int8pack_mm`,
whose CPU kernel crashes (SIGSEGV) on bf16 activations with K % 16 != 0 (torch 2.13; the CPU fuzz's seed
1579268955 took its process down that way). qlower's rule never emits it there; for the subgraphs it leaves to
stock (here: woq_int8 not among the compile's families) its graph fix runs that call as the formula
(`lowerings/graph/inductor_fixes.py: fix_int8pack_lowering`). Each compile runs in a subprocess, so a crash
fails the test instead of ending the suite.
"""

from __future__ import annotations

import random

import pytest

from tests.helpers import run_python

SCRIPT = """
import torch, qlower
from torch._inductor.utils import run_and_get_code
torch.manual_seed(0)
K, N = {k}, 110
w = torch.randint(-128, 128, (N, K), dtype=torch.int8)
s = torch.rand(N, dtype=torch.bfloat16) / 64
def f(x):
    return torch.nn.functional.linear(x, w.to(x.dtype)) * s
x = torch.randn(2, 9, K, dtype=torch.bfloat16)
opts = qlower.inductor_options(families=["dynamic_int8"])
with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
    out, codes = run_and_get_code(torch.compile(f, options=opts), x)
ref = (x.double() @ w.double().t()).to(torch.bfloat16).double() * s.double()
err = ((out.double() - ref).norm() / ref.norm()).item()
print("int8pack" if any("_weight_int8pack_mm" in c for c in codes) else "formula", err)
"""


def fuzz_ks(count: int, seed: int = 0) -> list[tuple[int, str]]:
    """Random K from 1 to 300 with the path each must take: the formula off multiples of 16, else int8pack."""
    rng = random.Random(seed)
    ks = [rng.randint(1, 300) for _ in range(count)]
    return [(k, "int8pack" if k % 16 == 0 else "formula") for k in ks]


@pytest.mark.parametrize(
    "k, want", [(8, "formula"), (33, "formula"), (100, "formula"), (48, "int8pack"), *fuzz_ks(2)]
)
def test_stock_woq_pattern_on_cpu_bf16_runs_without_a_crash(k, want):
    path, err = run_python(SCRIPT.format(k=k)).split()[-2:]
    assert path == want
    assert float(err) < 1e-2
