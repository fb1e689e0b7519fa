"""Benchmarks, tuners and the correctness fuzz of qlower: not part of the installed package.

Every module at this level is an entry point, run from the repository root as a module of this package,
`python -m scripts.<name> [args]`: the root is then on the import path, so `scripts.*` and the model forms of
`tests.forms` import by their names. `python scripts/<name>.py [args]` (from the root) works too: a file run
puts only scripts/ on the import path, so an entry point run that way first runs itself again as
`python -m scripts.<name>`. What the entry points share lives in the packages below them:
- `common/`: the GPU time of a call (cuda_timing), a run's metadata and output folder, its progress line
- `bench_families/`: the per-family cases bench.py loads by `--family` (woq_int8, dynamic_int8, mx)
- `decoder/`: the Llama-style decoder bench_model.py times and bench_train.py trains, its variants, its tables
- `fuzz/`: the parts of fuzz_compile.py (cases, draws, models, steps, checks, the defect classes)
"""
