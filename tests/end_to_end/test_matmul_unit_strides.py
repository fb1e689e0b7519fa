"""No matmul in a graph compiled with qlower gets an operand view whose size-1 dim has a short stride.

Inductor views a [1, 1, K] buffer as [1, K] with strides (0, 1) (a size-1 dim's stride is free). The memory it
names is right, but BLAS libraries take that stride as the leading dimension: `_int_mm` read garbage from it on
AVX512 CPUs (tests/integrations/torchao/test_torchao_dynamic_int8.py), and the CPU fuzz found the same views in
MX graphs' float `mm` (`scripts/fuzz/run.py: short_leading_dims`). qlower's pass re-views the matrices of every
2-D matmul lowering (`lowerings/graph/inductor_fixes.py: MATMUL_OPERANDS`), in the graphs it lowers and the
ones it leaves alone. A fuzz generator draws matmul spellings, dtypes, leading dims and vector shapes; every
case checks the generated code and the numbers against float64.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code

import qlower
from qlower.patterns import mx_format as fmt
from scripts.fuzz.run import short_leading_dims

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}

# Matmul spellings on x of shape [1, ..., 1, K] (or [1, K]), w [N, K], b [N]; each in the dtype it is given.
SPELLINGS: dict[str, Callable[..., torch.Tensor]] = {
    "mm": lambda x, w, b: torch.mm(x.reshape(1, -1), w.t()),
    "addmm": lambda x, w, b: torch.addmm(b, x.reshape(1, -1), w.t()),
    "mm_of_cast": lambda x, w, b: torch.mm(x.float().reshape(1, -1), w.float().t()).to(x.dtype),
    "linear": lambda x, w, b: F.linear(x, w, b),
    "matmul": lambda x, w, b: torch.matmul(x, w.t()),
    "vector_weight": lambda x, w, b: torch.mm(x.reshape(1, -1), w[:1].t()),  # an N = 1 operand [K, 1]
}


def fuzz_cases(count: int, seed: int = 0) -> list[tuple[str, torch.dtype, int, int, int]]:
    """Random (spelling, dtype, leading dims of x, K, N): leading dims 1-3 (all 1), K and N off powers of two."""
    rng = random.Random(seed)
    return [
        (
            rng.choice(sorted(SPELLINGS)),
            rng.choice([torch.float32, torch.float16, torch.bfloat16]),
            rng.randint(1, 3),
            rng.randint(2, 300),
            rng.randint(1, 300),
        )
        for _ in range(count)
    ]


def _compiled_code(fn: Callable, *args: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        return run_and_get_code(torch.compile(fn, options=qlower.inductor_options()), *args)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize(
    "case", fuzz_cases(10), ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-lead{c[2]}-k{c[3]}-n{c[4]}"
)
def test_fuzz_matmul_operands_have_dense_leading_dims(case):
    spelling, dtype, lead, k, n = case
    torch.manual_seed(k * 1000 + n)
    # x is computed in the graph (a pointwise buffer), as a cast or a scaling is in a quantized graph
    x0, w, b = (
        torch.randn(*[1] * lead, k, dtype=dtype),
        torch.randn(n, k, dtype=dtype),
        torch.randn(n, dtype=dtype),
    )
    fn = SPELLINGS[spelling]

    def model(x, w, b):
        return fn(x * 2, w, b)

    out, codes = _compiled_code(model, x0, w, b)
    assert not short_leading_dims(codes), short_leading_dims(codes)
    ref = fn(x0.double() * 2, w.double(), b.double())
    assert _rel(out, ref.reshape(out.shape)) < TOL[dtype]


def test_mx_dequant_mm_at_one_token_has_dense_leading_dims():
    """The fuzz's MX form that found it (seeds 695697490, 2074773773): fp16 x [1, 1, K], an e4m3 weight decoded
    to fp32 and multiplied in fp32, lowered to qlower's `mx_dequant_mm`."""
    torch.manual_seed(0)
    k, n = 96, 443
    q = (torch.randn(n, k) * 4).to(torch.float8_e4m3fn)
    e = torch.randint(120, 134, (n, k // 32), dtype=torch.uint8)

    def model(x, q, e):
        return (x.float() @ fmt.dequantize(q, e, "e4m3", torch.float32).t()).to(x.dtype)

    x = torch.randn(1, 1, k, dtype=torch.float16)
    qlower.clear_reports()
    out, codes = _compiled_code(model, x, q, e)
    (row,) = [r for rep in qlower.all_reports() for r in rep.entries]
    assert row.lowering == "mx_dequant_mm", row
    assert not short_leading_dims(codes), short_leading_dims(codes)
    ref = x.double() @ fmt.dequantize(q, e, "e4m3", torch.float64).t()
    assert _rel(out, ref) < TOL[torch.float16]
