"""Real model code: HF transformers decoders (Llama, Qwen2, Phi-3; random init from tiny configs) quantized by torchao
Int8DynamicActivationInt8WeightConfig. Every linear must be lowered to an int8 matmul and the logits must stay
as close to the unquantized model as eager torchao's are."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.forms.hf import (
    ARCHS,
    assert_every_linear_lowered,
    assert_no_further_from_float,
    compile_and_compare,
    tiny_decoder,
)

transformers = pytest.importorskip("transformers")
torchao_quant = pytest.importorskip("torchao.quantization")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_torchao_int8_dynamic_every_linear_lowered(arch):
    model = tiny_decoder(arch, torch.bfloat16)
    float_model = copy.deepcopy(model)
    n_linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    torchao_quant.quantize_(model, torchao_quant.Int8DynamicActivationInt8WeightConfig())
    ids = torch.randint(0, 256, (2, 8))
    report, unquantized, eager, out = compile_and_compare(model, float_model, ids)
    assert_every_linear_lowered(report, n_linears, "dynamic_int8")
    # hidden sizes 64 and 160: K < 4096, so s8s8 `_int_mm` on every CPU
    assert {d.lowering for d in report} == {"aten._int_mm"}, report.table()
    # close to eager torchao (bf16 rounding through 2 layers), and no further from the unquantized model
    rel = ((out - eager).norm() / eager.norm()).item()
    assert rel < 0.02, rel
    assert_no_further_from_float(unquantized, eager, out)
