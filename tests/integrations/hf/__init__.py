"""HF transformers decoders quantized by torchao, compiled with qlower (logits, `generate`)."""
