"""Tune and benchmark qlower's CUDA Triton kernels (woq-int8, dynamic-int8) on one GPU, in one run.

    python -m scripts.tune_cuda_kernels --out DIR [--sweep] [--compiled] [--budget-s 420]

--sweep     times candidate configs of each kernel per (M, K, N) on raw launches, checks each against float64,
            installs the winners into `configs` in-process, and writes OUT/tuned.json: this GPU's data file
            (lowerings/kernels/triton/tuned/<gpu>.json, its tables as they stand after the sweep, which that
            file's `regenerate` commands reproduce).
--compiled  side by side per grid point: bf16 F.linear, stock torch.compile of the quantized model, and the
            same model under torch.compile with qlower.inductor_options() (static M, and one dynamic-M
            compile per (K, N)); checks the generated code calls qlower's kernel.

Timing: median over CUDA-graph replays of 8 calls that rotate over 8 weight sets (so weights come from HBM,
not L2; activations stay hot as in a model), divided by the calls per replay. Graph replay removes host launch
overhead, so the numbers are GPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.tune_cuda_kernels", *sys.argv[1:]])

import torch
import torch.nn.functional as F

from scripts.common.cuda_timing import gpu_time_us

N_WEIGHTS = 8
SHAPES_KN = ((4096, 4096), (4096, 14336))
SWEEP_M = (1, 4, 16, 64, 256, 1024, 4096)
COMPILED_M = (1, 16, 128, 1024, 4096)
T0 = time.time()


def log(*a: Any) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


# ---------------------------------------------------------------- timing
def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# ---------------------------------------------------------------- problems
def woq_problem(m: int, k: int, n: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(m * 7 + k + n)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    ws = [
        torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
        for _ in range(N_WEIGHTS)
    ]
    ss = [(torch.rand(n, device="cuda", generator=g) * 0.02 + 0.005).to(dtype) for _ in range(N_WEIGHTS)]
    return {"x": x, "w": ws, "s": ss}


def woq_ref(p: dict[str, Any], i: int = 0) -> torch.Tensor:
    return p["x"].double() @ (p["w"][i].double() * p["s"][i].double()[:, None]).t()


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xs = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-6) / 127.0
    xq = torch.clamp(torch.round(x.float() / xs), -128, 127).to(torch.int8)
    return xq, xs


def dyn_ref(p: dict[str, Any], i: int = 0) -> torch.Tensor:
    xq, xs = quantize_per_token(p["x"])
    return (xq.double() @ p["w"][i].double().t()) * xs.double() * p["s"][i].double()[None, :]


# ---------------------------------------------------------------- sweep
def woq_candidates(m: int, k: int, n: int) -> list[Any]:
    return _woq_candidates(m, k, n) + _decode_size_candidates(m)


def _decode_size_candidates(m: int) -> list[Any]:
    """M 2..16: the FMA decode tiles on 2 rows and the 16-row PTX tiles, whose sweep (2026-12-01) set the
    table's M 2..16 entries."""
    from qlower.lowerings.kernels.triton.configs import decode_fma, mm

    if not 2 <= m <= 16:
        return []
    cands = [mm(16, 32, 256, 4, 4, fast=2), mm(16, 64, 256, 4, 4, fast=2), mm(16, 32, 128, 4, 5, fast=2),
             mm(16, 32, 512, 4, 3, fast=2)]  # fmt: skip
    if m == 2:
        cands += [decode_fma(2, 8, 1024, warps=2), decode_fma(2, 16, 512)]
    return cands


