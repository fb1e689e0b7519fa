"""Decode-time MX weight-only kernels on one GPU: bf16 F.linear vs qlower's current MX kernel vs the
`mx_decode` candidates, side by side, in one run of at most ~3 minutes.

    python -m pip install -q --no-deps --no-build-isolation . && python -P scripts/gpu_exp_mx.py

Points: M in {1, 4, 16} x (K, N) in {(4096, 14336), (4096, 4096), (14336, 4096)}, MXFP4 and MXFP8 weights,
bf16 activations, plain [N, K/32] e8m0 scales (one swizzled-scale check per format at the end). Timing:
`gpu_time_us` (median over CUDA-graph replays of calls rotating over 8 weight sets, so weights stream from
HBM). Each variant's output on weight set 0 is checked against a float64 dequantized reference (rel err
<= 1e-2); failures are recorded, not fatal. Writes $OUT/mx_exp.json (OUT defaults to ./out) after every
point, and prints the best per point with its ratio to bf16 and to the current kernel.

Env: OUT; MX_EXP_FORMATS (default "mxfp4,mxfp8"); MX_EXP_MS (default "1,4,16"); MX_EXP_HFMA_SHAPES (a Python
list of `mx_hfma` shape tuples replacing the built-in ones); MX_EXP_BUDGET_S (default 160: no new timing after
that many seconds); MX_EXP_SMOKE=1 runs tiny shapes on CPU under TRITON_INTERPRET=1 (fp16 activations, BITS
decode only, wall-clock "timing") to check this script's plumbing without a GPU.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMOKE = os.environ.get("MX_EXP_SMOKE", "0") not in ("", "0")
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` leaves scripts/ off the path
from cuda_timing import gpu_time_us  # noqa: E402

T0 = time.time()
BUDGET_S = float(os.environ.get("MX_EXP_BUDGET_S", "160"))
OUT = Path(os.environ.get("OUT", "out"))
N_WEIGHTS = 2 if SMOKE else 8
DEV = "cpu" if SMOKE else "cuda"
ACT = torch.float16 if SMOKE else torch.bfloat16
SHAPES_KN = ((256, 96), (128, 64)) if SMOKE else ((4096, 14336), (4096, 4096), (14336, 4096))
MS = tuple(int(v) for v in os.environ.get("MX_EXP_MS", "1,4,16").split(","))
HBM_TBPS = 4.8  # H200 datasheet; the floor below is bytes / this
TOL = 1e-2


def log(*a: Any) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def out_of_time() -> bool:
    return time.time() - T0 > BUDGET_S


# ---------------------------------------------------------------- timing (from scripts/bench_cuda_kernels.py)
def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# ---------------------------------------------------------------- problems
FORMATS = {
    name: elem
    for name, elem in {"mxfp4": "e2m1", "mxfp8": "e4m3"}.items()
    if name in os.environ.get("MX_EXP_FORMATS", "mxfp4,mxfp8").split(",")
}


def random_codes(elem: str, n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MX weight bytes (every e2m1 code; every finite e4m3 code) and e8m0 codes near 2**-6."""
    if elem == "e2m1":
        q = torch.randint(0, 256, (n, k // 2), device=DEV, dtype=torch.uint8, generator=g)
    else:
        q = torch.randint(0, 256, (n, k), device=DEV, dtype=torch.uint8, generator=g)
        q = torch.where((q & 0x7F) == 0x7F, q ^ 1, q)  # no NaN (0x7F / 0xFF)
    e = torch.randint(118, 125, (n, k // 32), device=DEV, dtype=torch.uint8, generator=g)
    return q, e


def reference(x: torch.Tensor, q: torch.Tensor, e: torch.Tensor, elem: str) -> torch.Tensor:
    from qlower.patterns import mx_format as fmt

    qv = q if elem == "e2m1" else q.view(fmt.FP8_DTYPE[elem])
    return x.double() @ fmt.dequantize_f64(qv, e, elem).t()


def weight_bytes(elem: str, k: int, n: int) -> int:
    return (n * k // 2 if elem == "e2m1" else n * k) + n * k // 32


# ---------------------------------------------------------------- candidates
def candidates(fmt_name: str, m: int) -> list[Any]:
    """The sweep, strongest guesses first (the time budget may cut the tail)."""
    from qlower.lowerings.triton_kernels.mx_decode import BITS, CVT, F16BITS, DecodeConfig

    fp4 = fmt_name == "mxfp4"
    if os.environ.get("MX_EXP_HFMA", "1") != "0":  # the f16x2 GEMV (mx_hfma) against today's pick
        return hfma_candidates(m)
    if SMOKE:
        return [
            DecodeConfig("gemv", BITS, 16, 8, 4, 1, block_m=min(m, 4)),
            DecodeConfig("gemv", BITS, 8, 8, 4, 1, block_m=min(m, 4), split_k=2, prefetch=True),
            DecodeConfig("gemv", BITS, 16, 8, 4, 1, block_m=min(m, 2), prefetch=True),
            DecodeConfig("mm", BITS, 16, 8, 4, 1, block_m=16),
        ]
    decodes = (F16BITS, CVT, BITS) if fp4 else (CVT, BITS)
    kw_mm = 16 if fp4 else 32  # 128 elements per dot step
    # gemv rows per thread = block_n * block_kw / (128 * num_warps / 4 * 4): x loads amortize over rows.
    if m == 1:
        out = [
            DecodeConfig("gemv", d, bn, kw, 4, 1, prefetch=pf)
            for d in decodes
            for bn, kw, pf in ((32, 64, True), (16, 64, False), (64, 32, True))
        ]
        out += [DecodeConfig("gemv", d, 32, 64, 4, 1, split_k=2, prefetch=True) for d in decodes[:2]]
        out += [DecodeConfig("gemv", d, 32, 64, 8, 1, prefetch=True) for d in decodes[:2]]
        out += [DecodeConfig("gemv", decodes[0], 32, 64, 4, 1, prefetch=True, evict=False)]
        return out
    if m == 4:
        out = [
            DecodeConfig("gemv", d, bn, kw, 4, 1, block_m=4, prefetch=True)
            for d in decodes[:2]
            for bn, kw in ((16, 64), (32, 32))
        ]
        out += [DecodeConfig("mm", d, 64, kw_mm, 4, 3, block_m=16) for d in decodes[:2]]
        return out
    out = [
        DecodeConfig("mm", d, bn, kw_mm, w, 3, block_m=16)
        for d in decodes[:2]
        for bn, w in ((64, 4), (128, 8))
    ]
    out += [DecodeConfig("gemv", d, 16, 64, 4, 1, block_m=4, prefetch=True) for d in decodes[:2]]
    out += [DecodeConfig("gemv", decodes[0], 16, 32, 4, 1, block_m=8, prefetch=True)]
    return out


def hfma_candidates(m: int) -> list[Any]:
    """`mx_hfma` shapes per M: (block_m, block_n, block_kw, warps, prefetch, split_k, stages)."""
    from qlower.lowerings.triton_kernels.mx_decode import CVT, DecodeConfig

    if SMOKE:
        return [DecodeConfig("hfma", CVT, 16, 8, 4, 1, block_m=min(m, 2), prefetch=True)]
    F, T = False, True
    shapes = {
        1: [(1, 16, 128, 4, F, 1, 1), (1, 8, 256, 4, F, 1, 1), (1, 16, 256, 4, F, 1, 1), (1, 32, 128, 4, F, 1, 1),
            (1, 16, 128, 8, F, 1, 1), (1, 8, 128, 4, F, 1, 1), (1, 16, 128, 4, F, 2, 1), (1, 16, 128, 4, F, 1, 2),
            (1, 16, 128, 2, F, 1, 1), (1, 32, 128, 8, F, 1, 1), (1, 8, 256, 4, F, 2, 1), (1, 32, 64, 4, T, 2, 1),
            (1, 16, 64, 4, T, 2, 1)],
        2: [(2, 16, 128, 4, F, 1, 1), (2, 16, 64, 4, T, 1, 1), (2, 32, 64, 4, T, 2, 1), (2, 16, 128, 4, F, 2, 1),
            (2, 8, 128, 4, F, 1, 1), (2, 8, 256, 4, F, 1, 1)],
        4: [(4, 16, 128, 4, F, 1, 1), (4, 8, 128, 4, F, 1, 1), (4, 16, 64, 4, T, 1, 1), (4, 8, 256, 4, F, 1, 1),
            (4, 16, 128, 4, F, 2, 1), (2, 32, 64, 4, T, 2, 1), (4, 16, 64, 4, T, 2, 1)],
        16: [(4, 16, 128, 4, F, 1, 1), (4, 8, 128, 4, F, 1, 1), (4, 16, 128, 4, F, 2, 1), (4, 32, 64, 4, T, 1, 1)],
    }[m]  # fmt: skip
    if os.environ.get("MX_EXP_HFMA_SHAPES"):  # e.g. "[(1, 16, 128, 4, True, 1, 1)]": these shapes, at every M
        shapes = ast.literal_eval(os.environ["MX_EXP_HFMA_SHAPES"])
    return [
        DecodeConfig("hfma", CVT, bn, kw, w, st, block_m=bm, prefetch=pf, split_k=sk)
        for bm, bn, kw, w, pf, sk, st in shapes
    ]


# ---------------------------------------------------------------- one point
def run_point(fmt_name: str, m: int, k: int, n: int, x16: torch.Tensor, sets: list[dict[str, torch.Tensor]],
              ref16: torch.Tensor, results: dict[str, Any]) -> None:  # fmt: skip
    from qlower.lowerings.triton_kernels import mx_decode as D
    from qlower.lowerings.triton_kernels import mx_ops

    elem = FORMATS[fmt_name]
    wfmt = mx_ops.ELEM_CODE[elem]
    x = x16[:m]
    ref = ref16[:m]
    pt: dict[str, Any] = {"fmt": fmt_name, "m": m, "k": k, "n": n,
                          "hbm_floor_us": weight_bytes(elem, k, n) / (HBM_TBPS * 1e6), "variants": []}  # fmt: skip

    def timed(name: str, calls: list[Callable[[], torch.Tensor]], check: bool = True) -> dict[str, Any]:
        row: dict[str, Any] = {"config": name, "us": None, "rel_err": None, "ok": False, "error": None}
        if out_of_time():
            row["error"] = "skipped: time budget"
            results["skipped"].append(f"{fmt_name} M={m} {k}->{n} {name}")
            return row
        try:
            err = rel_err(calls[0](), ref) if check else 0.0
            row["rel_err"] = err
            row["ok"] = err <= TOL
            if row["ok"]:
                row["us"] = gpu_time_us(calls)
            else:
                results["failures"].append(f"{fmt_name} M={m} {k}->{n} {name}: rel err {err:.2e}")
        except Exception as ex:  # a config that does not compile / fit is recorded, not fatal
            row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            results["failures"].append(f"{fmt_name} M={m} {k}->{n} {name}: {row['error']}")
            if not SMOKE:
                traceback.print_exc(limit=2)
        return row

    pt["bf16"] = timed("bf16 F.linear", [(lambda s=s: F.linear(x, s["bf16"])) for s in sets], check=False)
    cur_cfg = mx_ops.pick_config(m, 0, wfmt)
    pt["current"] = timed(
        f"current {cur_cfg}",
        [(lambda s=s: mx_ops.launch_config(cur_cfg, x, None, s["q"], s["e"], None, 0, wfmt)) for s in sets],
    )
    picked = mx_ops.pick_decode(m, wfmt, k, n)
    if picked is not None:
        pt["picked"] = timed(
            f"picked {picked.short()}",
            [(lambda s=s: D.mx_decode_linear(picked, x, s["q"], s["e"], None, wfmt)) for s in sets],
        )
    for cfg in candidates(fmt_name, m):
        row = timed(
            cfg.short(),
            [(lambda s=s, c=cfg: D.mx_decode_linear(c, x, s["q"], s["e"], None, wfmt)) for s in sets],
        )
        row["repr"] = repr(cfg)
        pt["variants"].append(row)
    good = [r for r in pt["variants"] if r["us"] is not None]
    tb, tc = pt["bf16"]["us"], pt["current"]["us"]
    if good:
        best = min(good, key=lambda r: r["us"])
        pt["best"] = best
        pt["best_vs_bf16"] = tb / best["us"] if tb else None
        pt["best_vs_current"] = tc / best["us"] if tc else None
    else:
        pt["best"] = None
    results["points"].append(pt)
    b = pt["best"]
    log(f"{fmt_name} M={m:2d} {k}->{n}: bf16 {fmt_us(tb)}  current {fmt_us(tc)}  "
        f"picked {fmt_us(pt.get('picked', {}).get('us'))}  best "
        + (f"{b['us']:.1f} us [{b['config']}] = {fmt_x(pt['best_vs_bf16'])} bf16, "
           f"{fmt_x(pt['best_vs_current'])} current (floor {pt['hbm_floor_us']:.1f} us)" if b else "none")
        + "\n      " + ", ".join(f"{r['config']}: {fmt_us(r['us'])}" for r in pt["variants"]))  # fmt: skip


def fmt_us(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} us"


def fmt_x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def swizzle_check(fmt_name: str, results: dict[str, Any]) -> None:
    """The M=1 winner of the first shape with swizzled (128x4) scales and a bias: same answer?"""
    from qlower.lowerings.triton_kernels import mx_decode as D
    from qlower.lowerings.triton_kernels import mx_ops
    from qlower.patterns import mx_format as fmt

    pts = [p for p in results["points"] if p["fmt"] == fmt_name and p["m"] == 1 and p.get("best")]
    if not pts:
        return
    cfg = eval(pts[0]["best"]["repr"], {"DecodeConfig": D.DecodeConfig})  # our own repr
    elem = FORMATS[fmt_name]
    wfmt = mx_ops.ELEM_CODE[elem]
    k, n = (256, 96) if SMOKE else (4096, 4096 + 128 + 32)  # N not a multiple of 128: padded swizzle tiles
    g = torch.Generator(device=DEV).manual_seed(7)
    q, e = random_codes(elem, n, k, g)
    x = torch.randn(1, k, device=DEV, generator=g).to(ACT)
    bias = torch.randn(n, device=DEV, generator=g).to(ACT)
    ref = reference(x, q, e, elem) + bias.double()
    try:
        y = D.mx_decode_linear(cfg, x, q, fmt.to_swizzled(e), bias, wfmt, w_swizzled=True)
        err = rel_err(y, ref)
        row = {"fmt": fmt_name, "config": cfg.short(), "k": k, "n": n, "rel_err": err, "ok": err <= TOL}
    except Exception as ex:
        row = {"fmt": fmt_name, "config": cfg.short(), "error": f"{type(ex).__name__}: {str(ex)[:300]}",
               "ok": False}  # fmt: skip
    if not row["ok"]:
        results["failures"].append(f"swizzled {fmt_name} {cfg.short()}: {row}")
    results["swizzled"].append(row)
    log(f"swizzled+bias check {fmt_name} {cfg.short()}: {row}")


def write(results: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results["elapsed_s"] = time.time() - T0
    (OUT / "mx_exp.json").write_text(json.dumps(results, indent=1, default=str))


def summary(results: dict[str, Any]) -> None:
    print(
        "\n| fmt | M | K->N | bf16 us | current us | best us | vs bf16 | vs current | floor us | best config |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in results["points"]:
        b = p.get("best")
        print(f"| {p['fmt']} | {p['m']} | {p['k']}->{p['n']} | {fmt_us(p['bf16']['us'])} | "
              f"{fmt_us(p['current']['us'])} | {fmt_us(b['us'] if b else None)} | {fmt_x(p.get('best_vs_bf16'))} | "
              f"{fmt_x(p.get('best_vs_current'))} | {p['hbm_floor_us']:.1f} | {b['config'] if b else '-'} |")  # fmt: skip
    print(f"\nfailures ({len(results['failures'])}):")
    for f in results["failures"]:
        print("  -", f)
    if results["skipped"]:
        print(f"skipped for time: {len(results['skipped'])}")
    print(f"wrote {OUT / 'mx_exp.json'} in {time.time() - T0:.0f}s", flush=True)


def main() -> int:
    import triton

    import qlower  # noqa: F401

    results: dict[str, Any] = {
        "meta": {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter smoke)",
                 "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
                 "n_weights": N_WEIGHTS, "timing": "CUDA-graph replay median, rotating weight sets",
                 "tol": TOL, "hbm_tbps_for_floor": HBM_TBPS},  # fmt: skip
        "points": [], "failures": [], "skipped": [], "swizzled": [],
    }  # fmt: skip
    log(f"start: {results['meta']}")
    torch.manual_seed(0)
    with torch.no_grad():
        for k, n in SHAPES_KN:
            for fmt_name, elem in FORMATS.items():
                if out_of_time():
                    results["skipped"].append(f"{fmt_name} {k}->{n}: all M (time budget)")
                    continue
                g = torch.Generator(device=DEV).manual_seed(k * 31 + n)
                sets = []
                for _ in range(N_WEIGHTS):
                    q, e = random_codes(elem, n, k, g)
                    bf = (torch.randn(n, k, device=DEV, generator=g) * k**-0.5).to(ACT)
                    sets.append({"q": q, "e": e, "bf16": bf})
                x16 = torch.randn(16, k, device=DEV, generator=g).to(ACT)
                ref16 = reference(x16, sets[0]["q"], sets[0]["e"], elem)
                for m in MS:
                    run_point(fmt_name, m, k, n, x16, sets, ref16, results)
                    write(results)
                del sets, ref16
                if DEV == "cuda":
                    torch.cuda.empty_cache()
        for fmt_name in FORMATS:
            swizzle_check(fmt_name, results)
    write(results)
    summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
