"""Tiny HF transformers decoders (random init from configs, no downloads) shared by the real-model tests.

Three architectures with different linear layouts: Llama (no biases), Qwen2 (biased q/k/v projections) and
Phi-3 (fused qkv and gate_up projections, so N differs from the hidden size).
"""

from __future__ import annotations

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
