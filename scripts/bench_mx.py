"""Sweep of qlower's MX Triton kernel configs; the compiled MX model against bf16 on the target shapes (CUDA).

    python -m scripts.bench_mx --sweep [--out DIR]     # time qlower's MX Triton kernels per config
    python -m scripts.bench_mx --sweep --e2e           # then the compiled model with the winners
    python -m scripts.bench_mx [bench.py's flags]      # = python -m scripts.bench --family mx [flags]

The sweep calls the kernels directly with each candidate config on the issue's target shapes, checks each
result against an fp32 reference and prints the fastest; lowerings/kernels/triton/mx/ops.py holds the choice.
The cases and the model are the mx family module of bench.py (scripts/bench_families/mx.py).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_mx", *sys.argv[1:]])

import torch
import torch.nn.functional as F

from qlower.quantize import mx_format as fmt
from scripts.bench_families import mx
from scripts.bench_families.mx import CASES, DTYPE

DEVICE = "cuda"  # the sweep and --e2e modes (tests of this script swap in smaller shapes on CPU)
SWEEP_SHAPES = {  # case -> (M, K, N): the targets
    "mxfp8_dynamic": (4096, 4096, 14336),
    "mxfp4_weight_only": (1, 4096, 14336),
    "mxfp8_weight_only": (1, 4096, 14336),
}


def sweep_configs(case: str) -> list:
    from qlower.lowerings.kernels.triton.mx.ops import MXConfig

    if case == "mxfp8_dynamic":
        tiles = [
            (128, 128, 128, 8, 3),
            (128, 128, 64, 8, 4),
            (128, 256, 64, 8, 3),
            (256, 128, 64, 8, 3),
            (128, 128, 32, 8, 6),
            (64, 256, 128, 4, 3),
        ]
        return [
            MXConfig("mm", block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in tiles
        ]
    gemv = [
        (16, 512, 4, 2),
        (32, 512, 4, 2),
        (8, 1024, 4, 2),
        (16, 1024, 8, 2),
        (64, 256, 8, 2),
        (32, 256, 4, 3),
    ]
    return [MXConfig("gemv", block_n=bn, block_k=bk, num_warps=w, num_stages=s) for bn, bk, w, s in gemv]


def _median_ms(call, rotate: int, rep: int = 100) -> float:
    """do_bench median (ms) of call(i) with i cycling through the `rotate` weight sets."""
    import triton.testing

    counter = itertools.count()
    return triton.testing.do_bench(
        lambda: call(next(counter) % rotate), warmup=25, rep=rep, return_mode="median"
    )


BEST: dict[str, object] = {}  # case -> fastest correct config of the last sweep
_DEFAULT_NAME = {
    "mxfp8_dynamic": "MM_FP8_LARGE",
    "mxfp4_weight_only": "GEMV_FP4",
    "mxfp8_weight_only": "GEMV_FP8",
}


def apply_best() -> None:
    """Make the sweep's winners the configs `mx/ops.py`'s `pick_config` returns (for an --e2e run right
    after): each replaces its MX default config (`GEMV_FP4`, ...) for the rest of this process."""
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    for case, cfg in BEST.items():
        name = _DEFAULT_NAME[case]
        if not hasattr(mx_ops, name):
            raise ValueError(f"bench_mx: no MX default config named {name!r}")
        setattr(mx_ops, name, cfg)
        print(f"bench_mx: {case}: mx_ops.{name} = {cfg}", flush=True)


def sweep(out_dir: Path | None, rotate: int = 8) -> str:
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE, launch_config, pick_config

    dev = DEVICE
    lines = ["| case | M, K→N | config | µs | vs bf16 | rel err |", "|---|---|---|---|---|---|"]
    for case, (m, k, n) in SWEEP_SHAPES.items():
        a_elem, w_elem = CASES[case]
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(m, k, device=dev, generator=g, dtype=DTYPE)
        sets = []
        for _ in range(rotate):
            w = torch.randn(n, k, device=dev, generator=g) * k**-0.5
            q, e = fmt.quantize(w, w_elem)
            sets.append((w.to(DTYPE), q.view(torch.uint8), e))
        if a_elem is None:
            a, a_s, a_ref = x, None, x.float()
        else:
            xq, xe = fmt.quantize(x.float(), a_elem)
            a, a_s = xq.view(torch.uint8), xe
            a_ref = fmt.dequantize(xq, xe, a_elem, torch.float32)
        ref = (
            a_ref
            @ fmt.dequantize(
                sets[0][1].view(fmt.FP8_DTYPE.get(w_elem, torch.uint8)), sets[0][2], w_elem, torch.float32
            ).t()
        )
        t_bf16 = _median_ms(lambda i, x=x, sets=sets: F.linear(x, sets[i][0]), rotate)
        lines.append(f"| {case} | {m}, {k}→{n} | bf16 F.linear | {t_bf16 * 1e3:.1f} | 1.00× | |")
        fa, fw = ELEM_CODE[a_elem or "float"], ELEM_CODE[w_elem]
        default = pick_config(m, fa, fw)
        for cfg in sweep_configs(case):
            try:
                y = launch_config(cfg, a, a_s, sets[0][1], sets[0][2], None, fa, fw)
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t = _median_ms(
                    lambda i, c=cfg, a=a, a_s=a_s, s=sets, f=(fa, fw): launch_config(
                        c, a, a_s, s[i][1], s[i][2], None, *f
                    ),
                    rotate,
                )
            except Exception as ex:  # a config that does not compile or fit is reported, not fatal
                lines.append(
                    f"| {case} | {m}, {k}→{n} | {cfg} | failed: {type(ex).__name__}: {str(ex)[:80]} | | |"
                )
                continue
            mark = " (default)" if cfg == default else ""
            if err <= 1e-2 and (case not in BEST or t < BEST[case][0]):  # type: ignore[index]
                BEST[case] = (t, cfg)
            lines.append(
                f"| {case} | {m}, {k}→{n} | {cfg}{mark} | {t * 1e3:.1f} | {t_bf16 / t:.2f}× | {err:.1e} |"
            )
        print("\n".join(lines[-len(sweep_configs(case)) - 1 :]), flush=True)
    for case in list(BEST):
        BEST[case] = BEST[case][1]  # type: ignore[index]
    text = "\n".join(lines)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "mx_sweep.md").write_text(text + "\n")
    return text


E2E_KN = (4096, 14336)
E2E_SHAPES = {  # case -> M values at E2E_KN (the first is the target)
    "mxfp8_dynamic": (4096, 128),
    "mxfp4_weight_only": (1, 16),
    "mxfp8_weight_only": (1, 16),
}


def e2e(out_dir: Path | None, rotate: int = 8) -> str:
    """The model compiled with qlower (families=mx) against bf16 F.linear, rotating weights, do_bench median."""

    import qlower

    k, n = E2E_KN
    lines = [
        "| case | M, K→N | bf16 F.linear | qlower | vs bf16 | lowering | rel err vs eager |",
        "|---|---|---|---|---|---|---|",
    ]
    for case, ms in E2E_SHAPES.items():
        mx.A_ELEM, mx.W_ELEM = CASES[case]  # the formats mx.mx_linear reads
        sets = [mx.make_weights(k, n, DEVICE, seed) for seed in range(rotate)]
        torch._dynamo.reset()
        fn = torch.compile(mx.mx_linear, dynamic=False, options=qlower.inductor_options(families=("mx",)))
        for m in ms:
            x = torch.randn(1, m, k, device=DEVICE, dtype=DTYPE)
            qlower.clear_reports()
            y = fn(x, sets[0])
            lowering = ", ".join(
                str(d.lowering or f"LEFT ALONE: {d.reason}") for r in qlower.all_reports() for d in r
            )
            ref = mx.mx_linear(x, sets[0])
            err = ((y.float() - ref.float()).norm() / ref.float().norm()).item()
            times = {}
            for name, f in (("bf16", mx.bf16_linear), ("qlower", fn)):
                times[name] = _median_ms(lambda i, f=f, x=x, s=sets: f(x, s[i]), rotate, rep=200)
            tb, tq = times["bf16"], times["qlower"]
            lines.append(
                f"| {case} | {m}, {k}→{n} | {tb * 1e3:.1f} µs | {tq * 1e3:.1f} µs | {tb / tq:.2f}× | {lowering} | {err:.1e} |"
            )
            print(lines[-1], flush=True)
    text = "\n".join(lines)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "mx_e2e.md").write_text(text + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--sweep" not in argv and "--e2e" not in argv:  # the family benchmark: delegate to bench.py
        from scripts import bench

        return bench.main(["--family", "mx", *argv])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", action="store_true", help="time each kernel config on the target shapes")
    p.add_argument("--e2e", action="store_true", help="compiled model with qlower vs bf16 on the targets")
    p.add_argument("--out", default=None, help="folder for mx_sweep.md / mx_e2e.md")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else None
    with torch.no_grad():
        if args.sweep:
            print(sweep(out))
            if args.e2e:
                apply_best()
        if args.e2e:
            print(e2e(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
