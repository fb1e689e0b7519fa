"""Blocks compiled one by one (torchtitan's `block.compile(...)` loop) with equal `qlower.inductor_options()`:
one Dynamo graph serves every block, every block's linears are lowered, and no block falls back to eager.

Dynamo compares backends by their options (`BACKEND_MATCH`); passes of equal configuration compare equal
(`QLowerPass.__eq__`), so a fresh options dict per block is the same backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import qlower

DIM, HIDDEN, BLOCKS = 64, 96, 32


class WoqLinear(torch.nn.Module):
    def __init__(self, k: int, n: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("w", torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g))
        scale = (torch.rand(n, generator=g) + 0.5) / (127 * k**0.5)  # keeps 32 residual blocks O(1)
        self.register_buffer("s", scale.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype)) * self.s


class Block(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.up, self.down = WoqLinear(DIM, HIDDEN, seed), WoqLinear(HIDDEN, DIM, seed + 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(x)))


def test_equal_options_are_one_backend():
    assert qlower.inductor_options() == qlower.inductor_options()
    assert qlower.inductor_options(kernel_preference="emulated") != qlower.inductor_options()
    assert qlower.inductor_options(families=["mx"]) != qlower.inductor_options()


def test_per_block_compile_of_32_blocks_is_one_graph_and_every_block_lowered():
    torch._dynamo.reset()
    counters.clear()
    qlower.clear_reports()
    blocks = [Block(2 * i) for i in range(BLOCKS)]
    eager_x = x = torch.randn(2, 5, DIM, dtype=torch.bfloat16)
    for block in blocks:
        block.compile(options=qlower.inductor_options())  # a fresh dict per block, as users write it
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        for block in blocks:
            x = block(x)
            eager_x = block._orig_mod(eager_x) if hasattr(block, "_orig_mod") else block.forward(eager_x)
    entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(Block.forward.__code__)
    assert len(entries) == 1, len(entries)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"] and not counters["unimplemented"], dict(counters)
    reports = [r for r in qlower.all_reports() if r.pass_ran]
    assert len(reports) == 1 and len(reports[0].lowered) == 2 == len(reports[0]), reports
    rel = ((x.float() - eager_x.float()).norm() / eager_x.float().norm()).item()
    assert rel < 2e-2, rel
