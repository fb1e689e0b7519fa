"""torchao `Int8WeightOnlyConfig` on CUDA through torch.compile: M = 1 gets the Triton decode kernel as M = 2 does.

At M = 1 Inductor hands qlower the decomposed matrix-vector form (torchao turns `coordinate_descent_tuning`
on); its record said fp32 and it was lowered to `dequant_mm` (CPU proof without a GPU:
tests/patterns/test_woq_patterns.py::test_decomposed_matvec_picks_the_cuda_decode_kernel).
"""

from __future__ import annotations

import pytest
import torch

import qlower
from tests.forms.woq_int8 import assert_close_to_reference

pytestmark = pytest.mark.gpu
ao = pytest.importorskip("torchao.quantization")


@pytest.mark.parametrize("m", [1, 2, 17])
def test_torchao_woq_int8_decode_kernel(m: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096, bias=False)).to("cuda", torch.bfloat16)
    ao.quantize_(model, ao.Int8WeightOnlyConfig())
    w = model[0].weight
    ref_w = w.qdata.double() * w.scale.double().reshape(-1, 1)
    x = torch.randn(1, m, 4096, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        out = torch.compile(model, options=qlower.inductor_options())(x)
        eager = model(x)
    (d,) = qlower.last_report().entries
    assert d.lowering == "triton.woq_int8_linear" and d.dtype == "torch.bfloat16", (
        qlower.last_report().table()
    )
    assert_close_to_reference(out, eager, x.double() @ ref_w.t())
