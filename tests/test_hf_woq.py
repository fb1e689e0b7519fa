"""Real model code: an HF transformers Llama decoder (random init from a tiny config) quantized by torchao
Int8WeightOnlyConfig. Every linear must be lowered and the logits must stay close to eager."""

from __future__ import annotations

import pytest
import torch

import qlower

transformers = pytest.importorskip("transformers")
torchao_quant = pytest.importorskip("torchao.quantization")


def tiny_llama(dtype: torch.dtype) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


@pytest.mark.slow
def test_torchao_int8_weight_only_llama_every_linear_lowered():
    model = tiny_llama(torch.bfloat16)
    n_linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    torchao_quant.quantize_(model, torchao_quant.Int8WeightOnlyConfig())
    ids = torch.randint(0, 256, (2, 8))
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
