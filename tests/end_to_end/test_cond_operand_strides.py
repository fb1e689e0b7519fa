"""A `torch.cond` operand computed in the graph reaches its branches with the strides its fake tensor has.

Inductor lowers each branch with the operands' fake tensors as example inputs, and the branch function asserts
its inputs' strides, but its cond lowering realizes a computed operand with whatever layout it decides: a
`permute(...).contiguous()` (MXFP4's CUTLASS block scales, passed to a symbolic M's host branches) reached the
branch as the permuted view ("expected size 4==4, stride 4==1024", on an H100 and with stock ops on CPU).
qlower's pass requires each operand's exact fake strides first (`lowerings/graph/inductor_fixes.py:
fix_cond_operand_strides`), in every graph compiled with its options. A fuzz generator draws the operand's
computation (a clone of a permuted view, a pointwise op after one, a dtype view), its dtype, its permutation
and the batch sizes on both sides of the predicate; every case runs against eager.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

import qlower

# How the cond operand is computed from `src` [n, c] (c a multiple of 4) and a permutation of its [n, c/4, 4] view.
FORMS: dict[str, Callable[[torch.Tensor, list[int]], torch.Tensor]] = {
    "clone_of_permute": lambda src, p: src.reshape(src.shape[0], -1, 4).permute(p).contiguous(),
    "pointwise_after_clone": lambda src, p: src.reshape(src.shape[0], -1, 4).permute(p).contiguous() * 2,
    "bits_as_bf16": lambda src, p: (
        (src.to(torch.int32) << 7)
        .to(torch.int16)
        .view(torch.bfloat16)
        .reshape(src.shape[0], -1, 4)
        .permute(p)
    ).contiguous(),
    "transpose_2d": lambda src, p: src.t().contiguous(),
}
PERMUTATIONS = ([1, 0, 2], [2, 1, 0], [0, 2, 1], [1, 2, 0])
SOURCES = {
    "uint8": lambda g, n, c: torch.randint(100, 140, (n, c), dtype=torch.uint8, generator=g),
    "float32": lambda g, n, c: torch.randn(n, c, generator=g),
    "bfloat16": lambda g, n, c: torch.randn(n, c, generator=g).to(torch.bfloat16),
}


def _model(form: str, perm: list[int]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def branch_small(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x * b.float().flatten()[: x.shape[1]]

    def branch_large(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return x - b.float().flatten()[-x.shape[1] :]

    def f(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        operand = FORMS[form](src, perm)
        return torch.cond(x.shape[0] <= 16, branch_small, branch_large, (x, operand))

    return f


def fuzz_cases(count: int, seed: int = 0) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """Random (form, source dtype, permutation, n, c): n and c/4 off powers of two (c/4 >= 2)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        form = rng.choice(sorted(FORMS))
        dtype = "uint8" if form == "bits_as_bf16" else rng.choice(sorted(SOURCES))
        cases.append(
            (form, dtype, tuple(rng.choice(PERMUTATIONS)), rng.randint(3, 70), 4 * rng.randint(2, 20))
        )
    return cases


CASES = [("clone_of_permute", "uint8", (1, 0, 2), 256, 16), ("bits_as_bf16", "uint8", (1, 0, 2), 48, 64)]


@pytest.mark.parametrize(
    "case", CASES + fuzz_cases(6), ids=lambda c: "-".join(str(v).replace(" ", "") for v in c)
)
def test_cond_operand_keeps_its_fake_strides(case):
    form, dtype, perm, n, c = case
    g = torch.Generator().manual_seed(n * 1000 + c)
    src = SOURCES[dtype](g, n, c)
    f = _model(form, list(perm))
    torch._dynamo.reset()
    compiled = torch.compile(f, dynamic=True, options=qlower.inductor_options())
    for m in (3, 20, 5):  # both branches, then the first again (one symbolic-batch graph)
        x = torch.randn(m, 8, generator=g)
        got, want = compiled(x, src), f(x, src)
        assert torch.equal(got, want), (m, (got - want).abs().max())
