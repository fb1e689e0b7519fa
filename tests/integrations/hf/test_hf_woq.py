"""Real model code: HF transformers decoders (Llama, Qwen2, Phi-3; random init from tiny configs) quantized by torchao
Int8WeightOnlyConfig. Every linear must be lowered and the logits must stay close to eager."""

from __future__ import annotations

import pytest
import torch

import qlower
from tests.forms.hf import ARCHS, tiny_decoder

transformers = pytest.importorskip("transformers")
torchao_quant = pytest.importorskip("torchao.quantization")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_torchao_int8_weight_only_every_linear_lowered(arch):
    model = tiny_decoder(arch, torch.bfloat16)
    n_linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    torchao_quant.quantize_(model, torchao_quant.Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (1, 8))  # M = 8 tokens: the packed kernel's range (PACKED_MAX_M)
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
        compiled = torch.compile(model, options=qlower.inductor_options(), fullgraph=True)
        out = compiled(ids, use_cache=False).logits
    report = qlower.last_report()
    assert len(report.entries) == n_linears, report.table()
    assert len(report.lowered) == n_linears, report.table()
    assert {d.lowering for d in report} == {"aten._weight_int8pack_mm"}, report.table()
    # bf16 end to end through 2 layers: compare in relative terms of the logits' scale.
    err = (out.float() - eager.float()).abs().max().item()
    assert err <= 0.05 * eager.float().abs().max().item(), err
    rel = (out.float() - eager.float()).norm() / eager.float().norm()
    assert rel < 0.02, rel
