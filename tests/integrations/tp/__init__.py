"""Tensor parallel: sharded quantized linears lowered on every rank."""
