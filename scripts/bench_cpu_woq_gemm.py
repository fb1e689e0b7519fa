"""CPU woq-int8 kernels side by side, eager, one linear: qlower::woq_int8_gemm (int8 converted inside the kernel),
`_weight_int8pack_mm` (oneDNN, M <= 16), dequantize-then-bf16-GEMM, and bf16 `F.linear` on unquantized weights.

    python scripts/bench_cpu_woq_gemm.py [--threads 2] [--shapes 4096x4096,4096x14336] [--ms 1,4,16,128,1024]
    QLOWER_CPU_WOQ_ISA=avx512 python scripts/bench_cpu_woq_gemm.py      # one ISA path of woq_int8_gemm

Minimum over timed calls, each taking the next of 3 weight sets (the weights are not cache-resident). The
ratios (other / woq_int8_gemm) are what `WOQ_GEMM_MAX_M` in lowerings/devices/cpu.py is set from.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import qlower  # noqa: F401  (registers torch.ops.qlower.*)

BF16 = torch.bfloat16


def best_ms(fn: Callable[[int], object], reps: int) -> float:
    fn(0)
    best = float("inf")
    for i in range(1, reps + 1):
        t = time.perf_counter()
        fn(i)
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def measure(x: torch.Tensor, sets: list, dense: list) -> list[str]:
    """The table cells of one M: each time, and the ratio other / woq_int8_gemm."""
    m = x.shape[0]
    reps = 20 if m <= 16 else 5 if m <= 128 else 2
    new = best_ms(lambda i: torch.ops.qlower.woq_int8_gemm(x, *sets[i % 3], None, False, BF16), reps)
    cells = [f"{new:.3f} ms"]
    if m <= 16:
        packed = best_ms(lambda i: torch._weight_int8pack_mm(x, *sets[i % 3]), reps)
        cells.append(f"{packed:.3f} ms ({packed / new:.2f}×)")
    else:
        cells.append("—")
    dq = best_ms(lambda i: F.linear(x, sets[i % 3][0].to(BF16)) * sets[i % 3][1], reps)
    bf = best_ms(lambda i: F.linear(x, dense[i % 3]), reps)
    return cells + [f"{dq:.3f} ms ({dq / new:.2f}×)", f"{bf:.3f} ms ({bf / new:.2f}×)"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--shapes", default="4096x4096,4096x14336")
    p.add_argument("--ms", default="1,4,16,128,1024")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    isa = os.environ.get("QLOWER_CPU_WOQ_ISA", "best")
    print(f"| M | K→N | woq_int8_gemm ({isa}) | _weight_int8pack_mm | dequant + GEMM | bf16 F.linear |")
    print("|---|---|---|---|---|---|")
    for kn in args.shapes.split(","):
        k, n = (int(v) for v in kn.split("x"))
        sets = [
            (torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n, dtype=BF16) / 127)
            for _ in range(3)
        ]
        dense = [torch.randn(n, k, dtype=BF16) / k**0.5 for _ in range(3)]
        for m in (int(v) for v in args.ms.split(",")):
            cells = measure(torch.randn(m, k, dtype=BF16), sets, dense)
            print(f"| {m} | {k}→{n} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
