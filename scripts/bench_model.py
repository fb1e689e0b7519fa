"""Whole-decoder benchmark: a Llama-style decoder quantized several ways, bf16 compiled as the baseline.

    python -m scripts.bench_model --device cuda [--layers 4] [--variants default] [--out DIR]
    python -m scripts.bench_model --device cpu              # --small: every variant in a few minutes
    torchrun --nproc-per-node 2 -m scripts.bench_model --device cuda --tp 2

Why: qlower picks kernels per linear for a static M; users run whole models whose batch or length changes.
This times whole decoder steps the way they run them.

The model: `--layers` blocks of Llama-3-8B shape by default (dim 4096, 32 heads, 8 kv heads, fused qkv
4096->6144, o 4096->4096, fused gate/up 4096->28672, down 14336->4096; RMSNorm, RoPE, SDPA against a KV
cache), random weights, fed hidden states (no embedding or lm_head). `--small` (automatic on CPU): dim 512,
8 heads, 2 kv heads, hidden 1792, and a run that checks and times every variant in a few minutes on 2 CPU
cores (SMALL_RUN: 1 layer, decode batches 1 and 16 against a cache of 256, prefill 128, 0.5 s of steps per
row); `--dim`, `--layers`, `--batches`, `--shapes` etc. override one setting.
The model, its variants and the tables are scripts/decoder/ (model.py, variants.py, tables.py).
Variants (`--variants`, comma list, `default` or `all`): `<quantization>:<compiler>` with the compiler `stock`
(torch.compile) or `qlower` (torch.compile with `qlower.inductor_options()`); `bf16` is stock-compiled bf16.
  woq     gpt-fast's weight-only int8 formula `F.linear(x, w_int8.to(x.dtype)) * s` (qlower.quantize)
  dyn     hand-written dynamic int8 (per-token activation quantize, `torch._int_mm`; qlower.quantize)
  ao-woq  torchao Int8WeightOnlyConfig           ao-dyn  torchao Int8DynamicActivationInt8WeightConfig
  mxfp4 / mxfp8  weight-only MX, hand-written dequant (e2m1 codes two per byte / e4m3, e8m0 scale per 32,
          `F.linear(x, w_dequant)`; qlower.quantize.mx_format)
Workloads: decode of 1 new token at each of `--batches` against a KV cache of `--cache` tokens, and prefill of
`--prefill` tokens. Shape modes (`--shapes`): `static` (a fresh compile per workload, torch._dynamo.reset()
between), `changing` (one compiled model through the batches in the order given, so Dynamo recompiles with a
symbolic batch, as a serving loop does; prefill after a prefill of half the length), `dynamic`
(torch.compile(dynamic=True)). `--cudagraphs on,off` (CUDA): on is `mode="reduce-overhead"`, for qlower through
`qlower.inductor_options(mode="reduce-overhead")`. `--cpp-wrapper` (with `--cudagraphs off`): every variant
compiled with Inductor's C++ wrapper, which launches kernels from C++ (default mode's host cost).
`--kernel-split` (CUDA): after timing, each row profiles 10 more steps and splits their GPU time per step into
matmul kernels (cuBLAS's, Inductor's GEMM templates and qlower's Triton kernels) and everything else (attention,
norms, RoPE, casts, and a dequantize Inductor fuses on its own); the HBM bound of the weight bytes is then
also given against the matmul time alone, which says how much of a step the weight format can still win.

Timing: after the compile call and `--warmup` calls, `--reps` steps (at least 20 on CUDA). CUDA with graphs:
median of CUDA-event times per step; without graphs and on CPU: median wall clock per step (CUDA synchronized
before and after each step). Each time comes with its spread over the steps (`±`, qlower.timing: IQR /
median); a WARNING line under the header says when a spread passes 15 % or the load average passed the CPU
count while timing. Every row checks the compiled output against the same model in eager
(REL_TOL). Rows: time per step, tokens/s, ratio to bf16 of the same workload, mode and graphs setting, the
variant's HBM bound as a fraction of the step (its weight bytes / `--hbm-tbps`, CUDA only), and qlower's
report summary (linears lowered, kernels). A failure or a linear left alone goes in the note column; exit
status 1 then.
Writes model_<device>[_tp<N>].md / .json / .png to `--out` (default: `bench-out/` in the current folder, as
scripts/bench.py; the committed tables are refreshed on purpose with `--out benchmarks`), and rewrites the .md /
.json after each variant, so a run cut short keeps its finished rows. `--replot JSON` rewrites the .md and
.png. Compiles per variant and graphs setting: one per static workload, plus one per new shape in changing /
dynamic mode; on a machine with a time limit, run subsets (`--variants`, `--shapes`, `--cudagraphs`,
`--batches`).

Compile time: each row that compiled gives the wall seconds of its compiling call ("compile s": Dynamo, Inductor,
Triton and the first run), next to its step time. Caches on disk serve a repeat run unless `--cold`, which gives
the run fresh, empty Inductor and Triton cache folders and turns Inductor's caches off.

`--tp N`: under `torchrun --nproc-per-node N`, each rank holds a gpt-fast-style shard (column-parallel qkv and
gate/up with their per-channel scales sliced, row-parallel o and down with full scales, outputs summed with
torch.distributed._functional_collectives.all_reduce); rank 0 reports. Without torchrun, `--tp 1` runs the same
code in a world of 1. torchao variants are sharded before quantizing (their weights are tensor subclasses), so
their row-parallel shards carry per-shard scales.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import functools
import importlib
import io
import json
import os
import pkgutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_model", *sys.argv[1:]])

import torch
from torch import nn

import qlower
from qlower.timing import SPREAD_DEFINITION, LoadWatch, summarize
from scripts.common.meta import DEFAULT_OUT, describe_device, versions
from scripts.common.progress import Progress
from scripts.decoder.model import DTYPE, FULL, SMALL, TP, build_base
from scripts.decoder.tables import Row, combo_name, fill_ratios, renamed_keys, timing_warning, write
from scripts.decoder.variants import (
    ALL_VARIANTS,
    build_variant,
    parse_variants,
    split_variant,
    tp_world,
    weight_bytes,
)

REL_TOL = 5e-2  # max |y - eager| / max |eager| of a compiled step against the same model in eager


# Defaults of the flags left unset. --small checks and times every variant in a few minutes on 2 CPU cores
# (`time python -m scripts.bench_model --small`); the full run is the H200 tables' method.
SMALL_RUN: dict[str, Any] = {
    "layers": 1,
    "batches": [1, 16],
    "cache": 256,
    "prefill": 128,
    "shapes": ["static", "changing"],
    "budget": 0.5,
}
FULL_RUN: dict[str, Any] = {
    "layers": 4,
    "batches": [1, 4, 16, 64],
    "cache": 1024,
    "prefill": 2048,
    "shapes": ["static", "changing"],
    "budget": 1.0,
}


# ---- workloads, timing, one row ----


@dataclass(frozen=True)
class Workload:
    name: str
    batch: int
    tokens: int  # new tokens per sequence in one step
    start: int  # position of the first new token


def workloads(batches: list[int], cache: int, prefill: int) -> list[Workload]:
    out = [Workload(f"decode b{b}", b, 1, cache) for b in batches]
    return out + ([Workload(f"prefill {prefill}", 1, prefill, 0)] if prefill else [])


def qlower_summary(reports: list[Any]) -> tuple[int, int, str, list[str]]:
    """(lowered, candidates, 'kernel×count, ...', reasons of those left alone) over `reports`."""
    entries = [d for rep in reports for d in rep]
    kernels = Counter(d.lowering for d in entries if d.lowered)
    reasons = sorted({d.reason or "?" for d in entries if not d.lowered})
    text = ", ".join(f"{k}×{n}" for k, n in sorted(kernels.items()))
    return sum(kernels.values()), len(entries), text, reasons


def compile_model(
    model: nn.Module, compiler: str, mode: str, cudagraphs: bool, cpp_wrapper: bool = False
) -> Callable:
    """`cpp_wrapper`: Inductor's C++ wrapper (kernels launched from C++, not Python), for every variant."""
    dynamic = {"static": False, "changing": None, "dynamic": True}[mode]
    extra = {"cpp_wrapper": True} if cpp_wrapper else {}
    if compiler == "qlower":
        opts = {**qlower.inductor_options(mode="reduce-overhead" if cudagraphs else None), **extra}
        return torch.compile(model, dynamic=dynamic, options=opts)
    if extra:  # torch.compile takes mode or options, not both
        return torch.compile(model, dynamic=dynamic, options=extra)
    return torch.compile(model, dynamic=dynamic, mode="reduce-overhead" if cudagraphs else None)


