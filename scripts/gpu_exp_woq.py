"""GPU experiment: decode-size weight-only int8 linear kernels, side by side on one H200, in one run (<= 3 min).

    python -m pip install -q --no-deps --no-build-isolation . && python -P scripts/gpu_exp_woq.py
    TRITON_INTERPRET=1 python -P scripts/gpu_exp_woq.py --smoke      # CPU: tiny fp16 shapes, no timing meaning

Times at (M, K, N) in {1, 4, 16} x {(4096, 4096), (4096, 14336), (14336, 4096)}: bf16 F.linear (weight
dequantized ahead), qlower's current kernel at its table config (`ops.launch_config`), and the variants of
`woq_decode_kernel` (lowerings/triton_kernels/woq_decode.py). Every variant is checked against a float64
reference with and without bias (rel err <= 1e-2) before it is timed; failures are recorded, not fatal.

Timing: median over CUDA-graph replays of calls that rotate over 8 weight sets (so the weight streams from HBM;
the activations stay hot as in a model), per call; the graph holds every launch a variant makes (memsets,
casts, reduce kernels). Order: baselines at all points, then variants in priority order (each over its
points, so one compile serves them all), then the top variants re-timed interleaved with the baselines.
Compiles are warmed first in a pool of processes (shared Triton disk cache). A deadline guard stops early
and still writes `$OUT/woq_exp.json` (OUT defaults to ./out).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` leaves scripts/ off the path
from cuda_timing import gpu_time_us as _gpu_time_us  # noqa: E402

gpu_time_us = functools.partial(_gpu_time_us, min_reps=2)

T0 = time.time()
N_WEIGHTS = 8
TOL = 1e-2
GPU_KN = ((4096, 4096), (4096, 14336), (14336, 4096))
SMOKE_KN = ((96, 64), (160, 48))
MS = (1, 4, 16)
HBM_TBS = 4.8


def log(*a: Any) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------- variants
def variants() -> list[tuple[str, Any, bool, tuple[int, ...]]]:
    """(name, DecodeConfig, fresh_counters, Ms it runs at), most promising first (the deadline cuts the tail).

    fresh_counters: reduce="sem" with a `torch.zeros` per call (what a functional triton_op must do) instead of
    a persistent zeroed buffer the kernel leaves zeroed.
    """
    from qlower.lowerings.triton_kernels.woq_decode import DecodeConfig as C

    m1, m4, m416, mall = (1,), (4,), (4, 16), (1, 4, 16)
    v: list[tuple[Any, bool, tuple[int, ...]]] = [
        # session 5: one row, the K-long tiles with a 2-D accumulator (acc3) that won 4096^2 (7.1 us), varied
        (C(False, 1, 4, 1024, 4, cvt=2, acc3=True), False, m1),
        (C(False, 1, 8, 2048, 4, cvt=2, acc3=True), False, m1),
        (C(False, 1, 4, 2048, 4, cvt=2, acc3=True), False, m1),
        (C(False, 1, 2, 4096, 4, cvt=2, acc3=True), False, m1),
        (C(False, 1, 8, 1024, 4, cvt=2, acc3=True, prefetch=True), False, m1),
        (C(False, 1, 8, 1024, 8, cvt=2, acc3=True), False, m1),
        (C(False, 1, 16, 1024, 8, cvt=2, acc3=True), False, m1),
        (C(False, 1, 8, 1024, 2, cvt=2, acc3=True), False, m1),
        (C(False, 1, 4, 1024, 2, cvt=2, acc3=True), False, m1),
        (C(False, 1, 4, 1024, 2, cvt=2, acc3=True, evict=False), False, m1),
        (C(False, 1, 2, 1024, 1, cvt=2, acc3=True), False, m1),
        (C(False, 1, 4, 1024, 1, cvt=2, acc3=True), False, m1),
        (C(False, 1, 4, 2048, 2, cvt=2, acc3=True), False, m1),
        (C(False, 1, 2, 2048, 2, cvt=2, acc3=True), False, m1),
        (C(False, 1, 8, 1024, 2, cvt=1, acc3=True), False, m1),
        (C(False, 1, 4, 1024, 2, cvt=1, acc3=True), False, m1),
        (C(False, 1, 4, 512, 1, cvt=2, acc3=True), False, m1),
        (C(False, 1, 2, 512, 1, cvt=2, acc3=True), False, m1),
        # FMA, one row. BK <= 512 keeps a row's K slice inside one warp (32 lanes x 16 bytes), so the per-step
        # reduction is shuffles only; BK = 1024 spreads it over 2 warps (shared memory + a barrier per step)
        (C(False, 1, 16, 512, 4, cvt=2), False, m1),
        (C(False, 1, 32, 512, 4, cvt=2), False, m1),
        (C(False, 1, 32, 256, 4, cvt=2), False, m1),
        (C(False, 1, 16, 512, 4, cvt=2, prefetch=True), False, m1),
        (C(False, 1, 64, 512, 8, cvt=2), False, m1),
        (C(False, 1, 8, 512, 4, cvt=2), False, m1),
        (C(False, 1, 4, 512, 4, cvt=2), False, m1),
        (C(False, 1, 16, 256, 4, cvt=2), False, m1),
        (C(False, 1, 32, 512, 4, cvt=2, prefetch=True), False, m1),
        (C(False, 1, 64, 256, 8, cvt=2, prefetch=True), False, m1),
        (C(False, 1, 8, 1024, 4, cvt=2, acc3=True), False, m1),
        (C(False, 1, 16, 1024, 4, cvt=2), False, m1),
        # swap-AB tensor cores, 16 padded rows
        (C(True, 16, 64, 256, 4, 4, cvt=2), False, mall),
        (C(True, 16, 128, 256, 4, 4, cvt=2), False, m416),
        (C(True, 16, 64, 256, 4, 4, split_k=2, reduce="sem", cvt=2), False, mall),
        (C(True, 16, 128, 256, 4, 4, split_k=2, reduce="sem", cvt=2), False, m416),
        (C(True, 16, 64, 128, 4, 5, cvt=2), False, m416),
        (C(True, 16, 32, 256, 4, 4, cvt=2), False, m416),
        (C(True, 16, 64, 512, 4, 3, cvt=2), False, m416),
        (C(True, 16, 128, 128, 8, 4, cvt=2), False, m416),
        (C(True, 16, 64, 256, 4, 4, split_k=4, reduce="sem", cvt=2), False, m416),
        (C(True, 16, 128, 128, 4, 4, split_k=4, reduce="sem", cvt=2), False, m416),
        (C(True, 16, 64, 256, 4, 4, cvt=1), False, m416),
        (C(True, 16, 64, 256, 4, 4, cvt=2, evict=False), False, m416),
        # FMA, four rows (the converted weight tile serves each row)
        (C(False, 4, 16, 512, 4, cvt=2), False, m4),
        (C(False, 4, 8, 512, 4, cvt=2), False, m4),
        (C(False, 4, 32, 256, 4, cvt=2), False, m4),
        (C(False, 4, 16, 256, 4, cvt=2, prefetch=True), False, m4),
        (C(False, 4, 16, 512, 4, split_k=2, reduce="sem", cvt=2), False, m4),
        (C(False, 4, 16, 512, 4, cvt=1), False, m4),
        # split-K for one row: more, shorter programs; the reductions compared
        (C(False, 1, 32, 512, 4, split_k=2, reduce="sem", cvt=2), False, m1),
        (C(False, 1, 64, 512, 8, split_k=4, reduce="sem", cvt=2), False, m1),
        (C(False, 1, 16, 512, 4, split_k=2, reduce="sem", cvt=2), False, m1),
        (C(False, 1, 64, 256, 4, split_k=4, reduce="sem", cvt=2, prefetch=True), False, m1),
        (C(False, 1, 32, 512, 4, split_k=2, reduce="sem", cvt=2), True, m1),
        (C(False, 1, 32, 512, 4, split_k=2, reduce="atomic", cvt=2), False, m1),
        (C(False, 1, 32, 512, 4, split_k=2, reduce="part", cvt=2), False, m1),
        (C(True, 16, 64, 256, 4, 4, split_k=2, reduce="sem", cvt=2), True, m416),
        (C(True, 16, 64, 256, 4, 4, split_k=2, reduce="atomic", cvt=2), False, m416),
        (C(True, 16, 64, 256, 4, 4, split_k=2, reduce="part", cvt=2), False, m416),
        # one-row knobs: conversion, eviction hint, pipelining
        (C(False, 1, 16, 512, 4, cvt=1), False, m1),
        (C(False, 1, 16, 512, 4, cvt=0), False, m1),
        (C(False, 1, 16, 512, 4, cvt=2, evict=False), False, m1),
        (C(False, 1, 16, 512, 4, 3, cvt=2), False, m1),
    ]
    return [(str(cfg) + (" zeros" if fresh else ""), cfg, fresh, ms) for cfg, fresh, ms in v]


def cvt2_to_cvt1(
    vs: list[tuple[str, Any, bool, tuple[int, ...]]],
) -> list[tuple[str, Any, bool, tuple[int, ...]]]:
    """The same variants with the Triton-ops conversion instead of inline PTX (deduplicated by name)."""
    seen: set[str] = set()
    out = []
    for _, c, fr, ms in vs:
        c = c if c.cvt != 2 else replace(c, cvt=1)
        nm = str(c) + (" zeros" if fr else "")
        if nm not in seen:
            seen.add(nm)
            out.append((nm, c, fr, ms))
    return out


# ---------------------------------------------------------------- problems
def make_problem(m: int, k: int, n: int, dtype: torch.dtype, dev: str, weights: dict) -> dict[str, Any]:
    """x [M, K]; weights shared by every M of a (K, N): 8 sets of int8 w, scales, and one bias."""
    if (k, n) not in weights:
        g = torch.Generator(device=dev).manual_seed(k * 31 + n)
        ws = [
            torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8, generator=g)
            for _ in range(N_WEIGHTS)
        ]
        ss = [(torch.rand(n, device=dev, generator=g) * 0.02 + 0.005).to(dtype) for _ in range(N_WEIGHTS)]
        b = torch.randn(n, device=dev, generator=g).to(dtype)
        weights[(k, n)] = (ws, ss, b)
    ws, ss, b = weights[(k, n)]
    g = torch.Generator(device=dev).manual_seed(m * 7 + k + n)
    x = torch.randn(m, k, device=dev, generator=g).to(dtype)
    ref = x.double() @ (ws[0].double() * ss[0].double()[:, None]).t()
    return {"m": m, "k": k, "n": n, "x": x, "w": ws, "s": ss, "b": b, "ref": ref, "ref_b": ref + b.double()}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if out.shape != ref.shape or not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# ---------------------------------------------------------------- timing
# ---------------------------------------------------------------- the three kinds of callables
def variant_fn(cfg: Any, fresh: bool, counters: torch.Tensor | None) -> Callable[..., torch.Tensor]:
    from qlower.lowerings.triton_kernels.woq_decode import woq_decode

    cnt = None if (fresh or cfg.reduce != "sem") else counters
    return lambda x, w, s, b: woq_decode(cfg, x, w, s, b, counters=cnt)


def current_fn(m: int, k: int, n: int) -> tuple[str, Callable[..., torch.Tensor]]:
    from qlower.lowerings.triton_kernels import configs, ops

    cfg = configs.woq_int8_config(m, k, n)
    return str(cfg), lambda x, w, s, b: ops.launch_config(cfg, x, w, s, bias=b)


def rotate(fn: Callable[..., torch.Tensor], p: dict[str, Any]) -> list[Callable[[], Any]]:
    """One call per weight set, no bias (what is timed)."""
    x, ws, ss = p["x"], p["w"], p["s"]
    return [(lambda w=w, s=s: fn(x, w, s, None)) for w, s in zip(ws, ss, strict=True)]


def bf16_calls(p: dict[str, Any], dtype: torch.dtype) -> list[Callable[[], Any]]:
    """bf16 F.linear on weights dequantized ahead (the unquantized model's cost)."""
    x = p["x"]
    wbs = [(w.to(dtype) * s[:, None]) for w, s in zip(p["w"], p["s"], strict=True)]
    return [(lambda wb=wb: F.linear(x, wb)) for wb in wbs]


def check_and_time(fn: Callable[..., torch.Tensor], p: dict[str, Any], counters: torch.Tensor | None) -> dict:
    """Both correctness checks (twice each: the sem counters must come back zeroed), then time w/o bias."""
    row: dict[str, Any] = {}
    try:
        errs = [rel_err(fn(p["x"], p["w"][0], p["s"][0], None), p["ref"]) for _ in range(2)]
        errs_b = [rel_err(fn(p["x"], p["w"][0], p["s"][0], p["b"]), p["ref_b"]) for _ in range(2)]
        row["err"], row["err_bias"] = max(errs), max(errs_b)
        if counters is not None and int(counters.abs().sum()) != 0:
            counters.zero_()
            row["fail"] = "sem counters not reset to zero"
        elif not (row["err"] <= TOL and row["err_bias"] <= TOL):
            row["fail"] = f"rel err {row['err']:.2e} / bias {row['err_bias']:.2e} > {TOL}"
        else:
            row["us"] = gpu_time_us(rotate(fn, p))
    except Exception as e:  # compile failure (resources, bad PTX), launch error
        row["fail"] = f"{type(e).__name__}: {str(e)[:300]}"
        if counters is not None:
            counters.zero_()
    return row


# ---------------------------------------------------------------- compile warm-up in a process pool
WarmItem = tuple[
    str, Any, list[tuple[int, int, int]]
]  # (name, DecodeConfig or None for the current kernel, points)


def _warm_worker(item: WarmItem, dtype_name: str, dev: str) -> list[str]:
    """Compile one variant at its points by running it once with and without bias (so the specialization
    keys, and hence Triton's disk-cache entries, match the main process's calls); return the errors."""
    dtype = getattr(torch, dtype_name)
    name, cfg, pts = item
    errors = []
    for m, k, n in pts:
        try:
            x = torch.randn(m, k, device=dev).to(dtype)
            w = torch.randint(-128, 128, (n, k), device=dev, dtype=torch.int8)
            s = torch.rand(n, device=dev).to(dtype)
            b = torch.rand(n, device=dev).to(dtype)
            fn = current_fn(m, k, n)[1] if cfg is None else variant_fn(cfg, False, None)
            fn(x, w, s, None)
            fn(x, w, s, b)
            if dev == "cuda":
                torch.cuda.synchronize()
        except Exception as e:
            errors.append(f"{name} @ {(m, k, n)}: {type(e).__name__}: {str(e)[:200]}")
            break
    return errors


def warm_compile(todo: list[WarmItem], workers: int, deadline: float, dtype_name: str, dev: str) -> dict:
    """Fill Triton's disk cache in parallel, one task per variant (so the deadline can drop the rest);
    anything not compiled by then compiles later in-process."""
    if workers <= 0 or not todo:
        return {"skipped": True}
    t = time.time()
    info: dict[str, Any] = {"workers": workers, "errors": [], "done": 0, "tasks": len(todo)}
    ex = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))
    try:
        futs = [ex.submit(_warm_worker, item, dtype_name, dev) for item in todo]
        for f in cf.as_completed(futs, timeout=max(1.0, deadline - time.time())):
            info["errors"] += f.result()
            info["done"] += 1
    except Exception as e:  # timeout or a broken pool: carry on, compiles then happen in-process
        info["pool_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        procs = list(getattr(ex, "_processes", {}).values())  # private, but the only way not to wait for them
        ex.shutdown(wait=False, cancel_futures=True)
        for pr in procs:
            if pr.is_alive():
                pr.terminate()
    info["s"] = round(time.time() - t, 1)
    return info


def asm_preflight(dev: str, dtype: torch.dtype) -> str | None:
    """None when the inline-PTX int8 conversion (cvt=2) compiles and is exact here, else why not."""
    from qlower.lowerings.triton_kernels.woq_decode import DecodeConfig, woq_decode

    try:
        x = torch.zeros(1, 512, device=dev, dtype=dtype)
        x[0, :256] = 1.0
        w = torch.arange(-128, 128, device=dev, dtype=torch.int8).repeat(32, 2)  # [32, 512]
        w[:, 256:] = 7
        s = torch.ones(32, device=dev, dtype=dtype)
        out = woq_decode(DecodeConfig(False, 1, 16, 256, 4, cvt=2), x, w, s)
        if float(out.float().sum()) != -128.0 * 32:  # sum(-128..127) per row
            return f"wrong values: {out.float()[0, :4].tolist()}"
        return None
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:300]}"


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new work after this")
    ap.add_argument("--warm-s", type=float, default=75.0, help="time allowed to the parallel compile warm-up")
    ap.add_argument("--workers", type=int, default=-1, help="warm-up processes (-1: min(12, cpus - 2))")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, fp16, CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--only", default="", help="comma-separated substrings: run only matching variants")
    ap.add_argument("--top", type=int, default=3, help="variants per point re-timed in the confirm phase")
    args = ap.parse_args()
    out_dir = Path(os.environ.get("OUT", "./out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    deadline = T0 + args.budget_s
    smoke = args.smoke or not torch.cuda.is_available()
    dev = "cpu" if smoke else "cuda"
    dtype = torch.float16 if smoke else torch.bfloat16
    kns = SMOKE_KN if smoke else GPU_KN
    points = [(m, k, n) for k, n in kns for m in MS]
    import triton

    res: dict[str, Any] = {
        "env": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "gpu": torch.cuda.get_device_name() if not smoke else "cpu (interpreter)",
            "sms": torch.cuda.get_device_properties(0).multi_processor_count if not smoke else None,
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "dtype": str(dtype),
            "n_weights": N_WEIGHTS,
        },
        "points": [],
        "failures": [],
    }
    log(res["env"])
    vs = variants()
    if args.only:
        keys = args.only.split(",")
        vs = [v for v in vs if any(kk in v[0] for kk in keys)]
    res["variants"] = [{"name": nm, "cfg": asdict(c), "fresh_counters": fr, "ms": ms} for nm, c, fr, ms in vs]
    by_point: dict[tuple[int, int, int], dict[str, Any]] = {}
    try:
        # inline PTX conversion: if it does not build or is not exact, the same variants run with cvt 1
        asm_err = asm_preflight(dev, dtype) if not interpret() else "interpreter"
        res["asm_preflight"] = asm_err or "ok"
        if asm_err:
            log("cvt=2 (inline PTX) unavailable, using cvt=1 instead:", asm_err)
            vs = cvt2_to_cvt1(vs)
            res["variants"] = [
                {"name": nm, "cfg": asdict(c), "fresh_counters": fr, "ms": ms} for nm, c, fr, ms in vs
            ]
        # compile warm-up in parallel (GPU by default; --workers N on CPU tests the pool)
        workers = (
            args.workers
            if args.workers >= 0
            else (0 if smoke else max(1, min(12, (os.cpu_count() or 4) - 2)))
        )
        if workers:
            todo: list[WarmItem] = [(f"current {pt}", None, [pt]) for pt in points]
            todo += [(nm, c, [pt for pt in points if pt[0] in ms]) for nm, c, _, ms in vs]
            res["warm"] = warm_compile(todo, workers, min(deadline, T0 + args.warm_s), str(dtype)[6:], dev)
            log("warm-up:", {k: v for k, v in res["warm"].items() if k != "errors"},
                f"{len(res['warm'].get('errors', []))} compile errors")  # fmt: skip
        counters = torch.zeros(1 << 16, device=dev, dtype=torch.int32)
        weights: dict = {}
        probs = {pt: make_problem(*pt, dtype, dev, weights) for pt in points}
        # baselines
        for pt in points:
            p = probs[pt]
            row: dict[str, Any] = {"m": pt[0], "k": pt[1], "n": pt[2], "variants": {}}
            row["bf16_us"] = gpu_time_us(bf16_calls(p, dtype))
            name, fn = current_fn(*pt)
            row["current"] = {"config": name, **check_and_time(fn, p, None)}
            by_point[pt] = row
            res["points"].append(row)
            log(f"M={pt[0]:2d} {pt[1]}->{pt[2]}: bf16 {row['bf16_us']:.1f} us, current [{name}] "
                f"{row['current'].get('us', float('nan')):.1f} us {row['current'].get('fail', '')}")  # fmt: skip
        # variants
        for nm, cfg, fresh, ms in vs:
            if time.time() > deadline:
                log("deadline: skipping the remaining variants")
                res["stopped_at_variant"] = nm
                break
            fn = variant_fn(cfg, fresh, counters)
            cnt = counters if (cfg.reduce == "sem" and not fresh) else None
            cells = []
            for pt in points:
                if pt[0] not in ms:
                    continue
                r = check_and_time(fn, probs[pt], cnt)
                by_point[pt]["variants"][nm] = r
                if "fail" in r:
                    res["failures"].append({"variant": nm, "point": pt, "fail": r["fail"]})
                cells.append(f"{pt[0]}/{pt[1]}->{pt[2]} " + (f"{r['us']:.1f}" if "us" in r else "FAIL"))
            log(f"{nm}: " + ", ".join(cells))
        # confirm: top variants re-timed, interleaved with the baselines, 3 rounds
        for pt in points:
            if time.time() > deadline + 8.0:
                log("deadline: skipping the remaining confirm rounds")
                break
            row, p = by_point[pt], probs[pt]
            ranked = sorted(((r["us"], nm) for nm, r in row["variants"].items() if "us" in r))[: args.top]
            calls: dict[str, list[Callable[[], Any]]] = {}
            for nm, c, fr, _ in vs:
                if nm in [r[1] for r in ranked]:
                    calls[nm] = rotate(variant_fn(c, fr, counters), p)
            if "us" in row["current"]:
                calls["current"] = rotate(current_fn(*pt)[1], p)
            calls["bf16"] = bf16_calls(p, dtype)
            conf: dict[str, list[float]] = {nm: [] for nm in calls}
            for _ in range(3):
                for nm, cl in calls.items():
                    conf[nm].append(gpu_time_us(cl))
            del calls
            row["confirm"] = {nm: statistics.median(v) for nm, v in conf.items()}
    except Exception:
        res["error"] = traceback.format_exc()
        traceback.print_exc()
    finally:
        summarize(res)
        (out_dir / "woq_exp.json").write_text(json.dumps(res, indent=1, default=str))
        log(f"wrote {out_dir / 'woq_exp.json'}")


def summarize(res: dict[str, Any]) -> None:
    """Best variant per point: the confirm-phase medians where there are some, else the sweep's time."""
    lines = [
        "| M | K->N | bf16 us | current us | best variant | best us | vs bf16 | vs current | HBM floor/best |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["points"]:
        conf = row.get("confirm", {})
        bf16 = conf.get("bf16", row["bf16_us"])
        cur = conf.get("current", row["current"].get("us"))
        timed = {nm: conf.get(nm, r["us"]) for nm, r in row["variants"].items() if "us" in r}
        best = min(timed, key=timed.get) if timed else None
        row["best"] = {"variant": best, "us": timed.get(best), "bf16_us": bf16, "current_us": cur}
        floor = row["n"] * row["k"] / (HBM_TBS * 1e6)
        bus = timed.get(best)

        def f(v: float | None) -> str:
            return f"{v:.2f}" if isinstance(v, float) else "-"

        lines.append(
            f"| {row['m']} | {row['k']}->{row['n']} | {f(bf16)} | {f(cur)} | {best or '-'} | {f(bus)} | "
            f"{f(bf16 / bus if bus else None)}x | {f(cur / bus if (bus and cur) else None)}x | "
            f"{f(floor / bus if bus else None)} |"
        )
    res["summary"] = lines
    print("\n".join(lines), flush=True)
    if res["failures"]:
        print(f"{len(res['failures'])} variant failures, e.g.:", flush=True)
        for fl in res["failures"][:8]:
            print("  ", fl["variant"], fl["point"], fl["fail"][:160], flush=True)


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