def _woq_candidates(m: int, k: int, n: int) -> list[Any]:
    from qlower.lowerings.kernels.triton.configs import gemv, mm, tma

    if m <= 2:
        return [gemv(1, 16, 512), gemv(1, 32, 256), gemv(1, 8, 1024), gemv(1, 16, 512, fast=0),
                gemv(1, 16, 1024, warps=8), gemv(1, 32, 512, warps=8), gemv(1, 16, 512, split_k=2),
                mm(16, 64, 256, 4, 4, swap=True), mm(16, 32, 256, 4, 4, swap=True), mm(16, 64, 256, 4, 4),
                mm(16, 64, 512, 4, 3), mm(16, 32, 512, 4, 4), mm(16, 128, 256, 4, 4)]  # fmt: skip
    if m <= 8:
        return [gemv(4, 16, 128), gemv(4, 8, 256), mm(16, 64, 256, 4, 4, swap=True),
                mm(16, 32, 256, 4, 4, swap=True), mm(16, 64, 128, 4, 5, swap=True),
                mm(16, 64, 256, 4, 4, swap=True, split_k=2)]  # fmt: skip
    if m <= 16:
        return [mm(16, 64, 256, 4, 4, swap=True), mm(16, 32, 256, 4, 4, swap=True),
                mm(16, 128, 128, 4, 4, swap=True), mm(16, 64, 128, 4, 5, swap=True),
                mm(16, 64, 256, 4, 4, swap=True, fast=0), mm(16, 64, 256, 4, 4, swap=True, split_k=2),
                mm(16, 64, 256, 4, 4), mm(16, 64, 512, 4, 3), mm(16, 32, 512, 4, 4), mm(16, 128, 256, 4, 4),
                mm(16, 64, 256, 4, 4, fast=0)]  # fmt: skip
    if m <= 64:  # the PTX conversions (fast 2 / 3) won every M <= 64 point since; split-K where N is small
        return [mm(64, 64, 128, 4, 4, fast=2), mm(64, 128, 128, 4, 4, fast=2), mm(64, 128, 64, 4, 4, fast=2),
                mm(32, 64, 256, 4, 4, fast=2), mm(32, 128, 128, 4, 4, fast=2), mm(64, 32, 256, 4, 4, fast=2),
                mm(32, 64, 256, 4, 4, split_k=2, fast=2), mm(32, 64, 256, 4, 4, split_k=4, fast=2),
                tma(64, 128, 128, 4, 4, 2, fast=2)] + _swap_grid(m_tile(m))  # fmt: skip
    if m <= 256:
        return [mm(64, 128, 128, 4, 4), mm(128, 128, 64, 8, 3), mm(128, 128, 128, 8, 3), mm(64, 256, 64, 8, 3),
                mm(128, 64, 128, 4, 4), mm(128, 128, 64, 4, 4, fast=2), mm(128, 128, 64, 4, 3, fast=2),
                mm(128, 128, 64, 4, 4, split_k=2, fast=2), mm(64, 128, 64, 4, 4, fast=2),
                tma(128, 128, 64, 4, 4, 2, fast=2)] + _swap_grid(128) + (
                    [mm(256, 64, 64, 4, 3, swap=True, fast=3), mm(256, 64, 64, 4, 4, swap=True, fast=3)]
                    if m > 128 else [])  # fmt: skip
    return [mm(128, 256, 64, 8, 3), mm(128, 128, 64, 8, 4), mm(128, 256, 64, 8, 4), mm(256, 128, 64, 8, 3),
            mm(128, 128, 128, 8, 3), mm(128, 256, 64, 8, 3, swap=True), mm(128, 128, 64, 8, 4, swap=True)]  # fmt: skip


def m_tile(m: int) -> int:
    """The activation rows one swap-AB program covers: all of M up to 64 (each weight tile converted once)."""
    return 32 if m <= 32 else 64


def _swap_grid(bm: int) -> list[Any]:
    """Swap-AB tiles with the 2-element PTX conversion: weight rows 64 / 128, K steps 64 / 128, split-K 1 / 2 / 4,
    3 or 4 stages (the M 32..256 sweep of BENCHMARKS.md, "CUDA, woq_int8", found 3 stages and split-K
    where the table had 4 stages and none)."""
    from qlower.lowerings.kernels.triton.configs import mm

    return [mm(bm, bn, bk, 4, st, swap=True, split_k=sk, fast=3)
            for bn in (64, 128) for bk in (64, 128) for sk in (1, 2, 4) for st in (3, 4)
            if not (bm >= 128 and bn == 128 and bk == 128)]  # fmt: skip


def dyn_candidates(m: int, k: int, n: int) -> list[Any]:
    from qlower.lowerings.kernels.triton.configs import mm

    if m <= 16:
        return [mm(16, 64, 256, 4, 4, swap=True), mm(16, 32, 512, 4, 4, swap=True), mm(16, 128, 256, 4, 4, swap=True),
                mm(16, 64, 512, 4, 4, swap=True), mm(16, 64, 256, 4, 4, swap=True, split_k=2),
                mm(16, 64, 256, 4, 4)]  # fmt: skip
    if m <= 64:
        return [mm(64, 64, 256, 4, 4, swap=True), mm(64, 128, 256, 4, 4, swap=True), mm(64, 128, 128, 4, 4),
                mm(64, 64, 256, 4, 4)]  # fmt: skip
    if m <= 128:  # enough CTAs for 132 SMs at N = 4096 (128x128 tiles give 32)
        return [mm(64, 64, 256, 4, 4, swap=True), mm(64, 64, 128, 4, 4), mm(128, 64, 128, 4, 4),
                mm(64, 128, 128, 4, 4), mm(32, 64, 256, 4, 4, swap=True), mm(128, 64, 128, 8, 3, swap=True),
                mm(64, 32, 256, 4, 4, swap=True), mm(128, 128, 128, 8, 3)]  # fmt: skip
    if m <= 256:
        return [mm(64, 128, 128, 4, 4), mm(128, 128, 128, 8, 3), mm(128, 256, 128, 8, 3), mm(64, 256, 128, 4, 4),
                mm(128, 128, 128, 4, 4, swap=True)]  # fmt: skip
    return [mm(128, 256, 128, 8, 3), mm(128, 256, 128, 8, 4), mm(256, 128, 128, 8, 3), mm(128, 128, 128, 8, 4),
            mm(128, 256, 64, 8, 4), mm(128, 128, 256, 8, 3), mm(128, 256, 128, 8, 3, swap=True)]  # fmt: skip


