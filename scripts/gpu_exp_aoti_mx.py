"""MX through AOTInductor on CUDA with a dynamic batch: which M and which layer disagree with eager, and why.

Session 8 saw tests/test_aoti_export.py's MX package (MXFP8 then MXFP4 weight-only linears, K = 64) miss eager
at M = 1 on the H200 while the woq and dynamic-int8 packages matched. This script exports one MX linear at a
time (and the pair), with a dynamic batch, and prints per M the package's and torch.compile's relative error
against eager, the lowering chosen, and the wrapper's launch lines of qlower's kernels.

    LD_PRELOAD=$(readlink -f $(g++ -print-file-name=libstdc++.so.6)) python -P scripts/gpu_exp_aoti_mx.py
"""

from __future__ import annotations

import os
import re
import sys
import zipfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_aoti_export import MxWeightOnlyLinear  # noqa: E402

import qlower  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
SIZES = (1, 2, 3, 4, 5, 8, 16, 17, 70)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def run(name: str, model: nn.Module, k: int) -> None:
    model = model.cuda().eval()
    x = torch.randn(4, k, dtype=torch.bfloat16, device="cuda")
    batch = torch.export.Dim("batch", min=1, max=1024)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    qlower.clear_reports()
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(OUT / f"{name}.pt2"), inductor_configs=qlower.inductor_options()
    )
    print(name, "lowered:", [d.lowering for d in qlower.last_report()], flush=True)
    with zipfile.ZipFile(path) as z:
        (w,) = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
        src = z.read(w).decode()
    (OUT / f"{name}.wrapper.cpp").write_text(src)
    for line in src.splitlines():
        if re.search(r"launchKernel|mx_|hfma|grid", line) and len(line) < 400:
            print("   ", line.strip())
    runner = torch._inductor.aoti_load_package(path)
    torch._dynamo.reset()
    compiled = torch.compile(model, options=qlower.inductor_options(), dynamic=True)
    for m in SIZES:
        xm = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            want, got, comp = model(xm), runner(xm), compiled(xm)
        print(f"  {name} M={m}: aoti rel {_rel(got, want):.2e}  compile rel {_rel(comp, want):.2e}", flush=True)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for elem in ("e4m3", "e2m1"):
        run(elem, MxWeightOnlyLinear(nn.Linear(64, 64).to(torch.bfloat16), elem), 64)
    run("e2m1_k256", MxWeightOnlyLinear(nn.Linear(256, 128).to(torch.bfloat16), "e2m1"), 256)


if __name__ == "__main__":
    main()
