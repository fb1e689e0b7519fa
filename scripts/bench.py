"""Benchmark one quantized-linear family side by side: bf16 F.linear, stock torch.compile, baselines, qlower.

    python -m scripts.bench --family woq_int8 --device cpu [--quick] [--shapes 1x64x64,16x64x64] [--out DIR]
                            [--dynamic]   (adds qlower compiled once with a symbolic M, next to the static compiles)

Writes <out>/<family>_<device>.md (the table), .json (every measurement) and .png (speedup vs M; needs
matplotlib, which the `test` and `bench` extras install: `pip install -e '.[test]'`; without it the plot is
skipped with one warning line). <out> is `bench-out/` in the current folder unless `--out` says otherwise: the
committed tables are refreshed on purpose, with `--out benchmarks`. `--replot <json>` rewrites the .md and .png
of an earlier run. Progress: one bar with an ETA on stderr when stderr is a terminal, else one line per shape.
Exits 1 if qlower left a candidate unlowered or a variant's output is not close to the eager quantized model.

Family modules: `scripts/bench_families/<family>.py` define
    FAMILY: str                        a key of qlower.FAMILIES (qlower is compiled with only this family)
    DTYPE: torch.dtype                 activation dtype
    GRID_M, GRID_KN                    the full grid: M values and (K, N) pairs; QUICK_M, QUICK_KN for --quick;
                                       optional GRID_M_CUDA: the M values of --device cuda (default GRID_M)
    make_weights(k, n, device, seed) -> dict[str, Tensor]
                                       one weight set; key "bf16" is the unquantized [N, K] weight
    quant_bytes(k, n) -> int           bytes a kernel must read for the quantized weight (the memory bound)
    VARIANTS: dict[str, (fn, mode)]    fn(x [1, M, K], weights) -> y [1, M, N]; mode None = eager,
                                       "stock" = torch.compile, "qlower" = torch.compile with qlower.
                                       Must hold "bf16" (the baseline), "stock" and "qlower"; the eager run of
                                       the "stock" fn is the reference every other variant is checked against.

Timing: each call uses the next of --rotate weight sets, so weights are not cache-resident (a real model's
layers are not). After a compile call and a warm-up call, variants are timed in ROUNDS interleaved rounds per
shape (fair under a changing load). CPU: median of all time.perf_counter runs. CUDA: median of the rounds'
CUDA-graph replay times (scripts/common/cuda_timing.py; do_bench for a variant that cannot be captured). Each
time comes with its spread over those repeats (`±`, qlower.timing: IQR / median); a WARNING line under the
header says when a spread passes 15 % or the load average passed the CPU count while timing.
Each compiled variant is compiled once per (M, K, N) with dynamic=False (the shape a static-M deployment sees).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench", *sys.argv[1:]])

import torch

import qlower
from qlower.timing import SPREAD_DEFINITION, LoadWatch, format_spread, stability_warning, summarize
from scripts.common.meta import DEFAULT_OUT, describe_device, versions
from scripts.common.progress import Progress

FAMILY_CHOICES = ("woq_int8", "dynamic_int8", "mx")
ROUNDS = int(os.environ.get("QLOWER_BENCH_ROUNDS", "5"))  # interleaved timing rounds per shape
REL_TOL = 2e-2  # max |y - ref| / max |ref| allowed against the eager quantized model (bf16 rounding)
# Nominal peak memory bandwidth (bytes/s) by GPU name; anything else is measured with a device copy.
GPU_PEAK_BW = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


@dataclass
class Result:
    m: int
    k: int
    n: int
    variant: str
    seconds: float  # median
    min_seconds: float = 0.0
    spread: float | None = None  # IQR / median of the timed runs (qlower.timing); None in older JSON
    rel_err: float | None = None  # vs the eager quantized model (None for the bf16 baseline)
    lowering: str | None = None  # qlower variant: chosen lowering(s), or "LEFT ALONE: <reason>"


def load_family(family: str) -> ModuleType:
    """The family module scripts/bench_families/<family>.py, imported when a run names it (mx's reads
    QLOWER_BENCH_MX at import)."""
    name = f"scripts.bench_families.{family}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        raise SystemExit(
            f"bench: no scripts/bench_families/{family}.py yet (see the interface at the top of bench.py)"
        ) from None


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'1x64x64,16x64x128' -> [(1, 64, 64), (16, 64, 128)] as (M, K, N)."""
    shapes = []
    for item in text.split(","):
        m, k, n = (int(v) for v in item.lower().split("x"))
        shapes.append((m, k, n))
    return shapes


