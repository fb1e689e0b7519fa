"""The Llama-style decoder of the whole-model benchmarks: bench_model.py times its steps, bench_train.py
trains it. `model` (the bf16 decoder and its blocks), `variants` (its quantizations and tensor-parallel
shards), `tables` (a run's rows and the .md / .json / .png written from them).
"""
