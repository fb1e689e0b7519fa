"""Randomized correctness fuzz of qlower through `torch.compile`, for all three families.

Why: the unit tests pin a handful of shapes per lowering, while qlower's choices depend on M, K, N, dtype,
bias, batch dims, dynamic M and the kernel preference together (tile tables, M buckets, padding, swap-AB,
K/N alignment rules, decode kernels). This script draws random cases from those axes, compiles each one
with `qlower.inductor_options(...)`, runs it and compares the result with a float64 reference (or with the
eager model where that is the defined reference, as the GPU tests do), recording what qlower chose.

Each case is drawn from `random.Random(case_seed)` only, so any case re-runs alone with `--only SEED`:

    python -m scripts.fuzz_compile                                  # CUDA if available, else CPU
    python -m scripts.fuzz_compile --device cuda --cases 200 --budget-s 240
    python -m scripts.fuzz_compile --device cpu --cases 15          # CPU: smaller K, N (slow compiles)
    python -m scripts.fuzz_compile --device cuda --only 1234567     # re-run one case (seed from a summary)
    python -m scripts.fuzz_compile --device cpu --cases 8 --variant weight_write   # one defect class

Writes `fuzz_<device>.json` (every case: parameters, chosen lowerings, errors, exceptions) under `--out`
($OUT, else ./out), rewritten after each case, so a hard crash still leaves the case that was running
(`in_progress`).

Outcomes: `pass` (lowered, numbers right), `left_alone` (qlower left the linear to Inductor and said why,
numbers right), `declined` (an explicit kernel preference refused with qlower's UnsupportedPlatformError);
warnings: `misrecognized` (lowered as another family under `inductor_options()`'s default of every family,
or no row of the case's family; numbers right: a left-alone row of another family is a true report of another
product, e.g. a training backward's `grad @ dequantized weight`), `imprecise` (within the GPU tests' relative bounds vs the reference, bf16 1e-2 say, but
outside their tighter eager-relative ones), `upstream` (wrong numbers, a crash or a matmul operand with a
short leading dimension in a graph qlower left alone, which stock torch.compile reproduces without qlower);
failures: `fail` (wrong numbers or gradients, NaN, wrong shape/dtype, preference not honoured, K % 32 != 0
lowered to anything but the emulation, a training compile's report without rows, a defect class's rows
other than it expects: `classes.check_rows`), `error` (any other exception) and `silent` (no report
row at all: every case's model holds a quantized linear, so qlower passed one over without a word). A
failure in a graph where qlower lowered something stays a failure; when stock torch.compile fails too, its
`why` says so. The summary counts failures as wrong (`fail`), crashed (`error`) and silent. Exit status 1
when a case failed, errored or was silent.

Variants (`extra["variant"]`, drawn after every other choice, so a seed keeps its family, form, dtype and
shape; `--variant V [V ...]` fuzzes only those, and a summary's rerun line repeats the flag). `plain` is the
case as drawn. The others each target one defect class, with several spellings, every family they reach:
- `view_epilogue` (all families): the linear's [.., N] output split into heads (`.view(*lead, H, D)`,
  `.unflatten(-1, (H, D))`, `.reshape`, `.view(*lead, -1, D)`), then multiplied and/or biased by a vector
  over the viewed dims ([D], [H, D], [1, 1, 1, D]) or a per-row-looking gate [.., 1, 1] computed from x
  (`epi`); for woq and dynamic int8 also the linear's own scale written after the view (`scale_at=heads`:
  `mm.view(.., H, D) * s.view(H, D)`, `acc.view(.., H, D) * sx.view(.., 1, 1) * s.view(H, D)`).
- `expanded_scale` (woq, dynamic int8): scales reaching the epilogue through `.expand(M, N)` (torchao's
  CUDA spelling `_int_mm(xq, w.t()) * x_scale.expand(M, N)`), as [N], [1, N], [N, 1] or 0-d; woq also on
  the weight (`w * s.expand(N, K)`).
- `fp16_extreme` (woq, MX; fp16): per-channel scales up to 4096 with small activations (finite in the
  user's formula, beyond 65504 once folded into the weight), tiny scales (fp16 subnormals), both mixed;
  MX scale codes shifted up (weights beyond 65504 under an fp32 matmul, or just below it in an fp16
  dequantization) or down (subnormal fp16 weights).
- `training` (all): x and/or the float parameters (scale, bias) require grad; forward + backward; outputs
  and gradients are checked (against float64 where the reference is the same function, else eager: 2e-2),
  and `qlower.last_report()` after the first backward must describe a compile that ran (`pass_ran`, rows).
- `weight_write` (all): call, write the weight (and maybe its scale) through one API — `w.data.copy_`,
  `w.data[:] =`, `torch.no_grad(): w.copy_`, `load_state_dict` in place or `assign=True`, a
  `torch.from_numpy` view written through numpy (CPU) — call again with the same input, compare with eager
  after the write. Dynamic int8 on CPU mostly sets `QLOWER_CPU_INT8_ISA=vnni` for the case (`isa`) and takes
  K*N >= 2^22 weights, so qlower's prepack cache (`qlower.qlinear_u8_cached`) is what a stale read hits.
  On a CPU without that ISA (AVX2: the forced u8 x s8 kernels saturate int16 pair sums, wrong on their own)
  a call after the write is compared with a fresh compile of the written model instead (`differential`).
- `mx_special` (MX): dequantizations that give special codes their own meaning — e8m0 code 255 -> 0
  (`where(e == 255, 0, exp2(e - 127))`, or an e8m0 tensor's NaN zeroed), NaN fp8 elements zeroed
  (`nan_to_num`), the fp4 table a module buffer (the e2m1 values, or NF4's codebook), fp4 packed high nibble
  first — over data holding scale codes 0 and 255, NaN encodings and every fp4 byte; and the spec's own decode
  over NaN / Inf fp8 elements and code 255 (`spec_codes`: lowered, its NaN / Inf outputs where eager has them).
- `cudagraphs=True` (a plain dynamic CUDA case, half of them): compiled with
  `inductor_options(mode="reduce-overhead")`, so a symbolic M runs the gated launches (one per M range into
  one output) rather than default mode's host `if`s; each call is the third of three (warm-up, recording,
  replay). (Two MXFP4 dequantize + cuBLAS ranges once shared the first one's gate: zeros above M = 128.)
- `matvec` (woq, MX): M = 1 in the matrix-vector form Inductor's `mm` decomposition leaves on GPUs once
  `coordinate_descent_tuning` is on (torchao's `quantize_` turns it on): both operands upcast to fp32, the
  broadcast product summed over K, cast back. `matvec=decomposed` (CUDA) compiles the case's own form with
  that setting on; `matvec=hand` (woq, any device: CPU Inductor never decomposes) is torchao
  `Int8WeightOnlyConfig`'s linear (`mm(x, w.t().to(dt)) * s.to(dt).flatten()`, s fp32 [N, 1]) written in that
  form, so the CPU checks the numbers of what the recognizer makes of it. MX on CPU is its plain form at M = 1.
- `mx_training` (MX; needs torchao, else skipped with a note and seeds draw among the other variants):
  torchao's MX training recipes, `MXFP8Linear(K, N, kernel_preference=EMULATED)` (`scale_mode` RCEIL,
  FLOOR or CEIL) or `quantize_(Sequential(Linear(K, N)), MXFP8TrainingOpConfig.from_recipe(
  MXFP8_EMULATED_RCEIL))`, bf16; tokens, K and N multiples of 32 with odd block counts (96, 160, 224), at
  most 256 on CPU, 2048 on CUDA. Forward + backward against torchao's eager MX (output, grad x and every
  parameter's gradient within 1e-2); the report holds the three MX matmuls (T, K, N), (T, N, K), (N, T, K),
  all lowered.
- `family_order` (dynamic int8): a dynamic-int8 linear written dequantize-then-matmul (`scale_on_weight`,
  `scale_after_linear`, `fp32_dequant`) over a 1-D, 2-D or 3-D activation, compiled with `families=` in a
  drawn order and subset (`families`): one row per compile, dynamic_int8 lowered where it is enabled, else
  woq_int8 left alone with `patterns.woq_int8.DYNAMIC_ACTIVATION`.
- `near_mx` (MX): MX-shaped decodes that are not MX (`decode`): scale bytes read as e4m3 or e5m2,
  `2 ** (e - 126)`, `exp2(e - 128)`, e8m0 codes per 16 elements, NVFP4-like (e2m1, an e4m3 scale per 16
  elements, a global scale); e4m3, e5m2 or e2m1 elements; `F.linear` or an fp32 matmul. One mx row, left
  alone, its reason starting "scale decode differs from e8m0" (scale decodes) or "weight is computed from
  8-bit data" (16-element blocks).
- `stacked_experts` (woq): stacked int8 experts W [E, N, K], E in 1, 2, 4, 8,
  `bmm(x, W.to(dt).transpose(1, 2)) * S[:, None]` and `einsum("mk,enk->emn", x, W.to(dt)) * S[:, None]`;
  the weight on the left, `(w.to(dt) @ v) * s` with v [K] or [K, B] (`x_dims`). One woq_int8 row, left
  alone, its reason from patterns/unclaimed.py (batched matmul, W @ x).
- `lora_training` (all; drawn only when `--variant` names it): a frozen quantized linear beside a trainable
  low-rank adapter, x requiring grad (the base's scale too: `scale_grad`), forward + backward: the forward
  linear's rows the case's family, one lowered; a dynamic-int8 base one dynamic_int8 row, lowered.
- `producer_ops` (all; drawn only when `--variant` names it; needs optimum-quanto): a linear inside a
  producer's own op: quanto's frozen qint8 `QLinear` (`quanto::qbytes_mm`: woq_int8, lowered), its
  `activations=qint8` arithmetic with quanto's ops (dynamic_int8, lowered), qfloat8 weights (mx, left alone)
  and an unproven op of vLLM's namespace (woq_int8, left alone): each left-alone reason names the op.
These classes are scripts/fuzz/classes.py (draws, models, the rows each expects): numbers against float64
(torchao's eager MX for `mx_training`), every compile's rows against the class's expectation.
The tolerance of woq, MX and those classes is max(the relative bound above, 2x eager's own error): an fp16
dequantization that rounds subnormal weights is the user's formula, not a qlower failure.

Needs torch (and Triton on CUDA): it imports the model forms of tests/forms/ (woq_int8.py, dynamic_int8.py,
mx.py; never their torchao builders), no pytest or expecttest; torchao only for `mx_training`,
optimum-quanto only for `producer_ops`. Its parts are the package scripts/fuzz/ (case, draw, models, steps,
check, run, and the classes of classes.py and pipelines.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.fuzz_compile", *sys.argv[1:]])

import torch

from scripts.fuzz.case import FAMILIES
from scripts.fuzz.draw import ALL_VARIANTS, UNAVAILABLE, make_case, variant_families
from scripts.fuzz.run import run_case


def _line(i: int, total: int, rec: dict[str, Any]) -> str:
    mets = rec.get("metrics") or []
    rel = max((m.get("rel_err", math.nan) for m in mets), default=math.nan)
    low = ",".join(rec.get("lowerings") or []) or "-"
    tail = f"rel={rel:.2e}" if mets else ""
    if "why" in rec:
        tail += f" WHY: {rec['why'][:200]}"
    elif rec["outcome"] == "declined":
        msg = rec["exception"]["root_message"]
        tail += f" ({msg[:160]}{'...' if len(msg) > 160 else ''})"
    return (
        f"[{i:3d}/{total}] seed={rec['seed']:<10d} {rec['outcome'].upper():10s} {rec['description']} "
        f"-> {low} {tail} ({rec['time_s']:.1f}s)"
    )


ACCEPTABLE = ("pass", "left_alone", "misrecognized", "declined", "imprecise")
FAILURES = {"fail": "wrong", "error": "crashed", "silent": "silent"}  # outcome -> its name in the summary


def summarize(
    records: list[dict[str, Any]],
    device: str,
    families: tuple[str, ...],
    variants: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    outcome = collections.Counter(r["outcome"] for r in records)
    by_variant: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_family: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_lowering: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_pref: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        by_variant[r["extra"].get("variant", "plain")][r["outcome"]] += 1
        by_family[r["family"]][r["outcome"]] += 1
        by_pref[r["preference"]][r["outcome"]] += 1
        for lw in r.get("lowerings") or ["(no decision)"]:
            by_lowering[r["family"]][lw] += 1

    fam = "" if families == FAMILIES else " --families " + " ".join(families)  # cases depend on it
    fam += "" if variants is None else " --variant " + " ".join(variants)

    def listed(*outcomes: str) -> list[dict[str, Any]]:
        return [
            {
                "seed": r["seed"],
                "outcome": r["outcome"],
                "case": r["description"],
                "why": r.get("why", ""),
                "rerun": f"python -m scripts.fuzz_compile --device {device} --only {r['seed']}{fam}",
            }
            for r in records
            if r["outcome"] in outcomes
        ]

    return {
        "cases": len(records),
        "outcomes": dict(outcome),
        "by_family": {k: dict(v) for k, v in by_family.items()},
        "by_variant": {k: dict(v) for k, v in by_variant.items()},
        "by_preference": {k: dict(v) for k, v in by_pref.items()},
        "lowerings": {k: dict(v) for k, v in by_lowering.items()},
        "misrecognized": listed("misrecognized"),
        "imprecise": listed("imprecise"),
        "upstream": listed("upstream"),
        "failures": listed(*FAILURES),
    }


def _print_summary(summary: dict[str, Any], elapsed: float, stopped: str | None) -> None:
    print(
        f"\n==== qlower compile fuzz: {summary['cases']} cases in {elapsed:.0f}s"
        + (f" ({stopped})" if stopped else "")
    )
    print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["outcomes"].items())))
    for fam, c in sorted(summary["by_family"].items()):
        print(f"  {fam:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("by variant:")
    for var, c in sorted(summary["by_variant"].items()):
        print(f"  {var:15s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("by preference:")
    for pref, c in sorted(summary["by_preference"].items()):
        print(f"  {pref:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("lowerings chosen (cases):")
    for fam, c in sorted(summary["lowerings"].items()):
        print(f"  {fam:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])))
    for key, title in (
        ("misrecognized", "decided as another family (numbers right; a warning)"),
        ("imprecise", "within the tests' relative bounds, outside their eager-relative ones (a warning)"),
        ("upstream", "stock torch.compile fails the same way without qlower (not qlower's)"),
        ("failures", "qlower failures"),
    ):
        counts = ""
        if key == "failures":  # the three counts: wrong numbers, crashes, linears without a row
            n = collections.Counter(f["outcome"] for f in summary[key])
            counts = " (" + ", ".join(f"{name}: {n[o]}" for o, name in FAILURES.items()) + ")"
        print(f"{title}: {len(summary[key])}{counts}")
        for f in summary[key]:
            why = f"\n      {f['why'][:300]}" if f["why"] else ""
            print(f"  seed={f['seed']} {f['outcome']}: {f['case']}{why}\n      rerun: {f['rerun']}")


def _configure() -> None:
    """No silent eager fallback, no cache hits that skip qlower's pass, no PGO state carried across runs."""
    dc = torch._dynamo.config
    for name, value in (
        ("cache_size_limit", 1024),
        ("recompile_limit", 1024),
        ("accumulated_cache_size_limit", 1 << 16),
        ("accumulated_recompile_limit", 1 << 16),
        ("fail_on_recompile_limit_hit", True),
        ("suppress_errors", False),
        ("automatic_dynamic_local_pgo", False),
        ("automatic_dynamic_remote_pgo", False),
    ):
        if hasattr(dc, name):
            setattr(dc, name, value)
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.fx_graph_remote_cache = False
    torch._functorch.config.enable_autograd_cache = False