def grid(
    mod: ModuleType, quick: bool, shapes: str | None, device: str = "cpu"
) -> dict[tuple[int, int], list[int]]:
    """(K, N) -> M values, in run order. On CUDA a family may list more M (`GRID_M_CUDA`: the compute-bound
    sizes a 2-core CPU cannot time in reasonable time)."""
    if shapes:
        out: dict[tuple[int, int], list[int]] = {}
        for m, k, n in parse_shapes(shapes):
            out.setdefault((k, n), []).append(m)
        return out
    full_m = getattr(mod, "GRID_M_CUDA", mod.GRID_M) if device == "cuda" else mod.GRID_M
    ms, kns = (mod.QUICK_M, mod.QUICK_KN) if quick else (full_m, mod.GRID_KN)
    return {kn: list(ms) for kn in kns}


def progress(total: int, desc: str) -> Progress:
    return Progress(total, desc)


def compiled(fn: Callable, mode: str | None, family: str) -> Callable:
    if mode is None:
        return fn
    if mode == "stock":
        return torch.compile(fn, dynamic=False)
    if mode == "qlower":
        return torch.compile(fn, dynamic=False, options=qlower.inductor_options(families=(family,)))
    if mode == "qlower_dynamic":  # one compile for every M > 1 (M = 1 specializes, as in any model)
        cf = torch.compile(fn, options=qlower.inductor_options(families=(family,)))

        def call(x: torch.Tensor, weights: Any) -> Any:
            xv = x.view(x.shape)  # the mark stays on this view, not on the tensor the static variants see
            if xv.shape[1] > 1:
                torch._dynamo.mark_dynamic(xv, 1)
            return cf(xv, weights)

        return call
    raise ValueError(f"bench: unknown variant mode {mode!r}")


def with_dynamic_variant(mod: ModuleType) -> Any:
    """The family module with one more variant, "qlower_dynamic": qlower compiled once per (K, N) with a
    symbolic M (what automatic dynamic shapes, `dynamic=True` and export `Dim`s give), reused at every M."""
    ns = SimpleNamespace(**vars(mod))
    ns.VARIANTS = {**mod.VARIANTS, "qlower_dynamic": (mod.VARIANTS["qlower"][0], "qlower_dynamic")}
    return ns


def time_cpu(
    call: Callable[[int], object], budget_s: float, min_runs: int = 1, max_runs: int = 50
) -> list[float]:
    """Seconds of call(i), i = 1, 2, ...: at least `min_runs` runs, then until `budget_s` or `max_runs`."""
    times: list[float] = []
    start = time.perf_counter()
    for i in itertools.count(1):
        if len(times) >= min_runs and (len(times) >= max_runs or time.perf_counter() - start > budget_s):
            break
        t0 = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - t0)
    return times


def time_cuda(call: Callable[[int], object], budget_s: float, rotate: int) -> list[float]:
    """Seconds per call from CUDA-graph replays of one call per weight set (`cuda_timing.gpu_time_us`, the
    method of every other GPU number in BENCHMARKS.md: no host launch overhead, weights from HBM). A variant
    that cannot be captured in a CUDA graph falls back to triton.testing.do_bench's median."""
    from scripts.common.cuda_timing import gpu_time_us

    try:
        return [gpu_time_us([lambda i=i: call(i) for i in range(rotate)]) / 1e6]
    except Exception as e:  # e.g. a host synchronisation inside the variant
        print(f"bench: CUDA-graph timing failed ({type(e).__name__}: {e}); using do_bench", file=sys.stderr)
        torch.cuda.synchronize()
    import triton.testing

    counter = itertools.count()
    ms = triton.testing.do_bench(
        lambda: call(next(counter)), warmup=25, rep=max(20, int(budget_s * 1e3)), return_mode="median"
    )
    return [ms / 1e3]


