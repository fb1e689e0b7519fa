"""A tiny HF transformers Llama (random init from a config, no downloads) shared by the real-model tests."""

from __future__ import annotations

import torch


def tiny_llama(dtype: torch.dtype) -> torch.nn.Module:
    import transformers

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
