"""woq-int8 on a CUDA GPU through torch.compile: the chosen lowering, the numbers, and the decode form that
Inductor's matvec decomposition produces once coordinate descent tuning is on (torchao turns it on)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import qlower
from tests.forms.woq_int8 import WoqLinear, assert_close_to_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("coordinate_descent", [False, True])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_woq_int8_cuda(m: int, coordinate_descent: bool) -> None:
    model = WoqLinear(4096, 1024, torch.bfloat16, bias=True).cuda()
    x = torch.randn(1, m, 4096, dtype=torch.bfloat16, device="cuda")
    with torch._inductor.config.patch(coordinate_descent_tuning=coordinate_descent), torch.no_grad():
        out, code = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
        eager = model(x)
    (d,) = qlower.last_report().entries
    assert d.lowered and d.lowering != "aten._weight_int8pack_mm", qlower.last_report().table()
    assert "_weight_int8pack_mm" not in "\n".join(code)
    ref = copy.deepcopy(model).cpu().reference(x.cpu()).cuda()
    assert_close_to_reference(out, eager, ref)