def memory_bandwidth(device: str) -> tuple[float, str]:
    """Bytes/s for the memory bound, and where the number comes from."""
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        for key, bw in GPU_PEAK_BW.items():
            if key in name:
                return bw, f"{key} spec sheet"
    src = torch.ones(64 * 2**20, dtype=torch.float32, device=device)  # 256 MiB, read once per sum
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(7):
        sync()
        t0 = time.perf_counter()
        src.sum()
        sync()
        times.append(time.perf_counter() - t0)
    bandwidth = src.nbytes / statistics.median(times)
    return bandwidth, f"measured (sum over 256 MiB, {torch.get_num_threads()} threads)"


def lowering_summary() -> tuple[str, bool]:
    """What qlower did in the compile that just ran: (summary, every candidate lowered)."""
    reports = qlower.all_reports()
    if not reports:
        return "no qlower report (compile cache hit?)", True
    entries = [d for rep in reports for d in rep]
    if not entries:
        return "LEFT ALONE: no candidate found", False
    left = [d for d in entries if not d.lowered]
    if left:
        return "LEFT ALONE: " + "; ".join(sorted({d.reason or "?" for d in left})), False
    return ", ".join(sorted({d.lowering for d in entries if d.lowering})), True


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-12)).item()


def run_kn(
    mod: ModuleType,
    device: str,
    k: int,
    n: int,
    ms: list[int],
    rotate: int,
    budget_s: float,
    bar: Any,
    watch: LoadWatch | None = None,
) -> tuple[list[Result], list[str]]:
    """Every variant at (M, k, n) for each M in `ms`, sharing one set of weights and compiled callables.

    Per shape, each variant is first compiled and checked, then timed in ROUNDS interleaved rounds so that
    load changes on a shared machine hit all variants alike; the time is the median over all rounds' runs.
    """
    timer = functools.partial(time_cuda, rotate=rotate) if device.startswith("cuda") else time_cpu
    sets = [mod.make_weights(k, n, device, seed) for seed in range(rotate)]
    fns = {name: compiled(fn, mode, mod.FAMILY) for name, (fn, mode) in mod.VARIANTS.items()}
    ref_fn = mod.VARIANTS["stock"][0]
    results: list[Result] = []
    failures: list[str] = []
    for m in ms:
        x = torch.randn(1, m, k, device=device, dtype=mod.DTYPE)  # batch 1, sequence M: as a model calls it
        ref = ref_fn(x, sets[0])
        row: dict[str, Result] = {}
        for name, (_, mode) in mod.VARIANTS.items():
            bar.set_postfix_str(f"M={m} K={k} N={n} {name} (compile, check)")
            qlower.clear_reports()
            y = fns[name](x, sets[0])  # compiles the compiled variants for this shape
            fns[name](x, sets[1 % rotate])  # warm-up
            res = row[name] = Result(m, k, n, name, 0.0)
            if mode in ("qlower", "qlower_dynamic"):
                res.lowering, ok = lowering_summary()
                if not ok:
                    failures.append(f"M={m} K={k} N={n}: qlower {res.lowering}")
            if name != "bf16":
                res.rel_err = rel_error(y, ref)
                if res.rel_err > REL_TOL:
                    failures.append(f"M={m} K={k} N={n}: {name} rel err {res.rel_err:.3g} > {REL_TOL}")
        samples: dict[str, list[float]] = {name: [] for name in row}
        for r in range(ROUNDS):
            for name, fn in fns.items():
                bar.set_postfix_str(f"M={m} K={k} N={n} {name} (round {r + 1}/{ROUNDS})")
                samples[name] += timer(lambda i, fn=fn, x=x: fn(x, sets[i % rotate]), budget_s / ROUNDS)
        if watch is not None:
            watch.sample()
        for name, res in row.items():
            timing = summarize(samples[name])
            res.seconds, res.spread = timing.median, timing.spread
            res.min_seconds = min(samples[name])
            results.append(res)
        bar.set_postfix_str(f"M={m} K={k} N={n} done")
        bar.update(1)
    return results, failures


def run(
    mod: ModuleType,
    device: str,
    plan: dict[tuple[int, int], list[int]],
    rotate: int,
    budget_s: float,
    checkpoint: Callable[[list[Result]], None] | None = None,
    watch: LoadWatch | None = None,
) -> tuple[list[Result], list[str]]:
    """Every variant at every shape of `plan`; returns results and failure messages. `checkpoint` gets the
    results so far after each (K, N), so a run cut short (a time limit) still leaves its finished tables.
    `watch` samples the load average after each shape's timing."""
    results: list[Result] = []
    failures: list[str] = []
    bar = progress(sum(len(ms) for ms in plan.values()), f"bench {mod.FAMILY} {device}")
    for (k, n), ms in plan.items():
        res, fail = run_kn(mod, device, k, n, ms, rotate, budget_s, bar, watch)
        results += res
        failures += fail
        torch._dynamo.reset()  # free the compiled code of this (K, N)
        if checkpoint is not None:
            checkpoint(results)
    bar.close()
    return results, failures


