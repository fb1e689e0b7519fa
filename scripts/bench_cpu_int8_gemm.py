"""CPU int8 x int8 -> int32 GEMMs side by side, eager, one call: qlower::int8_gemm (its own kernels: max_m set
above every M measured), s8s8 `_int_mm` (oneDNN; what torchao and qlower's `aten._int_mm` lowering call), u8s8
`_int_mm` where this torch takes a uint8 activation, and bf16 `F.linear` on a float weight of the same shape.

    python scripts/bench_cpu_int8_gemm.py [--threads 2] [--shapes 512x512,4096x4096] [--ms 1,2,4,8,16]
                                          [--rounds 5]
    QLOWER_CPU_INT8_GEMM_ISA=avx2 python scripts/bench_cpu_int8_gemm.py    # one ISA level of int8_gemm

Minimum over timed calls, each taking the next of 3 weight sets, in `--rounds` interleaved rounds. Each cell is
`us (r×)`, r = s8s8 `_int_mm`'s time / this one's (> 1: faster than `_int_mm`). What INT8_GEMM_MAX_M in
lowerings/devices/cpu.py is set from.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_cpu_int8_gemm", *sys.argv[1:]])

import torch
import torch.nn.functional as F

import qlower

qlower.load_ops()  # registers torch.ops.qlower.*; the first int8_gemm call loads torch.ops.qlower_native

EVERY_M = 1 << 30  # int8_gemm's max_m: its own kernels at every M measured


def int_mm_takes_uint8() -> bool:
    try:
        torch._int_mm(torch.zeros(1, 8, dtype=torch.uint8), torch.zeros(8, 8, dtype=torch.int8))
    except RuntimeError:
        return False
    return True


def best_us(fn: Callable[[int], object], reps: int) -> float:
    fn(0)
    best = float("inf")
    for i in range(1, reps + 1):
        t = time.perf_counter()
        fn(i)
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def measure(m: int, k: int, n: int, rounds: int) -> list[str]:
    """The cells of one (M, K, N): int8_gemm, s8s8 `_int_mm`, u8s8 `_int_mm`, bf16 F.linear."""
    w = [torch.randint(-128, 128, (n, k), dtype=torch.int8) for _ in range(3)]
    dense = [torch.randn(n, k, dtype=torch.bfloat16) for _ in range(3)]
    x = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    xu = x.view(torch.uint8) ^ 128
    xb = torch.randn(m, k, dtype=torch.bfloat16)
    reps = max(5, min(200, int(2e8 / (m * k * n + 1e6))))
    runs: list[Callable[[int], object] | None] = [
        lambda i: torch.ops.qlower.int8_gemm(x, w[i % 3], EVERY_M),
        lambda i: torch._int_mm(x, w[i % 3].t()),
        (lambda i: torch._int_mm(xu, w[i % 3].t())) if int_mm_takes_uint8() else None,
        lambda i: F.linear(xb, dense[i % 3]),
    ]
    best = [float("inf")] * len(runs)
    for _ in range(rounds):
        for j, fn in enumerate(runs):
            if fn is not None:
                best[j] = min(best[j], best_us(fn, reps))
    ref = best[1]
    return ["—" if fn is None else f"{t:.0f} us ({ref / t:.2f}×)" for fn, t in zip(runs, best, strict=True)]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--shapes", default="512x512,1536x512,512x4096,2048x2048,4096x4096,4096x14336,14336x4096")
    p.add_argument("--ms", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row (the minimum is kept)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.ops.qlower.int8_gemm(torch.zeros(1, 8, dtype=torch.int8), torch.zeros(1, 8, dtype=torch.int8), 1)
    print(
        f"{torch.get_num_threads()} threads, {torch.backends.cpu.get_cpu_capability()}, "
        f"int8_gemm level {torch.ops.qlower_native.int8_gemm_isa()}, torch {torch.__version__}"
    )
    heads = ["qlower::int8_gemm", "s8s8 _int_mm", "u8s8 _int_mm", "bf16 F.linear"]
    print("| M | K→N | " + " | ".join(heads) + " |")
    print("|---|---|" + "---|" * len(heads))
    for kn in args.shapes.split(","):
        k, n = (int(v) for v in kn.split("x"))
        for m in (int(v) for v in args.ms.split(",")):
            print(f"| {m} | {k}→{n} | " + " | ".join(measure(m, k, n, args.rounds)) + " |", flush=True)


if __name__ == "__main__":
    main()
