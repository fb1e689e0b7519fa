"""Real model code: HF transformers decoders (Llama, Qwen2, Phi-3; random init from tiny configs) quantized by torchao
Int8DynamicActivationInt8WeightConfig. Every linear must be lowered to an int8 matmul and the logits must stay
as close to the unquantized model as eager torchao's are."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_models import ARCHS, tiny_decoder

import qlower

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
    with torch.no_grad():
        unquantized = float_model(ids, use_cache=False).logits.float()
        eager = model(ids, use_cache=False).logits.float()
        compiled = torch.compile(model, options=qlower.inductor_options(), fullgraph=True)
        with torch._inductor.config.patch(fx_graph_cache=False):  # a cache hit would skip qlower's report
            out = compiled(ids, use_cache=False).logits.float()
    report = qlower.last_report()
    assert len(report.entries) == n_linears, report.table()
    assert len(report.lowered) == n_linears, report.table()
    assert {d.family for d in report} == {"dynamic_int8"}, report.table()
    # hidden sizes 64 and 160: K < 4096, so s8s8 `_int_mm` on every CPU
    assert {d.lowering for d in report} == {"aten._int_mm"}, report.table()
    # close to eager torchao (bf16 rounding through 2 layers), and no further from the unquantized model
    rel = ((out - eager).norm() / eager.norm()).item()
    assert rel < 0.02, rel
    quant_err = ((eager - unquantized).norm() / unquantized.norm()).item()
    ours_err = ((out - unquantized).norm() / unquantized.norm()).item()
    assert ours_err <= 1.1 * quant_err + 1e-3, (ours_err, quant_err)
