"""torchao's quantized linears through qlower (compile and export)."""
