"""Where does AOTInductor on CUDA crash on the device machine? Compile in one process, load in another.

The first H200 diagnosis (scripts/gpu_exp_aoti.py, benchmarks/h200_experiments/aoti_exp.json) saw every
case, a plain bf16 model without qlower included, die with SIGSEGV inside `aoti_load_package` in the process
that had just compiled the package. This script separates the two: `compile` writes a package and exits,
`load` (a fresh process) loads and runs it; with `cuda-gdb` on the machine the load also runs under it for a
native backtrace. Output: one line per step, and the logs under $OUT.

    python -P scripts/gpu_exp_aoti_load.py            # all steps, ~2 min on the H200
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "out"))
WORK = Path("/tmp/qlower_aoti_load")


def _model(kind: str):
    import torch

    if kind == "plain":
        model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))
        return model.cuda().to(torch.bfloat16), torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from woq_models import WoqLinear

    model = WoqLinear(1024, 512, torch.bfloat16, bias=True).cuda()
    return model, torch.randn(17, 1024, device="cuda", dtype=torch.bfloat16)


def compile_step(kind: str) -> None:
    import torch

    import qlower

    torch.manual_seed(0)
    model, x = _model(kind)
    ep = torch.export.export(model, (x,))
    opts = qlower.inductor_options() if kind != "plain" else {}
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(WORK / f"{kind}.pt2"), inductor_configs=opts
    )
    torch.save(x.cpu(), WORK / f"{kind}_x.pt")
    with torch.no_grad():
        torch.save(model(x).cpu(), WORK / f"{kind}_ref.pt")
    print("compiled", path, [d.lowering for d in qlower.last_report()] if kind != "plain" else "")


def load_step(kind: str) -> None:
    import torch

    x = torch.load(WORK / f"{kind}_x.pt").cuda()
    ref = torch.load(WORK / f"{kind}_ref.pt").cuda()
    print("loading", flush=True)
    runner = torch._inductor.aoti_load_package(str(WORK / f"{kind}.pt2"))
    print("loaded; running", flush=True)
    with torch.no_grad():
        out = runner(x)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"ran: rel err vs eager {err:.2e}")


def _step(args: list[str], log: Path, timeout: int) -> str:
    t0 = time.time()
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"{e.stdout or ''}{e.stderr or ''}\nTIMEOUT", "timeout"
    log.write_text(text)
    last = [ln for ln in text.splitlines() if ln.strip()][-1:] or [""]
    return f"rc={rc} {time.time() - t0:.0f}s :: {last[0][:200]}"


def main() -> None:
    if len(sys.argv) == 3:
        {"compile": compile_step, "load": load_step}[sys.argv[1]](sys.argv[2])
        return
    OUT.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    me = [sys.executable, "-X", "faulthandler", "-P", __file__]
    gdb = shutil.which("cuda-gdb")
    logs = OUT / "aoti_load"
    logs.mkdir(exist_ok=True)
    for kind in ("plain", "woq"):
        print(kind, "compile:", _step([*me, "compile", kind], logs / f"{kind}_compile.log", 240), flush=True)
        print(kind, "load:   ", _step([*me, "load", kind], logs / f"{kind}_load.log", 120), flush=True)
        if gdb and kind == "plain":
            cmd = [gdb, "-batch", "-ex", "run", "-ex", "bt 30", "--args", *me, "load", kind]
            print(kind, "cuda-gdb:", _step(cmd, logs / f"{kind}_load_gdb.log", 150), flush=True)


if __name__ == "__main__":
    main()