def time_steps(
    step: Callable[[], Any], device: str, cudagraphs: bool, reps: int, budget_s: float
) -> list[float]:
    """Seconds per step: CUDA graphs, CUDA-event time of each step; else wall clock around each step (CUDA
    synchronized). At least `reps` steps; on CPU more while under `budget_s`."""
    cuda = device.startswith("cuda")
    if cuda and cudagraphs:
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)
        ]
        for e0, e1 in events:
            torch.compiler.cudagraph_mark_step_begin()
            e0.record()
            step()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) / 1e3 for e0, e1 in events]
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps or (not cuda and time.perf_counter() - start < budget_s and len(times) < 200):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


_CUBLAS_MATMUL = ("nvjet", "gemm", "splitKreduce", "cutlass", "xmma", "triton_tem_")


@functools.cache
def qlower_kernel_names() -> frozenset[str]:
    """Names of qlower's Triton kernels (the `triton.jit` functions under lowerings/kernels/triton, its family
    folders included), as a profiler names their launches. Imports Triton."""
    import triton

    from qlower.lowerings.kernels import triton as qtriton

    names = set()
    for info in pkgutil.walk_packages(qtriton.__path__, prefix=f"{qtriton.__name__}."):  # int8/, mx/ too
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            while not isinstance(obj, triton.JITFunction) and hasattr(obj, "fn"):  # autotuned, heuristics
                obj = obj.fn
            if isinstance(obj, triton.JITFunction):
                names.add(obj.__name__)
    return frozenset(names)


