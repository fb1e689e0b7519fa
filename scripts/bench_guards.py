"""Host cost of Dynamo's guards on a model whose linears hold torchao tensor-subclass weights.

    python scripts/bench_guards.py [--linears 29] [--families woq_int8,dynamic_int8] [--calls 2000] [--rounds 3]

A compiled call first checks its guards (Dynamo's "cache lookup"). A torchao weight adds, per linear, guards on
its inner tensors and two that call its Python `__tensor_flatten__` on every call (the subclass's metadata and
the names of its inner tensors). In HF `generate`'s host-bound decode step that is time bf16 does not pay
(BENCHMARKS.md, "HF `generate`"). Here a stack of `--linears` tiny linears (64 -> 64, bf16, one token) is compiled
with qlower's options, bf16 and each torchao family, under torch's guard filters: all guards; all but the
subclass metadata; all but it and the inner names; `torch.compiler.skip_guard_on_all_nn_modules_unsafe` (no
guard on the model's modules and their parameters). The computation is tiny, so a call's wall time is mostly
host work: the guard cost is the difference between rows. Prints the minimum over `--rounds` of the mean of
`--calls` calls, in microseconds.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Callable

if __name__ == "__main__" and not __package__:  # run as a file: again as `python -m` (scripts/__init__.py)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.bench_guards", *sys.argv[1:]])

import torch

import qlower

GuardFilter = Callable[[list], list[bool]]


def all_guards(entries: list) -> list[bool]:
    return [True] * len(entries)


def no_subclass_metadata(entries: list) -> list[bool]:
    return [e.guard_type != "TENSOR_SUBCLASS_METADATA_MATCH" for e in entries]


def no_subclass_structure(entries: list) -> list[bool]:
    """Also without the EQUALS_MATCH guards (on a torchao weight: its `__tensor_flatten__()[0]`, the inner names)."""
    return [e.guard_type not in ("TENSOR_SUBCLASS_METADATA_MATCH", "EQUALS_MATCH") for e in entries]


FILTERS: dict[str, GuardFilter] = {
    "all guards": all_guards,
    "no subclass metadata": no_subclass_metadata,
    "no subclass metadata or names": no_subclass_structure,
    "skip_guard_on_all_nn_modules_unsafe": torch.compiler.skip_guard_on_all_nn_modules_unsafe,
}


def model_for(family: str, linears: int) -> torch.nn.Module:
    layers = [torch.nn.Linear(64, 64, bias=False) for _ in range(linears)]
    model = torch.nn.Sequential(*layers).to(torch.bfloat16).eval()
    if family != "bf16":
        from torchao.quantization import (
            Int8DynamicActivationInt8WeightConfig,
            Int8WeightOnlyConfig,
            quantize_,
        )

        config = Int8WeightOnlyConfig() if family == "woq_int8" else Int8DynamicActivationInt8WeightConfig()
        quantize_(model, config)
    return model


def per_call_us(model: torch.nn.Module, guard_filter: GuardFilter, calls: int) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(
        copy.deepcopy(model), options={**qlower.inductor_options(), "guard_filter_fn": guard_filter}
    )
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(20):
            compiled(x)
        start = time.perf_counter()
        for _ in range(calls):
            compiled(x)
        return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--linears", type=int, default=29, help="29: the linears of HF's 4-layer Llama step")
    p.add_argument("--families", default="woq_int8,dynamic_int8", type=lambda s: s.split(","))
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.compiler.config.force_disable_caches = True
    families = ["bf16", *args.families]
    models = {f: model_for(f, args.linears) for f in families}
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):  # interleaved rounds: a slow spell of the machine hits every cell
        for family in families:
            for name, guard_filter in FILTERS.items():
                us = per_call_us(models[family], guard_filter, args.calls)
                best[family, name] = min(best.get((family, name), float("inf")), us)
    print(f"{args.linears} linears, us per call (min of {args.rounds} rounds of {args.calls} calls)")
    print("| guards | " + " | ".join(families) + " |")
    print("|---|" + "---|" * len(families))
    for name in FILTERS:
        print(f"| {name} | " + " | ".join(f"{best[f, name]:.1f}" for f in families) + " |")


if __name__ == "__main__":
    main()
