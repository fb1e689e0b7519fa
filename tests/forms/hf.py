"""Tiny HF transformers decoders (random init from configs, no downloads) shared by the real-model tests.

Three architectures with different linear layouts: Llama (no biases), Qwen2 (biased q/k/v projections) and
Phi-3 (fused qkv and gate_up projections, so N differs from the hidden size).
"""

from __future__ import annotations

from typing import Any

import torch

ARCHS = ("llama", "qwen2", "phi3")


def tiny_decoder(arch: str, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    common = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    if arch == "llama":
        config, cls = transformers.LlamaConfig(num_key_value_heads=2, **common), transformers.LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = transformers.Qwen2Config(num_key_value_heads=2, **common), transformers.Qwen2ForCausalLM
    elif arch == "phi3":
        config = transformers.Phi3Config(num_key_value_heads=4, pad_token_id=0, **common)
        cls = transformers.Phi3ForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(0)
    return cls(config).to(dtype).eval()


def compile_and_compare(
    model: torch.nn.Module, float_model: torch.nn.Module, ids: torch.Tensor
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the quantized model eagerly and compiled with qlower: (qlower's report, unquantized, eager and
    compiled logits in fp32)."""
    import qlower

    with torch.no_grad():
        unquantized = float_model(ids, use_cache=False).logits.float()
        eager = model(ids, use_cache=False).logits.float()
        compiled = torch.compile(model, options=qlower.inductor_options(), fullgraph=True)
        with torch._inductor.config.patch(fx_graph_cache=False):  # a cache hit would skip qlower's report
            out = compiled(ids, use_cache=False).logits.float()
    return qlower.last_report(), unquantized, eager, out


def assert_every_linear_lowered(report: Any, n_linears: int, family: str) -> None:
    assert len(report.entries) == n_linears, report.table()
    assert len(report.lowered) == n_linears, report.table()
    assert {d.family for d in report} == {family}, report.table()


def assert_no_further_from_float(unquantized: torch.Tensor, eager: torch.Tensor, out: torch.Tensor) -> None:
    """qlower's logits are no further from the unquantized model's than eager torchao's are."""
    quant_err = ((eager - unquantized).norm() / unquantized.norm()).item()
    ours_err = ((out - unquantized).norm() / unquantized.norm()).item()
    assert ours_err <= 1.1 * quant_err + 1e-3, (ours_err, quant_err)