def is_matmul_kernel(name: str) -> bool:
    return name in qlower_kernel_names() or any(tag in name for tag in _CUBLAS_MATMUL)


def kernel_split(step: Callable[[], Any], cudagraphs: bool, steps: int = 10) -> tuple[float, float]:
    """(matmul, other) GPU seconds per step over `steps` profiled steps (`is_matmul_kernel` decides)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if cudagraphs:
                torch.compiler.cudagraph_mark_step_begin()
            step()
        torch.cuda.synchronize()
    split = [0.0, 0.0]
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            split[0 if is_matmul_kernel(ev.name) else 1] += ev.device_time_total * 1e-6 / steps
    return split[0], split[1]


def rel_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-12)).item()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def _counter(group: str, name: str | None = None) -> int:
    """A Dynamo / Inductor counter; without `name`, the sum of the group (graph breaks: one per reason)."""
    counts = torch._dynamo.utils.counters[group]
    return int(counts[name] if name else sum(counts.values()))


def run_row(
    model: nn.Module,
    fn: Callable,
    row: Row,
    wl: Workload,
    args: argparse.Namespace,
    device: str,
    prev: Row | None,
) -> None:
    """Compile (or reuse) `fn` for `wl`, check it against eager, time it, and fill `row`."""
    g = torch.Generator(device=device).manual_seed(wl.batch * 7919 + wl.tokens)
    x = torch.randn(wl.batch, wl.tokens, model.cfg.dim, generator=g, device=device, dtype=DTYPE)
    graphs0, skips0 = _counter("stats", "unique_graphs"), _counter("inductor", "cudagraph_skips")
    breaks0 = _counter("graph_break")
    qlower.clear_reports()
    ref = model(x, wl.start)  # eager, the same weights and cache
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    y = fn(x, wl.start)  # compiles, or recompiles, for this shape
    sync()
    first_call_s = time.perf_counter() - t0
    row.rel_err = rel_error(y, ref)
    del y, ref
    for _ in range(args.warmup):  # cudagraph trees: a warm-up run, then the recording
        if row.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        fn(x, wl.start)
    row.graphs_compiled = _counter("stats", "unique_graphs") - graphs0
    row.compile_s = first_call_s if row.graphs_compiled else None
    row.graph_of = wl.name if row.graphs_compiled or prev is None else prev.graph_of
    notes = []
    if split_variant(row.variant)[1] == "qlower":
        reports = qlower.all_reports()
        if reports:
            row.lowered, row.linears, row.kernels, row.reasons = qlower_summary(reports)
        elif prev is not None and prev.linears is not None:  # served by the graph an earlier batch compiled
            row.lowered, row.linears, row.kernels, row.reasons = (
                prev.lowered,
                prev.linears,
                prev.kernels,
                prev.reasons,
            )
            notes.append(f"no recompile (graph of {row.graph_of})")
        else:
            notes.append("no qlower report")
        if row.linears is not None and row.lowered < row.linears:
            short = sorted({d.short_reason for rep in qlower.all_reports() for d in rep if not d.lowered})
            notes.append(f"{row.linears - row.lowered} left alone: {'; '.join(short or row.reasons)}")
    times = time_steps(lambda: fn(x, wl.start), device, row.cudagraphs, args.reps, args.budget)
    breaks = _counter("graph_break") - breaks0
    if breaks:  # part of the step ran eager: not the compiled model's time
        notes.append(f"graph breaks ×{breaks} (TORCH_LOGS=graph_breaks)")
    skips = _counter("inductor", "cudagraph_skips") - skips0
    if skips:
        notes.append(f"cudagraphs skipped ×{skips}")
    if row.rel_err > REL_TOL:
        notes.append(f"rel err {row.rel_err:.3g} > {REL_TOL}")
    timing = summarize(times)
    row.seconds, row.spread, row.min_seconds, row.reps = timing.median, timing.spread, min(times), len(times)
    row.tokens_per_s = wl.batch * wl.tokens / row.seconds
    if device.startswith("cuda"):
        row.hbm_bound = row.weight_bytes / (args.hbm_tbps * 1e12) / row.seconds
        if args.kernel_split:
            row.gpu_matmul_s, row.gpu_other_s = kernel_split(lambda: fn(x, wl.start), row.cudagraphs)
    row.note = "; ".join(notes)


def sequences(wls: list[Workload], mode: str, prefill: int) -> list[tuple[list[Workload], Workload | None]]:
    """Groups of workloads that share one compiled model, each with an optional unmeasured first call:
    static, one workload per group; changing / dynamic, the decode batches in order, then prefill (changing:
    after a prefill of half the length)."""
    if mode == "static":
        return [([w], None) for w in wls]
    decode = [w for w in wls if w.tokens == 1]
    pre = [w for w in wls if w.tokens > 1]
    warm = Workload(f"prefill {prefill // 2}", 1, prefill // 2, 0) if mode == "changing" and pre else None
    return [g for g in ((decode, None), (pre, warm)) if g[0]]


Checkpoint = Callable[[dict[str, Any], list[Row]], None]


def measure(args: argparse.Namespace, checkpoint: Checkpoint) -> tuple[dict[str, Any], list[Row]]:
    """Every row of the run. `checkpoint(meta, rows)` gets the rows so far after each variant (rank 0), so a
    run cut short (a time limit) still leaves its finished tables."""
    threads = torch.get_num_threads()
    with (
        tp_world(args.tp, args.device) as (tp, device),
        torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=4096),
        # A cache hit skips Inductor's passes (qlower's too), leaving no report of what was chosen.
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        try:
            torch.set_num_threads(args.threads or threads)
            return _measure(args, tp, device, checkpoint)
        finally:
            torch.set_num_threads(threads)


def _measure(
    args: argparse.Namespace, tp: TP, device: str, checkpoint: Checkpoint
) -> tuple[dict[str, Any], list[Row]]:
    cfg = args.cfg
    wls = workloads(args.batches, args.cache, args.prefill)
    seq = max(args.cache + 1, args.prefill)
    base = build_base(cfg, device, tp)
    combos = [(m, g) for m in args.shapes for g in args.cudagraphs]
    total = len(args.variants) * len(combos) * len(wls)
    bar = Progress(total, f"bench_model {args.device}", stream=sys.stderr if tp.rank == 0 else io.StringIO())
    rows: list[Row] = []
    inductor_defaults = torch._inductor.config.get_config_copy()  # torchao's quantize_ flips global knobs
    start = time.perf_counter()
    watch = LoadWatch()

    def meta_now(partial: bool) -> dict[str, Any]:
        return {
            "device": describe_device(device),
            "device_kind": args.device,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            **versions(),
            "command": (f"torchrun --nproc-per-node {tp.world} " if tp.world > 1 else "python ")
            + "-m scripts.bench_model "
            + " ".join(args.argv),
            "config": dataclasses.asdict(cfg),
            "cache": args.cache,
            "prefill": args.prefill,
            "tp": tp.world,
            "hbm_tbps": args.hbm_tbps if device.startswith("cuda") else None,
            "timing": (
                "median per step: CUDA events with graphs on, else wall clock (CUDA synchronized)"
                if device.startswith("cuda")
                else "median wall clock per step"
            )
            + f", {SPREAD_DEFINITION}",
            "wall_s": round(time.perf_counter() - start, 1),
            "rank": tp.rank,
            **({"partial": "yes (the run stopped before its last variant)"} if partial else {}),
            "warning": timing_warning(rows, watch),
        }

    with torch.no_grad():
        for variant in args.variants:
            quant, compiler = split_variant(variant)
            torch._inductor.config.load_config(inductor_defaults)
            bar.set_postfix_str(f"{variant}: quantize")
            try:
                model = build_variant(base, quant, tp, max(args.batches), seq)
                failure = ""
            except Exception as e:  # e.g. torchao missing: every row of the variant says so
                model, failure = None, f"failed to build: {type(e).__name__}: {_first_line(e)}"
            wbytes = weight_bytes(cfg, quant, tp.world)
            fn = None
            for mode, graphs in combos:
                for group, warm in sequences(wls, mode, args.prefill):
                    torch._dynamo.reset()
                    fn, note = None, failure
                    if model is not None:
                        fn = compile_model(model, compiler, mode, graphs, args.cpp_wrapper)
                    if warm is not None and fn is not None:
                        bar.set_postfix_str(f"{variant} {combo_name(mode, graphs)}: {warm.name}")
                        note = f"after {warm.name}"
                        try:
                            fn(torch.randn(1, warm.tokens, cfg.dim, device=device, dtype=DTYPE), warm.start)
                        except Exception as e:
                            fn, note = None, f"failed ({warm.name}): {type(e).__name__}: {_first_line(e)}"
                    prev: Row | None = None
                    for wl in group:
                        row = Row(variant, wl.name, mode, graphs, tp.world, wl.batch, wl.batch * wl.tokens)
                        row.weight_bytes = wbytes
                        bar.set_postfix_str(f"{variant} {combo_name(mode, graphs)}: {wl.name}")
                        if fn is not None:
                            try:
                                run_row(model, fn, row, wl, args, device, prev)
                                watch.sample()
                            except Exception as e:  # recorded in the row; the run goes on
                                row.note = f"failed: {type(e).__name__}: {_first_line(e)}"
                        row.note = "; ".join(n for n in (note, row.note) if n)
                        rows.append(row)
                        prev = row
                        bar.update(1)
            del model, fn
            torch._dynamo.reset()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            if tp.rank == 0:
                fill_ratios(rows)
                checkpoint(meta_now(partial=True), rows)
    bar.close()
    torch._inductor.config.load_config(inductor_defaults)
    fill_ratios(rows)
    meta = meta_now(partial=False)
    return meta, rows


# ---- command line ----


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _choices(text: str, valid: Iterable[str]) -> list[str]:
    items = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in items if v not in valid]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad}: choose from {', '.join(valid)}")
    return items


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda")
    )
    p.add_argument(
        "--variants", default="default", help=f"comma list, `default` or `all` ({', '.join(ALL_VARIANTS)})"
    )
    p.add_argument(
        "--small", action="store_true", help="dim 512 shapes, a few-minute run (automatic on CPU; SMALL_RUN)"
    )
    for name in ("dim", "heads", "kv-heads", "hidden"):
        p.add_argument(f"--{name}", type=int, default=None, help="override one size of the shapes")
    p.add_argument("--layers", type=int, default=None, help="decoder blocks (default 4; small 1)")
    p.add_argument(
        "--batches",
        type=_ints,
        default=None,
        help="decode batch sizes, in run order (default 1,4,16,64; small 1,16)",
    )
    p.add_argument(
        "--cache", type=int, default=None, help="KV-cache length of decode (default 1024; small 256)"
    )
    p.add_argument(
        "--prefill", type=int, default=None, help="prefill tokens, 0: none (default 2048; small 128)"
    )
    p.add_argument(
        "--shapes",
        type=lambda t: _choices(t, ("static", "changing", "dynamic")),
        default=None,
        help="comma list of static, changing, dynamic (default static,changing)",
    )
    p.add_argument(
        "--cudagraphs", type=lambda t: _choices(t, ("on", "off")), default=None, help="on,off (CUDA default)"
    )
    p.add_argument(
        "--cpp-wrapper",
        action="store_true",
        help="compile every variant with Inductor's C++ wrapper (no graphs)",
    )
    p.add_argument(
        "--kernel-split",
        action="store_true",
        help="CUDA: profile each row's GPU time into matmul kernels and the rest",
    )
    p.add_argument("--reps", type=int, default=None, help="timed steps per row (default CUDA 30, CPU 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps after the compile call")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="CPU: keep timing a row while under this many s (default 1; small 0.5)",
    )
    p.add_argument("--hbm-tbps", type=float, default=4.8, help="peak HBM bandwidth for the bound (H200: 4.8)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel world size (run under torchrun)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"folder for the .md/.json/.png (default: ./{DEFAULT_OUT}; the committed tables: benchmarks)",
    )
    p.add_argument("--replot", metavar="JSON", help="no measuring: rewrite .md/.png from an earlier .json")
    p.add_argument("--cold", action="store_true", help="compile with empty caches (compile s of a first run)")
    args = p.parse_args(argv)
    args.argv = argv
    small = args.small or args.device == "cpu"
    preset = SMALL if small else FULL
    sizes = {
        k: getattr(args, k) for k in ("dim", "heads", "kv_heads", "hidden") if getattr(args, k) is not None
    }
    run = SMALL_RUN if small else FULL_RUN
    for key, value in run.items():
        if getattr(args, key) is None:
            setattr(args, key, copy.copy(value))
    args.cfg = dataclasses.replace(preset, layers=args.layers, **sizes)
    args.variants = parse_variants(args.variants)
    cuda = args.device == "cuda"
    graphs = args.cudagraphs or (["on", "off"] if cuda else ["off"])
    if "on" in graphs and not cuda:
        p.error("--cudagraphs on needs --device cuda")
    args.cudagraphs = [g == "on" for g in graphs]
    if args.kernel_split and not cuda:
        p.error("--kernel-split profiles CUDA kernels: add --device cuda")
    if args.cpp_wrapper and any(args.cudagraphs):
        p.error("--cpp-wrapper is measured without CUDA graphs: add --cudagraphs off")
    args.reps = args.reps or (30 if cuda else 5)
    if cuda and args.reps < 20:
        p.error("--reps: at least 20 on CUDA")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    return args


def cold_caches() -> None:
    """Fresh, empty Inductor and Triton cache folders for this process, Inductor's caches off: every compile in
    the run is a first compile."""
    root = Path(tempfile.mkdtemp(prefix="qlower-bench-cold-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(root / "triton")
    torch._inductor.config.force_disable_caches = True


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.out)
    if args.replot:
        data = json.loads(Path(args.replot).read_text())
        meta, rows = data["meta"], [Row(**renamed_keys(r)) for r in data["rows"]]
    else:
        if args.cold:
            cold_caches()
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"bench_model: writing to {out}", file=sys.stderr, flush=True)
        meta, rows = measure(args, lambda m, r: write(out, m, r, with_plot=False))
    if meta.get("rank", 0):
        return 0
    print("\n" + write(out, meta, rows))
    bad = [r for r in rows if any(w in r.note for w in ("failed", "left alone", "rel err", "graph breaks"))]
    for r in bad:
        print(f"FAIL: {r.variant} {r.workload} {r.mode} graphs={r.cudagraphs}: {r.note}", file=sys.stderr)
        for reason in r.reasons:
            print(f"  left alone: {reason}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
