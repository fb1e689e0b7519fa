"""Quantized linears in the graph forms users write, with their float64 references: the one home of the
model forms the tests and scripts/ (the fuzz, the benchmarks) share. `woq_int8`, `dynamic_int8`, `mx` (one
module per family), `hf` (tiny transformers decoders), `tp` (a block sharded for tensor parallel, and its rank
worker)."""
