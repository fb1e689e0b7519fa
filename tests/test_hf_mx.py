"""Real model code: HF transformers decoders (Qwen2 with biased projections, Phi-3 with fused ones; random init
from tiny configs) quantized by torchao MXDynamicActivationMXWeightConfig (EMULATED, RCEIL). Stock
torch.compile fails on these (`KeyError: torch.float8_e8m0fnu`); through qlower every linear must be lowered
and the logits must be as close to the unquantized model as eager torchao's are."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_models import tiny_decoder

import qlower

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchao.prototype.mx_formats")


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, elem", [("qwen2", torch.float8_e4m3fn), ("phi3", torch.float4_e2m1fn_x2)], ids=["qwen2-mxfp8", "phi3-mxfp4"]
)
def test_torchao_mx_decoder_every_linear_lowered(arch, elem):
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    model = tiny_decoder(arch, torch.bfloat16)
    float_model = copy.deepcopy(model)
    n_linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    cfg = MXDynamicActivationMXWeightConfig(
        activation_dtype=elem,
        weight_dtype=elem,
        kernel_preference=KernelPreference.EMULATED,
        scaling_mode=ScaleCalculationMode.RCEIL,
    )
    quantize_(model, cfg)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        unquantized = float_model(ids, use_cache=False).logits.float()
        eager = model(ids, use_cache=False).logits.float()
        compiled = torch.compile(model, options=qlower.inductor_options(), fullgraph=True)
        with torch._inductor.config.patch(fx_graph_cache=False):  # a cache hit would skip qlower's report
            out = compiled(ids, use_cache=False).logits.float()
    report = qlower.last_report()
    assert len(report.entries) == n_linears, report.table()
    assert len(report.lowered) == n_linears, report.table()
    assert {d.family for d in report} == {"mx"}, report.table()
    # Dynamic MX amplifies the compile's bf16 rounding differences (an activation one ulp away can round to
    # another fp8 / fp4 code), so the logits are compared through their distance to the unquantized model.
    quant_err = ((eager - unquantized).norm() / unquantized.norm()).item()
    ours_err = ((out - unquantized).norm() / unquantized.norm()).item()
    assert ours_err <= 1.1 * quant_err + 1e-3, (ours_err, quant_err)