def sweep(
    results: dict[str, Any],
    deadline: float,
    families: list[str],
    ms: list[int],
    kns: tuple[tuple[int, int], ...] = SHAPES_KN,
) -> None:
    from qlower.lowerings.kernels.triton import configs
    from qlower.lowerings.kernels.triton.int8 import ops as int8_ops

    for family in families:
        table = (configs.WOQ_INT8_TUNED if family == "woq_int8" else configs.DYNAMIC_INT8_TUNED).writable()
        for k, n in kns:
            for m in ms:
                if time.time() > deadline:
                    log("sweep: out of time budget, stopping")
                    return
                p = woq_problem(m, k, n)
                if family == "dynamic_int8":
                    p["xq"], p["xs"] = quantize_per_token(p["x"])
                    ref, cands = dyn_ref(p), dyn_candidates(m, k, n)
                else:
                    ref, cands = woq_ref(p), woq_candidates(m, k, n)
                current = (configs.woq_int8_config if family == "woq_int8" else configs.dynamic_int8_config)(
                    m, k, n
                )
                cands = [current] + [c for c in cands if c != current]
                rows = []
                for cfg in cands:
                    try:
                        if family == "woq_int8":
                            calls = [(lambda i=i, c=cfg, p=p: int8_ops.launch_config(c, p["x"], p["w"][i], p["s"][i]))
                                     for i in range(N_WEIGHTS)]  # fmt: skip
                        else:
                            calls = [(lambda i=i, c=cfg, p=p: int8_ops.launch_config(c, p["xq"], p["w"][i], p["s"][i], p["xs"],
                                                                         out_dtype=torch.bfloat16))
                                     for i in range(N_WEIGHTS)]  # fmt: skip
                        err = rel_err(calls[0](), ref)
                        us = gpu_time_us(calls) if err < 2e-2 else float("inf")
                    except Exception as e:  # a config Triton cannot build (e.g. out of shared memory)
                        err, us = float("nan"), float("inf")
                        log(f"  {family} M={m} {k}->{n} {cfg}: {type(e).__name__}: {str(e)[:160]}")
                    rows.append({"config": str(cfg), "us": us, "rel_err": err, "cfg": cfg})
                best = min(rows, key=lambda r: r["us"])
                if best["us"] < float("inf"):
                    table[(configs.m_bucket(m), k, n)] = best["cfg"]
                log(f"{family} M={m:5d} {k}->{n}: best {best['config']} {best['us']:.1f} us "
                    f"(err {best['rel_err']:.1e}); " + ", ".join(f"{r['us']:.1f}" for r in rows))  # fmt: skip
                results.setdefault("sweep", []).append(
                    {
                        "family": family,
                        "m": m,
                        "k": k,
                        "n": n,
                        "best": best["config"],
                        "best_us": best["us"],
                        "best_repr": repr(best["cfg"]),
                        "all": [{kk: vv for kk, vv in r.items() if kk != "cfg"} for r in rows],
                    }  # fmt: skip
                )
                del p
    torch.cuda.empty_cache()


