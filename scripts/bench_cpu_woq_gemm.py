"""CPU woq-int8 kernels side by side, eager, one linear: qlower::woq_int8_gemm on each of its paths (direct: its
own micro-kernel; chunked: converted chunks multiplied by ATen's GEMM; panel: vdpbf16ps on converted weight
panels, where the CPU has AVX512-BF16; amx: AMX-BF16 tiles, where the CPU has them), `_weight_int8pack_mm`
(oneDNN, M <= 16), dequantize-then-bf16-GEMM, and bf16 `F.linear` on unquantized weights.

    python scripts/bench_cpu_woq_gemm.py [--threads 2] [--shapes 4096x4096,4096x14336] [--ms 1,4,16,128,1024]
                                         [--paths auto,direct,chunked,panel,amx] [--rounds 3]
    QLOWER_CPU_WOQ_ISA=avx512 python scripts/bench_cpu_woq_gemm.py      # one ISA path of woq_int8_gemm

Each woq_int8_gemm column forces its path with QLOWER_CPU_WOQ_GEMM_PATH (auto, direct, chunked, amx, panel),
which the kernel reads at each call. Minimum over timed calls, each taking the next of 3 weight sets (the weights are not
cache-resident). Each cell is `ms (r×)`, r = F.linear's time / this one's (> 1: faster than the unquantized
linear in x's dtype, `--dtype`). What
`WOQ_GEMM_MAX_M` in lowerings/devices/cpu.py and `kChunkedMinM`, `kPanelMinM`, `kAmxMinM`, `kAmxMaxM` in
lowerings/kernels/csrc/woq_gemm.cpp are set from.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_cpu_woq_gemm", *sys.argv[1:]])

import torch
import torch.nn.functional as F

import qlower

qlower.load_ops()  # registers torch.ops.qlower.*

BF16 = torch.bfloat16
DTYPES = {"bf16": BF16, "fp16": torch.float16, "fp32": torch.float32}
PATH_ENV = "QLOWER_CPU_WOQ_GEMM_PATH"  # lowerings/devices/cpu.py: WOQ_GEMM_PATH_ENV


def best_ms(fn: Callable[[int], object], reps: int) -> float:
    fn(0)
    best = float("inf")
    for i in range(1, reps + 1):
        t = time.perf_counter()
        fn(i)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def woq_gemm_ms(x: torch.Tensor, sets: list, path: str, reps: int) -> float:
    """woq_int8_gemm with its path forced for these calls (the caller's setting restored after)."""
    before = os.environ.get(PATH_ENV)
    os.environ[PATH_ENV] = path
    try:
        return best_ms(lambda i: torch.ops.qlower.woq_int8_gemm(x, *sets[i % 3], None, False, x.dtype), reps)
    finally:
        if before is None:
            del os.environ[PATH_ENV]
        else:
            os.environ[PATH_ENV] = before


def amx_runs() -> bool:
    """Whether the kernel's amx path runs here (it refuses a forced amx path without AMX-BF16 tiles)."""
    try:
        w = (torch.zeros(32, 32, dtype=torch.int8), torch.ones(32, dtype=BF16))
        woq_gemm_ms(torch.zeros(1, 32, dtype=BF16), [w] * 3, "amx", 1)
    except RuntimeError:
        return False
    return True


def measure(x: torch.Tensor, sets: list, dense: list, paths: list[str], rounds: int) -> list[str]:
    """The table cells of one M: each time, and F.linear's time (x's dtype, unquantized) over it; each the
    minimum over `rounds` interleaved rounds (a shared machine's noise hits every column alike)."""
    m = x.shape[0]
    reps = 20 if m <= 16 else 5 if m <= 128 else 2
    best: list[float | None] = [float("inf")] * (len(paths) + 3)
    for _ in range(rounds):
        times: list[float | None] = [best_ms(lambda i: F.linear(x, dense[i % 3]), reps)]
        times += [woq_gemm_ms(x, sets, path, reps) for path in paths]
        times.append(best_ms(lambda i: torch._weight_int8pack_mm(x, *sets[i % 3]), reps) if m <= 16 else None)
        times.append(best_ms(lambda i: F.linear(x, sets[i % 3][0].to(x.dtype)) * sets[i % 3][1], reps))
        best = [None if t is None else min(b, t) for b, t in zip(best, times, strict=True)]
    bf, *rest = best
    cells = ["—" if t is None else f"{t:.3f} ms ({bf / t:.2f}×)" for t in rest]
    return cells + [f"{bf:.3f} ms"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--shapes", default="4096x4096,4096x14336")
    p.add_argument("--ms", default="1,4,16,128,1024")
    p.add_argument("--paths", default="auto,direct,chunked,amx", help="woq_int8_gemm paths, one column each")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per row (the minimum is kept)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="activations, scale and output")
    args = p.parse_args(argv)
    dtype = DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = args.paths.split(",")
    if "amx" in paths and not amx_runs():
        paths.remove("amx")
    isa = os.environ.get("QLOWER_CPU_WOQ_ISA", "best")
    print(
        f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}"
    )
    heads = [f"woq_int8_gemm {path} ({isa})" for path in paths]
    heads += ["_weight_int8pack_mm", "dequant + GEMM", f"{args.dtype} F.linear"]
    print("| M | K→N | " + " | ".join(heads) + " |")
    print("|---|---|" + "---|" * len(heads))
    for kn in args.shapes.split(","):
        k, n = (int(v) for v in kn.split("x"))
        sets = [
            (torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n, dtype=dtype) / 127)
            for _ in range(3)
        ]
        dense = [torch.randn(n, k, dtype=dtype) / k**0.5 for _ in range(3)]
        for m in (int(v) for v in args.ms.split(",")):
            cells = measure(torch.randn(m, k, dtype=dtype), sets, dense, paths, args.rounds)
            print(f"| {m} | {k}→{n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
