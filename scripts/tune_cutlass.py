"""Time every configuration of qlower's CUTLASS W8A16 GEMM per weight shape and M, beside cuBLAS bf16, qlower's
dequant + cuBLAS and its Triton op (`qlower::woq_int8_linear` at a static M, what AUTO runs below the GEMM's M
range), and write this GPU's tuned table (lowerings/kernels/cutlass/tuned/<gpu>.json).

    python -m scripts.tune_cutlass --out lowerings/kernels/cutlass/tuned/h200.json    # on an H200
    python -m scripts.tune_cutlass --out lowerings/kernels/cutlass/tuned/h100.json    # on an H100

`--family mxfp4` times the MXFP4 GEMM's configurations instead, beside cuBLAS bf16 and qlower's Triton MXFP4 op
(`qlower::mx_linear`, what AUTO ran before), and prints the rows `mxfp4.choose` is read from.

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
from qlower.lowerings.kernels.cutlass import mxfp4, w8a16
from qlower.lowerings.kernels.triton.int8.ops import _dense as dequant_mm  # registers the Triton op
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
    woq = torch.ops.qlower.woq_int8_linear
    row["triton_us"] = gpu_time_us([lambda i=i: woq(x, p["w"][i], p["s"][i], None) for i in range(SETS)])
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


def mxfp4_problem(m: int, n: int, k: int) -> dict:
    """Random e2m1 codes and block scales 2^-10 .. 2^-4 (trained weights' range), 8 weight sets."""
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops  # noqa: F401  (registers qlower::mx_linear)

    torch.manual_seed(0)
    w = [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda") for _ in range(SETS)]
    codes = [torch.randint(117, 124, (n, k // 32), dtype=torch.uint8, device="cuda") for _ in range(SETS)]
    scales = [mxfp4.block_scales(torch.exp2(c.float() - 127)) for c in codes]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    wb = [mxfp4_dequant(wi, ci).to(torch.bfloat16) for wi, ci in zip(w, codes, strict=True)]
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    return {"x": x, "w": w, "codes": codes, "scales": scales, "wb": wb, "out": out}


def mxfp4_dequant(w: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """float64 [N, K] from e2m1 bytes and e8m0 codes (the reference)."""
    table = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64, device=w.device)
    nib = torch.stack([w & 15, w >> 4], dim=-1).reshape(w.shape[0], -1).long()
    vals = table[nib & 7] * torch.where(nib >= 8, -1.0, 1.0).double()
    return vals * torch.exp2(codes.double() - 127).repeat_interleave(32, dim=1)


def measure_mxfp4(m: int, n: int, k: int) -> dict:
    p = mxfp4_problem(m, n, k)
    x, out = p["x"], p["out"]
    row = {"m": m, "n": n, "k": k}
    row["bf16_us"] = gpu_time_us([lambda i=i: torch.mm(x, p["wb"][i].t()) for i in range(SETS)])
    mx = torch.ops.qlower.mx_linear
    row["triton_us"] = gpu_time_us(
        [
            lambda i=i: mx(x, None, p["w"][i], p["codes"][i], None, 0, 3, False, False, torch.bfloat16)
            for i in range(SETS)
        ]
    )
    ref = x.double() @ mxfp4_dequant(p["w"][0], p["codes"][0]).t()
    row["configs"] = {}
    for cfg in cutlass_configs.MXFP4_CONFIGS:
        for splits in SPLITS if cfg.stream_k else (0,):
            c = cutlass_configs.Choice(cfg.name, splits)
            mxfp4.launch(x, p["w"][0], p["scales"][0], None, out, c)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                row["configs"][f"{c.config}/{c.splits}"] = {"error": err}
                continue
            calls = [
                lambda i=i, c=c: mxfp4.launch(x, p["w"][i], p["scales"][i], None, out, c) for i in range(SETS)
            ]
            row["configs"][f"{c.config}/{c.splits}"] = {"us": gpu_time_us(calls), "rel_err": err}
    timed = {key: v["us"] for key, v in row["configs"].items() if "us" in v}
    row["best"] = min(timed, key=timed.get) if timed else "none"
    row["best_us"] = timed.get(row["best"], float("nan"))
    rule = mxfp4.choose(m, n, k)
    row["rule"] = f"{rule.config}/{rule.splits}"
    row["rule_us"] = timed.get(row["rule"], float("nan"))
    return row


def tuned_table(rows: list[dict], out: Path, merge: bool = False) -> dict:
    """The table of `rows`' fastest configurations; with `merge`, added to the table already at `out` (a
    measured (N, K, M) replaces its row there; the others stay)."""
    by_m: dict[tuple[int, int], dict[int, dict]] = {}
    argv = sys.argv[1:]
    if "--raw" in argv:  # where the raw timings went is no part of how the table is made
        i = argv.index("--raw")
        argv = argv[:i] + argv[i + 2 :]
    command = " ".join(["python -m scripts.tune_cutlass", *argv])
    if merge and out.exists():
        old = json.loads(out.read_text())
        command = f"{old['command']} && {command}"
        for entry in old["shapes"]:
            by_m[(entry["n"], entry["k"])] = {r["max_m"]: r for r in entry["ranges"]}
    for r in rows:
        name, splits = r["best"].split("/")
        by_m.setdefault((r["n"], r["k"]), {})[r["m"]] = {
            "max_m": r["m"],
            "config": name,
            "splits": int(splits),
        }
    shapes = {key: [ranges[m] for m in sorted(ranges)] for key, ranges in by_m.items()}
    return {
        "device": torch.cuda.get_device_name(),
        "command": command,
        "shapes": [{"n": n, "k": k, "ranges": ranges} for (n, k), ranges in shapes.items()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="14336x4096,4096x14336", help="NxK weight shapes")
    ap.add_argument("--ms", default="128,256,512,1024,2048,4096,8192")
    ap.add_argument("--out", type=Path, help="write the tuned table here")
    ap.add_argument("--merge", action="store_true", help="add the rows to the table at --out, not replace it")
    ap.add_argument("--raw", type=Path, help="write every timing here (JSON)")
    ap.add_argument("--family", choices=("w8a16", "mxfp4"), default="w8a16")
    args = ap.parse_args()
    start = time.perf_counter()
    lib = cutlass_build.library()
    print(f"library: {lib} ({time.perf_counter() - start:.0f} s)", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        for m in map(int, args.ms.split(",")):
            if args.family == "mxfp4":
                r = measure_mxfp4(m, n, k)
                rows.append(r)
                print(
                    f"N={n} K={k} M={m}: bf16 {r['bf16_us']:.1f} us, triton {r['triton_us']:.1f} "
                    f"({r['bf16_us'] / r['triton_us']:.2f}x), cutlass {r['best']} {r['best_us']:.1f} "
                    f"({r['bf16_us'] / r['best_us']:.2f}x), rule {r['rule']} {r['rule_us']:.1f} "
                    f"({r['bf16_us'] / r['rule_us']:.2f}x); "
                    + ", ".join(
                        f"{key} {v.get('us', float('nan')):.1f}"
                        if "us" in v
                        else f"{key} ERR {v['error']:.2g}"
                        for key, v in r["configs"].items()
                    ),
                    flush=True,
                )
                continue
            r = measure(m, n, k)
            rows.append(r)
            print(
                f"N={n} K={k} M={m}: bf16 {r['bf16_us']:.1f} us, dequant+cuBLAS {r['dequant_us']:.1f} "
                f"({r['bf16_us'] / r['dequant_us']:.2f}x), triton {r['triton_us']:.1f} "
                f"({r['bf16_us'] / r['triton_us']:.2f}x), cutlass {r['best']} {r['best_us']:.1f} "
                f"({r['bf16_us'] / r['best_us']:.2f}x)",
                flush=True,
            )
    if args.raw:
        args.raw.write_text(json.dumps(rows, indent=1))
    if args.out and args.family == "w8a16":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(tuned_table(rows, args.out, args.merge), indent=1) + "\n")


if __name__ == "__main__":
    main()
