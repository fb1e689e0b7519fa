"""Real model code: HF transformers decoders (Qwen2 with biased projections, Phi-3 with fused ones; random init
from tiny configs) quantized by torchao MXDynamicActivationMXWeightConfig (EMULATED, RCEIL). Stock
torch.compile fails on these (`KeyError: torch.float8_e8m0fnu`); through qlower every linear must be lowered
and the logits must be as close to the unquantized model as eager torchao's are."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.forms.hf import (
    assert_every_linear_lowered,
    assert_no_further_from_float,
    compile_and_compare,
    tiny_decoder,
)

transformers = pytest.importorskip("transformers")
pytest.importorskip("torchao.prototype.mx_formats")


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, elem",
    [("qwen2", torch.float8_e4m3fn), ("phi3", torch.float4_e2m1fn_x2)],
    ids=["qwen2-mxfp8", "phi3-mxfp4"],
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
    report, unquantized, eager, out = compile_and_compare(model, float_model, ids)
    assert_every_linear_lowered(report, n_linears, "mx")
    # Dynamic MX amplifies the compile's bf16 rounding differences (an activation one ulp away can round to
    # another fp8 / fp4 code), so the logits are compared through their distance to the unquantized model.
    assert_no_further_from_float(unquantized, eager, out)
