"""Time every configuration of qlower's CUTLASS W8A16 GEMM per weight shape and M, beside cuBLAS bf16 and
qlower's dequant + cuBLAS, and write this GPU's tuned table (lowerings/kernels/cutlass/tuned/<gpu>.json).

    python -m scripts.tune_cutlass --out lowerings/kernels/cutlass/tuned/h200.json    # on an H200
    python -m scripts.tune_cutlass --out lowerings/kernels/cutlass/tuned/h100.json    # on an H100

GPU time per call from CUDA-graph replays over 8 weight sets (scripts/common/cuda_timing.py), so weights come
from HBM. Every configuration's output is checked against a float64 reference before it is timed. Prints one
row per (shape, M): bf16 us, dequant + cuBLAS us, the best configuration's us and the ratios to bf16.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.tune_cutlass", *sys.argv[1:]])

import torch

from qlower.lowerings.kernels.cutlass import build as cutlass_build
from qlower.lowerings.kernels.cutlass import configs as cutlass_configs
from qlower.lowerings.kernels.cutlass import w8a16
from qlower.lowerings.kernels.triton.int8.ops import _dense as dequant_mm  # dequant + cuBLAS
from scripts.common.cuda_timing import gpu_time_us

SETS = 8
SPLITS = (0, 2, 3, 4)  # stream-K configurations: heuristic, then split-K by s


def choices() -> list[cutlass_configs.Choice]:
    out = []
    for cfg in cutlass_configs.W8A16_CONFIGS:
        out += [cutlass_configs.Choice(cfg.name, s) for s in (SPLITS if cfg.stream_k else (0,))]
    return out


def problem(m: int, n: int, k: int) -> dict:
    torch.manual_seed(0)
    w = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(SETS)]
    s = [(torch.rand(n, device="cuda") / 64 + 1e-3).to(torch.bfloat16) for _ in range(SETS)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wb = [wi.to(torch.bfloat16) for wi in w]
    return {"x": x, "w": w, "s": s, "wb": wb, "out": torch.empty(m, n, device="cuda", dtype=torch.bfloat16)}


def rel_err(p: dict, choice: cutlass_configs.Choice) -> float:
    w8a16.launch(p["x"], p["w"][0], p["s"][0], None, p["out"], choice)
    ref = (p["x"].double() @ p["w"][0].double().t()) * p["s"][0].double()
    return ((p["out"].double() - ref).norm() / ref.norm()).item()


def measure(m: int, n: int, k: int) -> dict:
    p = problem(m, n, k)
    x, out = p["x"], p["out"]
    row = {"m": m, "n": n, "k": k}
    row["bf16_us"] = gpu_time_us([lambda i=i: torch.mm(x, p["wb"][i].t()) for i in range(SETS)])
    row["dequant_us"] = gpu_time_us(
        [lambda i=i: dequant_mm(x, p["w"][i], p["s"][i], None, x.dtype) for i in range(SETS)]
    )
    row["configs"] = {}
    for c in choices():
        err = rel_err(p, c)
        if not err < 1e-2:
            row["configs"][f"{c.config}/{c.splits}"] = {"error": err}
            continue
        calls = [lambda i=i, c=c: w8a16.launch(x, p["w"][i], p["s"][i], None, out, c) for i in range(SETS)]
        row["configs"][f"{c.config}/{c.splits}"] = {"us": gpu_time_us(calls), "rel_err": err}
    timed = {key: v["us"] for key, v in row["configs"].items() if "us" in v}
    row["best"] = min(timed, key=timed.get)
    row["best_us"] = timed[row["best"]]
    return row


def tuned_table(rows: list[dict], out: Path) -> dict:
    shapes: dict[tuple[int, int], list] = {}
    for r in sorted(rows, key=lambda r: r["m"]):
        name, splits = r["best"].split("/")
        shapes.setdefault((r["n"], r["k"]), []).append(
            {"max_m": r["m"], "config": name, "splits": int(splits)}
        )
    return {
        "device": torch.cuda.get_device_name(),
        "command": f"python scripts/tune_cutlass.py --out lowerings/kernels/cutlass/tuned/{out.name}",
        "shapes": [{"n": n, "k": k, "ranges": ranges} for (n, k), ranges in shapes.items()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="14336x4096,4096x14336", help="NxK weight shapes")
    ap.add_argument("--ms", default="128,256,512,1024,2048,4096,8192")
    ap.add_argument("--out", type=Path, help="write the tuned table here")
    ap.add_argument("--raw", type=Path, help="write every timing here (JSON)")
    args = ap.parse_args()
    start = time.perf_counter()
    lib = cutlass_build.library()
    print(f"library: {lib} ({time.perf_counter() - start:.0f} s)", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        for m in map(int, args.ms.split(",")):
            r = measure(m, n, k)
            rows.append(r)
            print(
                f"N={n} K={k} M={m}: bf16 {r['bf16_us']:.1f} us, dequant+cuBLAS {r['dequant_us']:.1f} "
                f"({r['bf16_us'] / r['dequant_us']:.2f}x), cutlass {r['best']} {r['best_us']:.1f} "
                f"({r['bf16_us'] / r['best_us']:.2f}x)",
                flush=True,
            )
    if args.raw:
        args.raw.write_text(json.dumps(rows, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(tuned_table(rows, args.out), indent=1) + "\n")


if __name__ == "__main__":
    main()