def _fmt_time(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _fmt_result(r: Result) -> str:
    """The median and, when measured, its spread: `1.23 ms ±4%`."""
    return _fmt_time(r.seconds) + ("" if r.spread is None else " " + format_spread(r.spread))


def timing_warning(results: list[Result], watch: LoadWatch | None) -> str | None:
    """bench's WARNING line (qlower.timing.stability_warning) over every measured time."""
    spreads = {f"{r.variant} {r.m}x{r.k}x{r.n}": r.spread for r in results if r.spread is not None}
    return stability_warning(spreads, watch.peak if watch is not None else None)


def table(results: list[Result], mod: ModuleType, bandwidth: float) -> str:
    """Markdown: one row per shape; each variant's time (and speedup vs bf16), then qlower's ratios."""
    names = list(mod.VARIANTS)
    by_shape: dict[tuple[int, int, int], dict[str, Result]] = {}
    for r in results:
        by_shape.setdefault((r.m, r.k, r.n), {})[r.variant] = r
    alts = [v for v in names if v not in ("bf16", "qlower", "qlower_dynamic")]
    dyn = "qlower_dynamic" in names
    head = [
        "M",
        "K→N",
        *names,
        "qlower lowering",
        "qlower vs bf16",
        "vs stock",
        "vs best of " + "/".join(alts),
        "bound",
        *(["dynamic M vs static"] if dyn else []),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (m, k, n), row in sorted(by_shape.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        t = {v: row[v].seconds for v in names if v in row}
        cells = [str(m), f"{k}→{n}"]
        for v in names:
            if v not in t:
                cells.append("—")
            elif v == "bf16":
                cells.append(_fmt_result(row[v]))
            else:
                cells.append(f"{_fmt_result(row[v])} ({t['bf16'] / t[v]:.2f}×)")
        q = t["qlower"]
        bound_s = mod.quant_bytes(k, n) / bandwidth
        best_alt = min(t[v] for v in alts if v in t)
        cells += [
            row["qlower"].lowering or "",
            f"{t['bf16'] / q:.2f}×",
            f"{t['stock'] / q:.2f}×",
            f"{best_alt / q:.2f}×",
            f"{100 * bound_s / q:.0f}%",
        ]
        if dyn:
            cells.append(f"{q / t['qlower_dynamic']:.2f}×" if "qlower_dynamic" in t else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: list[Result], title: str, path: Path) -> Path | None:
    """PNG of speedup vs bf16 F.linear against M, one panel per (K, N), one line per variant."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print(
            "bench: matplotlib is not installed (pip install -e '.[test]'): skipping the plot",
            file=sys.stderr,
        )
        return None
    bf16 = {(r.m, r.k, r.n): r.seconds for r in results if r.variant == "bf16"}
    kns = sorted({(r.k, r.n) for r in results})
    variants = list(dict.fromkeys(r.variant for r in results if r.variant != "bf16"))
    fig, axes = plt.subplots(1, len(kns), figsize=(5.5 * len(kns), 4.2), squeeze=False)
    for ax, (k, n) in zip(axes[0], kns, strict=True):
        for v in variants:
            pts = sorted(
                (r.m, bf16[(r.m, k, n)] / r.seconds) for r in results if (r.k, r.n, r.variant) == (k, n, v)
            )
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ms = sorted({r.m for r in results if (r.k, r.n) == (k, n)})
        ax.axhline(1.0, color="gray", linestyle="--", label="bf16 F.linear")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_yscale("log")
        ax.set_xlabel("M")
        ax.set_ylabel("speedup vs bf16 F.linear")
        ax.set_title(f"K={k}, N={n}")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=FAMILY_CHOICES)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--quick", action="store_true", help="the family's small grid and shorter timing")
    p.add_argument("--shapes", help="explicit MxKxN list, e.g. 1x64x64,16x64x64 (overrides the grid)")
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"folder for the .md, .json and .png (default: ./{DEFAULT_OUT}; the committed tables: benchmarks)",
    )
    p.add_argument(
        "--rotate", type=int, default=None, help="weight sets cycled through (default: cuda 8, cpu 4)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU; default: torch's)")
    p.add_argument(
        "--dynamic", action="store_true", help="also qlower compiled once with a symbolic M (qlower_dynamic)"
    )
    p.add_argument("--budget", type=float, default=None, help="seconds of timed runs per measurement")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="memory bandwidth for the bound, GB/s")
    p.add_argument(
        "--replot", metavar="JSON", help="no measuring: rewrite .md/.png from an earlier run's .json"
    )
    return p.parse_args(list(argv) if argv is not None else None)


def write(
    out: Path,
    device: str,
    mod: ModuleType,
    meta: dict[str, Any],
    results: list[Result],
    with_plot: bool = True,
) -> str:
    """The .md, .json and .png of one run under `out`; returns the table text (its WARNING line, if any, under
    the header)."""
    header = " · ".join(f"{k} {v}" for k, v in meta.items() if k != "warning")
    warning = f"\n\n{meta['warning']}" if meta.get("warning") else ""
    text = f"{header}{warning}\n\n{table(results, mod, meta['bandwidth_GBps'] * 1e9)}"
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{mod.FAMILY}_{device}"
    stem.with_suffix(".md").write_text(text + "\n")
    stem.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, indent=1) + "\n"
    )
    title = f"{mod.FAMILY} · {meta['device']} · torch {meta['torch']} · {meta['date']}"
    png = plot(results, title, stem.with_suffix(".png")) if with_plot else None
    return text + f"\n\nwrote {stem}.md, {stem}.json" + (f", {png}" if png else "")


def measure(args: argparse.Namespace, mod: ModuleType) -> tuple[dict[str, Any], list[Result], list[str]]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench: --device cuda but CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    # One compile per (M, K, N) and variant, and the frozen variants compile one module per weight set: they
    # share one forward, so 2 variants x 8 sets x 5 M reach 80 entries. At dynamo's default limit (64; as this
    # script had it before) the 5th M of the CUDA grid silently ran eager (seen in the first H200 run).
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    # A cache hit skips Inductor's passes (qlower's too), leaving no report of what was chosen: compile fresh.
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    rotate = args.rotate or (8 if args.device == "cuda" else 4)
    budget = args.budget if args.budget is not None else (0.2 if args.quick or args.shapes else 1.0)
    if args.bandwidth_gbs:
        bandwidth, bw_source = args.bandwidth_gbs * 1e9, "given (--bandwidth-gbs)"
    else:
        bandwidth, bw_source = memory_bandwidth(args.device)
    start = time.perf_counter()
    watch = LoadWatch()

    def meta_now(results: list[Result], partial: bool) -> dict[str, Any]:
        return {
            "family": mod.FAMILY,
            "device": describe_device(args.device),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **versions(),
            "rotate": rotate,
            "bandwidth_GBps": round(bandwidth / 1e9, 1),
            "bandwidth_source": bw_source,
            "timing": (
                "CUDA-graph replay median (cuda_timing.py)"
                if args.device == "cuda"
                else "median of perf_counter runs"
            )
            + f", {SPREAD_DEFINITION}",
            "wall_s": round(time.perf_counter() - start, 1),
            **({"partial": "yes (the run stopped before the whole grid)"} if partial else {}),
            "warning": timing_warning(results, watch),
        }

    def checkpoint(results: list[Result]) -> None:
        write(Path(args.out), args.device, mod, meta_now(results, partial=True), results, with_plot=False)

    with torch.no_grad():
        plan = grid(mod, args.quick, args.shapes, args.device)
        results, failures = run(mod, args.device, plan, rotate, budget, checkpoint, watch)
    return meta_now(results, partial=False), results, failures


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    mod = load_family(args.family)
    if args.dynamic:
        mod = with_dynamic_variant(mod)
    if args.replot:  # redraw the table and plot of an earlier run, e.g. after editing the plot code
        data = json.loads(Path(args.replot).read_text())
        meta, results, failures = data["meta"], [Result(**r) for r in data["results"]], []
    else:
        meta, results, failures = measure(args, mod)
    print("\n" + write(Path(args.out), args.device, mod, meta, results))
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
