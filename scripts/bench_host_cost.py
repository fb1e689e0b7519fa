"""Host cost of one quantized linear outside CUDA graphs (a symbolic batch picks its kernel on the host): wall
time per call and CUDA kernels per call, qlower against stock Inductor on the same graph and bf16 `F.linear`.

    python scripts/bench_host_cost.py [--shape 4096x4096] [--ms 2,4,16,64,300] [--calls 300] [--families mx]

Per M, side by side in one process: qlower compiled for that static M; qlower compiled once with a symbolic M
(`torch._dynamo.mark_dynamic` on the activation: the weights stay static), which picks its kernel with a host
`if` on M; stock `torch.compile` with a symbolic M; bf16 `F.linear` eager and compiled with a symbolic M.
Families: woq-int8 (gpt-fast formula), dynamic-int8 (hand-written per-token quantize, `_int_mm`, rescale) and
MXFP4 weight-only (hand-written dequant, `qlower.quantize.mx_format`).
Wall time: the mean of `--calls` back-to-back calls with one synchronize at the end (the host's rate: at these
sizes the GPU waits for the host). Kernels: CUDA kernels of one call (profiler). "—": that variant raised (stock
`_int_mm` refuses M <= 16 on CUDA).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_host_cost", *sys.argv[1:]])

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import qlower
from qlower.quantize import mx_format
from tests.forms.dynamic_int8 import per_token  # the hand-written dynamic-int8 form the tests use


def woq(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w.to(x.dtype)) * s


def dyn(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xq, sx = per_token(x)
    return (torch._int_mm(xq, w.t()) * sx * s).to(x.dtype)


def mxfp4(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return F.linear(x, mx_format.dequantize(w, s, "e2m1", x.dtype))


def wall_us(fn: Callable[[], object], calls: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def kernels_per_call(fn: Callable[[], object]) -> int:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def cell(fn: Callable[[torch.Tensor], object], x: torch.Tensor, calls: int) -> str:
    """`wall (kernels)` of fn(x), or "—" where fn cannot run this M."""
    try:
        return f"{wall_us(lambda: fn(x), calls):.0f} ({kernels_per_call(lambda: fn(x))})"
    except Exception:  # noqa: BLE001  (a variant that cannot run this M: shown as such)
        return "—"


def family_rows(family: str, fn: Callable, k: int, n: int, ms: list[int], calls: int) -> list[str]:
    dense = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    if family == "mx":
        w, s = mx_format.quantize(dense.float(), "e2m1")
    else:
        w = torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda")
        scale_dtype = torch.bfloat16 if family == "woq_int8" else torch.float32
        s = torch.rand(n, device="cuda", dtype=scale_dtype) / 127
    quantized = functools.partial(fn, w=w, s=s)
    unquantized = functools.partial(F.linear, weight=dense)
    torch._dynamo.reset()
    opts = qlower.inductor_options()
    static = torch.compile(quantized, dynamic=False, options=opts)
    symbolic = torch.compile(quantized, options=opts)
    stock = torch.compile(quantized)
    bf16 = torch.compile(unquantized)
    rows = []
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        x_dyn = x.clone()
        torch._dynamo.mark_dynamic(x_dyn, 0)
        pairs = [(static, x), (symbolic, x_dyn), (stock, x_dyn), (unquantized, x), (bf16, x_dyn)]
        rows.append(f"| {family} | {m} | " + " | ".join(cell(f, inp, calls) for f, inp in pairs) + " |")
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4096x4096", help="KxN")
    ap.add_argument("--ms", default="2,4,16,64,300")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--families", default="woq_int8,dynamic_int8,mx", help="comma-separated")
    args = ap.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    ms = [int(v) for v in args.ms.split(",")]
    torch._dynamo.config.cache_size_limit = 256
    names = ["qlower static M", "qlower symbolic M", "stock symbolic M", "bf16 eager", "bf16 symbolic M"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {k}->{n} bf16, no CUDA graphs")
    print("wall per call in us (CUDA kernels per call)\n")
    print("| family | M | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    with torch.no_grad():
        for family, fn in (("woq_int8", woq), ("dynamic_int8", dyn), ("mx", mxfp4)):
            if family in args.families.split(","):
                family_rows(family, fn, k, n, ms, args.calls)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
