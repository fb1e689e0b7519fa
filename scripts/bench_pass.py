"""qlower's own share of a compile, measured on any machine: a decoder's linears with a symbolic M, traced with
fake tensors as on an sm_90 GPU (device facts faked: no GPU needed), and qlower's pass applied per family.

    python -m scripts.bench_pass [--layers 16] [--families woq_int8,mx,dynamic_int8] [--modes default,cudagraphs]

Each layer has the four Llama-3-8B linear shapes (fused qkv 4096->6144, o 4096->4096, fused gate/up
4096->28672, down 14336->4096) on activations [M, K] with one size symbol M; MX is MXFP4 weight-only. The pass
recognizes each linear, picks its lowering and emits it (tracing the kernels' launches and, without CUDA graphs,
the host branches on M; linears of one shape reuse one trace). "default": Inductor's default mode (host
branches, `torch.cond`); "cudagraphs": `triton.cudagraphs` (launches gated by M). The CUTLASS library is
taken as built. Not measured here: Inductor's lowering and code generation of the result and the Triton
compiles of its kernels (the GPU's compile seconds in BENCHMARKS.md include them), and Torch's TTIR access
analysis of each launch, which needs the CUDA driver (on a GPU it runs once per kernel configuration:
`lowerings/graph/triton_access_cache.py`). Seconds are wall time of one run each, in this process.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_pass", *sys.argv[1:]])

import torch
import torch.nn.functional as F
from torch._dynamo.source import ConstantSource
from torch._inductor import config as inductor_config
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from qlower.quantize import mx_format as fmt
from qlower.testing import apply_pass, fake_sm90

BF16 = torch.bfloat16
SHAPES = ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096))  # (K, N) of one layer's linears
M_HINT = 16


def _per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-5) / 127
    return torch.clamp(torch.round(x.float() / s), -128, 127).to(torch.int8), s


def _dynamic_int8(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xq, sx = _per_token(x)
    return (torch._int_mm(xq, w.t()) * sx * s).to(x.dtype)


# The forms qlower's recognizers take, per family name of the pass (`apply_pass(families=...)`).
LINEAR: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "woq_int8": lambda x, w, s: F.linear(x, w.to(x.dtype)) * s,
    "dynamic_int8": _dynamic_int8,
    "mx": lambda x, q, e: F.linear(x, fmt.dequantize(q, e, "e2m1", x.dtype)),
}


def _weights(family: str, k: int, n: int) -> list[torch.Tensor]:
    if family == "mx":
        return [
            torch.empty(n, k // 2, dtype=torch.uint8, device="cuda"),
            torch.empty(n, k // 32, dtype=torch.uint8, device="cuda"),
        ]
    scale_dtype = BF16 if family == "woq_int8" else torch.float32
    return [
        torch.empty(n, k, dtype=torch.int8, device="cuda"),
        torch.empty(n, dtype=scale_dtype, device="cuda"),
    ]


def measure(family: str, layers: int, cudagraphs: bool) -> dict[str, float | int]:
    """Trace the decoder's linears (symbolic M, fake sm_90 tensors) and apply the pass: seconds and counts."""
    linear = LINEAR[family]
    env = ShapeEnv()
    m = env.create_symintnode(env.create_symbol(M_HINT, ConstantSource("m")), hint=M_HINT)
    with FakeTensorMode(shape_env=env):
        x, x_down = (torch.empty(m, k, dtype=BF16, device="cuda") for k in (4096, 14336))
        weights = [w for _ in range(layers) for k, n in SHAPES for w in _weights(family, k, n)]

    def decoder(x: torch.Tensor, x_down: torch.Tensor, *ws: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(ws)
        return tuple(
            linear(x_down if k == 14336 else x, next(it), next(it)) for _ in range(layers) for k, _ in SHAPES
        )

    t0 = time.perf_counter()
    gm = make_fx(decoder, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(
        x, x_down, *weights
    )
    t1 = time.perf_counter()
    with inductor_config.patch({"triton.cudagraphs": cudagraphs}):
        report = apply_pass(gm, families=(family,))
    t2 = time.perf_counter()
    return {
        "linears": layers * len(SHAPES),
        "lowered": sum(1 for e in report.entries if e.lowering),
        "trace_s": t1 - t0,
        "pass_s": t2 - t1,
        "nodes": len(gm.graph.nodes),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--families", default="woq_int8,mx,dynamic_int8", type=lambda s: s.split(","))
    p.add_argument("--modes", default="default,cudagraphs", type=lambda s: s.split(","))
    args = p.parse_args(argv)
    print(f"{args.layers} layers, {args.layers * len(SHAPES)} linears, a symbolic M, fake sm_90 tensors")
    print("| family | mode | lowered | trace s | pass s | graph nodes after |")
    print("|---|---|---|---|---|---|")
    with fake_sm90():
        for family in args.families:
            for mode in args.modes:
                r = measure(family, args.layers, mode == "cudagraphs")
                print(
                    f"| {family} | {mode} | {r['lowered']}/{r['linears']} | {r['trace_s']:.2f} | {r['pass_s']:.2f} "
                    f"| {r['nodes']} |"
                )


if __name__ == "__main__":
    main()