def _environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="seed of the case seeds")
    p.add_argument("--budget-s", type=float, default=240.0, help="start no new case after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT") or "out")
    p.add_argument("--only", type=int, nargs="+", metavar="SEED", help="run just these case seeds")
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    p.add_argument(
        "--variant", nargs="+", choices=list(ALL_VARIANTS), help="draw only these variants (module docstring)"
    )
    p.add_argument("--verbose", action="store_true", help="print qlower's report table of every case")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    _configure()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"fuzz_{args.device}.json"
    master = random.Random(args.seed)
    seeds = args.only or [master.randrange(1 << 31) for _ in range(args.cases)]
    families = tuple(args.families)
    variants = tuple(args.variant) if args.variant else None
    for v, why in UNAVAILABLE.items():
        if variants is None or v in variants:
            print(f"note: variant {v} skipped ({why}); seeds draw among the others", flush=True)
    if not variant_families(families, variants):
        p.error(f"--variant {' '.join(variants or ())} reaches none of --families {' '.join(families)}")
    doc: dict[str, Any] = {
        "args": vars(args),
        "environment": _environment(args.device),
        "cases": [],
        "in_progress": None,
    }

    def dump() -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(path)

    print(
        f"qlower compile fuzz on {args.device} ({doc['environment']}), {len(seeds)} cases -> {path}",
        flush=True,
    )
    start, stopped = time.perf_counter(), None
    for i, seed in enumerate(seeds, 1):
        if time.perf_counter() - start > args.budget_s:
            stopped = f"budget of {args.budget_s:g}s spent; {len(seeds) - i + 1} cases not started"
            break
        case = make_case(seed, args.device, families, variants)
        doc["in_progress"] = {**asdict(case), "description": case.describe()}
        dump()
        rec = run_case(case)
        doc["cases"].append(rec)
        doc["in_progress"] = None
        dump()
        print(_line(i, len(seeds), rec), flush=True)
        if args.verbose or rec["outcome"] not in ACCEPTABLE:
            print("    " + rec["report"].replace("\n", "\n    "))
            if "traceback" in rec and rec["outcome"] not in ACCEPTABLE:
                print("    " + rec["traceback"][-1500:].replace("\n", "\n    "))
        if args.device == "cuda" and rec["outcome"] not in ACCEPTABLE:
            try:  # an illegal memory access poisons the context: later cases would all fail
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                stopped = f"CUDA context lost after seed {seed}: {str(e)[:200]}"
                break
    elapsed = time.perf_counter() - start
    doc["summary"] = summarize(doc["cases"], args.device, families, variants)
    doc["elapsed_s"] = round(elapsed, 1)
    doc["stopped"] = stopped
    dump()
    _print_summary(doc["summary"], elapsed, stopped)
    print(f"wrote {path}")
    return 1 if doc["summary"]["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
