"""`qlower.inductor_options(mode=...)`: torch.compile refuses `mode=` next to `options=`, so the mode's Inductor
settings are merged into qlower's dict; on CUDA, reduce-overhead (cudagraph trees) with qlower's kernels runs
through batch changes without skipping a graph."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

import qlower
from tests.forms.woq_int8 import WoqLinear


def test_mode_settings_are_merged_and_explicit_keywords_win():
    assert qlower.inductor_options(mode="reduce-overhead")["triton.cudagraphs"] is True
    opts = qlower.inductor_options(mode="max-autotune", **{"triton.cudagraphs": False})
    assert opts["max_autotune"] is True and opts["triton.cudagraphs"] is False
    assert "triton.cudagraphs" not in qlower.inductor_options(mode="default")
    assert qlower.inductor_options(mode="reduce-overhead") == qlower.inductor_options(mode="reduce-overhead")


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="reduce-overhead"):
        qlower.inductor_options(mode="reduce_overhead")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8"])
def test_reduce_overhead_through_batch_changes(family):
    from tests.forms.dynamic_int8 import IntMMDivide

    torch._dynamo.reset()
    counters.clear()
    qlower.clear_reports()
    # eager reference on the CPU copy: cuBLAS _int_mm refuses M <= 16 in eager
    cpu_model = WoqLinear(512, 1024, torch.bfloat16) if family == "woq_int8" else IntMMDivide(512, 1024)
    model = copy.deepcopy(cpu_model).cuda()
    compiled = torch.compile(model, options=qlower.inductor_options(mode="reduce-overhead"))
    with torch.no_grad():
        for m in (1, 16, 4, 1, 16):
            x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
            for _ in range(3):  # record, then replay
                out = compiled(x).float()
            ref = cpu_model(x.cpu()).float().cuda()
            assert ((out - ref).norm() / ref.norm()).item() < 2e-2, (family, m)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    reports = qlower.all_reports()[-2:]  # none: the pass never ran, a failure
    assert reports and all(r.pass_ran and r.lowered for r in reports), [r.table() for r in reports]