# ---------------------------------------------------------------- compiled models
def woq_model(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """gpt-fast's weight-only int8 linear."""
    return F.linear(x, w.to(x.dtype)) * s


def dyn_model(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Hand-written dynamic per-token int8 linear through `_int_mm` (CUDA needs M > 16)."""
    xq, xs = quantize_per_token(x)
    return ((torch._int_mm(xq, w.t()).float() * xs) * s.float()).to(x.dtype)


def dyn_direct(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The same model calling qlower's Triton op directly (used when the dynamic_int8 pattern is absent)."""
    xq, xs = quantize_per_token(x)
    return torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, None, x.dtype)


def compiled_fn(fn: Callable, qlower_on: bool, dynamic: bool | None) -> Callable:
    import qlower

    torch._dynamo.reset()
    opts = qlower.inductor_options() if qlower_on else None
    return torch.compile(fn, options=opts, dynamic=dynamic, fullgraph=True)


def time_fn(fn: Callable, p: dict[str, Any]) -> float:
    return gpu_time_us([(lambda i=i: fn(p["x"], p["w"][i], p["s"][i])) for i in range(N_WEIGHTS)])


def first_call_code(fn: Callable, p: dict[str, Any]) -> tuple[torch.Tensor, str]:
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(fn, p["x"], p["w"][0], p["s"][0])
    return out, "\n".join(codes)


Points = list[tuple[str, int, int, list[int]]]


def parse_points(text: str) -> Points:
    """'woq_int8:4096x14336:1,16,4096;dynamic_int8:...' -> [(family, K, N, [M...])]."""
    out = []
    for part in filter(None, text.split(";")):
        family, kn, ms = part.split(":")
        k, n = (int(v) for v in kn.split("x"))
        out.append((family, k, n, [int(m) for m in ms.split(",")]))
    return out


DEFAULT_POINTS = ";".join(
    f"{f}:{k}x{n}:{','.join(map(str, COMPILED_M))}"
    for f in ("woq_int8", "dynamic_int8")
    for k, n in SHAPES_KN
)


def compiled(results: dict[str, Any], deadline: float, points: Points, dynamic_m: bool) -> None:
    import qlower

    dyn_family = "dynamic_int8" in qlower.FAMILIES
    for family, k, n, ms in points:
        model = woq_model if family == "woq_int8" else dyn_model
        qmodel = model if (family == "woq_int8" or dyn_family) else dyn_direct
        refn = woq_ref if family == "woq_int8" else dyn_ref
        rows = []
        for m in ms:
            if time.time() > deadline:
                log("compiled: out of time budget, stopping")
                break
            p = woq_problem(m, k, n)
            row: dict[str, Any] = {"family": family, "m": m, "k": k, "n": n}
            wb = [(w.to(torch.bfloat16) * s[:, None]) for w, s in zip(p["w"], p["s"], strict=True)]
            row["bf16_us"] = gpu_time_us(
                [(lambda i=i, p=p, wb=wb: F.linear(p["x"], wb[i])) for i in range(N_WEIGHTS)]
            )
            del wb
            ref = refn(p)
            try:
                f = compiled_fn(model, False, False)
                row["stock_err"] = rel_err(f(p["x"], p["w"][0], p["s"][0]), ref)
                row["stock_us"] = time_fn(f, p)
            except Exception as e:
                row["stock_us"], row["stock_error"] = None, f"{type(e).__name__}: {str(e)[:200]}"
            try:
                qlower.clear_reports()
                f = compiled_fn(qmodel, True, False)
                out, code = first_call_code(f, p)
                rep = qlower.last_report()
                row["qlower_lowering"] = ",".join(str(d.lowering) for d in rep) if rep else "direct op"
                row["qlower_calls_kernel"] = ("qlinear_mm_kernel" in code) or ("woq_int8_gemv_kernel" in code)
                row["qlower_python_fallback"] = "torch.ops.qlower." in code
                row["qlower_err"] = rel_err(out, ref)
                row["qlower_us"] = time_fn(f, p)
            except Exception as e:
                row["qlower_us"], row["qlower_error"] = None, f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            rows.append(row)
            log(fmt_row(row))
            del p
        if dynamic_m and time.time() < deadline:
            # one dynamic-M compile (explicit TRITON preference: AUTO declines dynamic M), first called at M > 1
            torch._dynamo.reset()
            dyn_q = torch.compile(qmodel, options=qlower.inductor_options(kernel_preference="triton"))
            for row in sorted(rows, key=lambda r: (r["m"] == 1, r["m"])):
                p = woq_problem(row["m"], k, n)
                try:
                    if row["m"] > 1:
                        torch._dynamo.mark_dynamic(p["x"], 0)
                    row["qlower_dyn_err"] = rel_err(dyn_q(p["x"], p["w"][0], p["s"][0]), refn(p))
                    row["qlower_dyn_us"] = time_fn(dyn_q, p)
                except Exception as e:
                    row["qlower_dyn_us"], row["qlower_dyn_error"] = (
                        None,
                        f"{type(e).__name__}: {str(e)[:300]}",
                    )
                del p
        results.setdefault("compiled", []).extend(rows)
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def fmt_row(r: dict[str, Any]) -> str:
    def us(key: str) -> str:
        v = r.get(key)
        return f"{v:.1f}" if isinstance(v, (int, float)) else "-"

    bound = r["n"] * r["k"] / 4.8e6  # int8 weight bytes / 4.8 TB/s, in us
    return (f"| {r['family']} | {r['m']} | {r['k']}->{r['n']} | {us('bf16_us')} | {us('stock_us')} | {us('qlower_us')} | "
            f"{us('qlower_dyn_us')} | {_ratio(r.get('bf16_us'), r.get('qlower_us'))} | "
            f"{_ratio(r.get('stock_us'), r.get('qlower_us'))} | {bound / r['qlower_us'] if r.get('qlower_us') else 0:.2f} | "
            f"{r.get('qlower_lowering', '-')} |")  # fmt: skip


TABLE_HEAD = (
    "| family | M | K->N | bf16 F.linear us | stock compile us | qlower us | qlower dyn-M us | vs bf16 | vs stock "
    "| int8 HBM bound / qlower | lowering |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results.get("compiled", [])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, family in zip(axes, ("woq_int8", "dynamic_int8"), strict=True):
        for k, n in SHAPES_KN:
            rs = [r for r in rows if r["family"] == family and (r["k"], r["n"]) == (k, n)]
            for key, style in (("qlower_us", "-o"), ("stock_us", "--x")):
                pts = [(r["m"], r["bf16_us"] / r[key]) for r in rs if r.get(key)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, label=f"{key.split('_')[0]} {k}->{n}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M")
        ax.set_ylabel("speedup vs bf16 F.linear")
        ax.set_title(f"{family}, H200, bf16 activations")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_tuned(results: dict[str, Any], path: Path) -> None:
    """This GPU's tuned data file: its tables after the sweep, with each swept winner's time."""
    import dataclasses

    from qlower.lowerings.kernels.triton import configs, tuned

    us = {(s["family"], (configs.m_bucket(s["m"]), s["k"], s["n"])): round(s["best_us"], 2)
          for s in results["sweep"] if s["best_us"] < float("inf")}  # fmt: skip
    tables = {"woq_int8": configs.WOQ_INT8_TUNED, "dynamic_int8": configs.DYNAMIC_INT8_TUNED}
    doc = tuned.document(results["env"]["gpu"], tables, dataclasses.asdict, results["env"], us)
    path.write_text(tuned.dumps(doc))
    log(f"tuned data: {path} (replaces lowerings/kernels/triton/tuned/<gpu>.json)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--sweep-m", default=",".join(map(str, SWEEP_M)))
    ap.add_argument("--sweep-families", default="woq_int8,dynamic_int8")
    ap.add_argument(
        "--sweep-kn", default=",".join(f"{k}x{n}" for k, n in SHAPES_KN), help="(K, N) list: 4096x4096,..."
    )
    ap.add_argument("--points", default=DEFAULT_POINTS, help="family:KxN:M,M,...;...")
    ap.add_argument("--dynamic-m", action="store_true", help="also one dynamic-M compile per (K, N)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 64
    import triton

    results: dict[str, Any] = {
        "env": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name(),
            "capability": torch.cuda.get_device_capability(),
            "date": time.strftime("%Y-%m-%d"),
        }  # fmt: skip
    }
    log(results["env"])
    deadline = T0 + args.budget_s
    try:
        if args.sweep:
            sweep_ms = [int(m) for m in args.sweep_m.split(",")]
            sweep_deadline = T0 + args.budget_s * (0.5 if args.compiled else 1.0)
            kns = tuple(tuple(int(v) for v in kn.split("x")) for kn in args.sweep_kn.split(","))
            sweep(results, sweep_deadline, args.sweep_families.split(","), sweep_ms, kns)  # type: ignore[arg-type]
        if args.compiled:
            compiled(results, deadline, parse_points(args.points), args.dynamic_m)
    finally:
        (out / "cuda_kernels.json").write_text(json.dumps(results, indent=1, default=str))
        if results.get("sweep"):
            write_tuned(results, out / "tuned.json")
        lines = [TABLE_HEAD] + [fmt_row(r) for r in results.get("compiled", [])]
        (out / "cuda_kernels.md").write_text("\n".join(lines) + "\n")
        if results.get("compiled"):
            try:
                plot(results, out / "cuda_speedup.png")
            except Exception as e:
                log("plot failed:", e)
        print("\n".join(lines))
        for s in results.get("sweep", []):
            print(
                f"TABLE ({s['family']}, {s['m']}, {s['k']}, {s['n']}): {s['best_repr']}  # {s['best_us']:.1f} us"
            )


if __name__ == "__main__":
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    main()
