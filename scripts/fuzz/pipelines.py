"""Fuzz classes of the flows around a compile: Inductor's caches, AOTInductor packages, several compiles in one
process. Each runs a drawn case's model (every family, form, dtype, shape) through its own flow instead of one
`torch.compile`, and checks what qlower's report says of each compile beside the numbers.

Why a module of its own: the fuzz's run.py checks one compile's numbers and rows; the defects these find
lie between compiles (a report showing another compile's rows, a package that needs what its process lacks,
options of one compile leaking into another), so each class brings its own sequence of compiles.

- `cache_switch`: Inductor's FX graph and AOTAutograd caches on (a fresh cache folder per case), the model
  compiled with the case's preference, then EMULATED (AUTO for an EMULATED case), then the case's again: the
  third is served from the AOTAutograd cache. After each compile `last_report()` is a report of its own, never
  the previous one: where the AOTAutograd cache served it, one that says so (`pass_ran=False`, naming the
  preference); else the rows of that compile, honouring its preference (tests/end_to_end/test_report.py).
- `two_models`: in one process without a Dynamo reset, the model compiled with the case's options, a copy
  compiled by stock `torch.compile` (it must add no report; where its numbers are off eager's, stock
  compiled alone must be off too: a stock miscompile is stock's), and another copy with EMULATED: each
  compile's rows honour its own preference, each qlower output is checked against eager.
- `aoti_package`: `torch.export` (a `Dim` batch for a dynamic case, else static), AOTInductor with qlower's
  options, then the package run in fresh processes three ways (qlower blocked, `import qlower` alone,
  `qlower.load_ops()`), each against eager (tests/integrations/aoti/test_aoti_portable.py). On the H200 image
  a CUDA package loads only with the system libstdc++ preloaded (tests/helpers/aoti_cuda.py): run the CUDA
  fuzz under that `LD_PRELOAD`, which the fresh processes inherit.

run.py hands a case here from its `_execute`; a broken invariant is a `problems` entry, which run.py counts
as a failure.
"""

from __future__ import annotations

import contextlib
import copy
import os
import random
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import qlower
from scripts.fuzz.case import Case

VARIANTS: dict[str, tuple[tuple[str, ...], int]] = {
    "cache_switch": (("woq_int8", "dynamic_int8", "mx"), 6),
    "two_models": (("woq_int8", "dynamic_int8", "mx"), 4),
    "aoti_package": (("woq_int8", "dynamic_int8", "mx"), 4),
}
# How a fresh process runs a package (the preamble of its script):
# tests/integrations/aoti/test_aoti_portable.py's WAYS.
PACKAGE_WAYS = {
    "qlower_blocked": 'sys.modules["qlower"] = None\nimport torch',
    "import_qlower": "import torch, qlower",
    "load_ops": "import torch, qlower\nqlower.load_ops()",
}
PACKAGE_TIMEOUT_S = 3600  # a hang guard, never a speed limit


def _package_load_env(device: str) -> dict[str, str]:
    """LD_PRELOAD of the system libstdc++ for a CUDA package's fresh process, as tests/helpers/aoti_cuda.py
    documents: on the torch 2.11 H200 image any CUDA package (qlower's or not) segfaults in its std::regex
    otherwise."""
    if device != "cuda" or "libstdc++" in os.environ.get("LD_PRELOAD", ""):
        return {}
    try:
        found = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True)
    except OSError:
        return {}
    path = os.path.realpath(found.stdout.strip())
    return {"LD_PRELOAD": path} if found.returncode == 0 and os.path.isfile(path) else {}


SHARE = 0.1  # of the cases drawn without a variant filter


def pick(seed: int, variants: tuple[str, ...] | None, one_compile: dict[str, tuple[Any, int]]) -> str | None:
    """This case's flow, or None for one compile as usual: drawn from `seed` on a stream of its own, so adding
    these classes changed no other seed's case. With a `--variant` filter, those of its entries that are
    flows here, in proportion to the filter's other entries (`one_compile`: draw.VARIANTS)."""
    rng = random.Random(seed * 0x9E3779B1 % (1 << 61))
    if variants is None:
        return (
            rng.choices(list(VARIANTS), [w for _, w in VARIANTS.values()])[0]
            if rng.random() < SHARE
            else None
        )
    ours = [v for v in variants if v in VARIANTS]
    if not ours:
        return None
    theirs = sum(one_compile[v][1] for v in variants if v in one_compile)
    total = sum(VARIANTS[v][1] for v in ours)
    if rng.random() * (total + theirs) >= total:
        return None
    return rng.choices(ours, [VARIANTS[v][1] for v in ours])[0]


def draw(rng: Any, case: Case) -> None:
    """Nothing of the case changes: every family, form and shape goes through the class's flow. The CUDA
    graphs option stays off (it is drawn for plain cases only)."""


def _other_preference(preference: str) -> str:
    """A preference every device honours for every candidate, other than the case's."""
    return "AUTO" if preference == "EMULATED" else "EMULATED"


def _check_report(
    report: Any, previous: Any, preference: str, served: bool, problems: list[str], where: str
) -> None:
    if report is previous:
        problems.append(f"{where}: last_report() is the previous compile's report")
        return
    if served:
        if report.pass_ran or report.entries or preference not in report.table():
            problems.append(
                f"{where}: served from the AOTAutograd cache, but its report says {report.table()}"
            )
        return
    if not report.pass_ran or not report.entries:
        problems.append(f"{where}: the pass ran but its report has no rows: {report.table()}")
    elif preference != "AUTO" and any(d.kind != preference for d in report.lowered):
        problems.append(f"{where}: rows of another preference than {preference}: {report.table()}")


@contextlib.contextmanager
def _caches_on() -> Iterator[None]:
    with (
        fresh_cache(),
        torch._inductor.config.patch(fx_graph_cache=True, force_disable_caches=False),
        torch._functorch.config.patch(enable_autograd_cache=True),
    ):
        yield


def cache_switch(
    case: Case, model: torch.nn.Module, x: torch.Tensor, compile_fn: Callable[..., Any], problems: list[str]
) -> list[Any]:
    """The case's preference, another one, the case's again, caches on: outputs of each, report checked."""
    outs = []
    with _caches_on():
        previous = None
        for i, pref in enumerate((case.preference, _other_preference(case.preference), case.preference)):
            torch._dynamo.reset()
            hits = counters["aot_autograd"]["autograd_cache_hit"]
            outs.append(compile_fn(model, pref)(x))
            served = counters["aot_autograd"]["autograd_cache_hit"] > hits
            report = qlower.last_report()
            _check_report(report, previous, pref, served, problems, f"compile {i} ({pref})")
            previous = report
    return outs


def two_models(
    case: Case, model: torch.nn.Module, x: torch.Tensor, compile_fn: Callable[..., Any], problems: list[str]
) -> list[Any]:
    """qlower, stock, qlower with other options: three compiles in one process, no reset between them."""
    torch._dynamo.reset()
    outs = [compile_fn(model, case.preference)(x)]
    first = qlower.last_report()
    _check_report(first, None, case.preference, False, problems, f"qlower ({case.preference})")
    count = len(qlower.all_reports())
    # Stock Inductor cannot compile some graphs qlower lowers (CPU MX forms with e8m0 scales: KeyError
    # float8_e8m0fnu): nothing of qlower's runs there, so only the report is checked then.
    beside = _stock_output(model, case, x)
    if len(qlower.all_reports()) != count or qlower.last_report() is not first:
        problems.append("a stock torch.compile beside qlower's added a qlower report")
    other = _other_preference(case.preference)
    outs.append(compile_fn(copy.deepcopy(model), other)(x))
    _check_report(qlower.last_report(), first, other, False, problems, f"second qlower compile ({other})")
    # Stock's output is stock's: where it is off eager's, stock compiled alone (after a reset) must be off too,
    # so an Inductor miscompile stock makes on its own (CPU partial MX blocks, reading memory it never wrote:
    # other numbers each run) is not counted as qlower's.
    with torch.no_grad():
        eager = model(x)
    if beside is not None and not _near(beside, eager):
        torch._dynamo.reset()
        alone = _stock_output(model, case, x)
        if alone is not None and _near(alone, eager):
            problems.append(
                "stock torch.compile beside qlower's compiles is off eager's numbers; alone it is not"
            )
    return outs


def _stock_output(model: torch.nn.Module, case: Case, x: torch.Tensor) -> torch.Tensor | None:
    """Stock torch.compile of a copy of `model` on `x`, or None where stock cannot compile it."""
    try:
        return torch.compile(copy.deepcopy(model), dynamic=case.dynamic or None)(x)
    except Exception:  # noqa: BLE001
        return None


def _near(a: torch.Tensor, want: torch.Tensor) -> bool:
    """Finite where `want` is, and within 5 % of it (relative norm) there: a coarse check, enough to tell a
    miscompile from rounding."""
    a, want = a.double(), want.double()
    fin = want.isfinite()
    if not torch.equal(a.isfinite(), fin):
        return False
    diff = (a[fin] - want[fin]).norm()
    return bool(diff <= 0.05 * want[fin].norm() + 1e-6)


_RUN_PACKAGE = """
import sys
{preamble}
runner = torch._inductor.aoti_load_package("model.pt2")
with torch.no_grad():
    torch.save([runner(x) for x in torch.load("io.pt")["x"]], sys.argv[1])
print("ok")
"""


def aoti_package(
    case: Case, model: torch.nn.Module, xs: list[torch.Tensor], options: dict[str, Any], problems: list[str]
) -> list[list[torch.Tensor]]:
    """Export (a `Dim` batch when the case is dynamic), package with `options`, run the package in a fresh
    process each way of PACKAGE_WAYS from another folder with an empty qlower cache: their outputs per way."""
    x = xs[0]
    dim = x.dim() - 2
    shapes = ({dim: torch.export.Dim("m", min=1, max=4096)},) if case.dynamic else None
    if not case.dynamic:
        xs = xs[:1]
    outs: list[list[torch.Tensor]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "build").mkdir()
        ep = torch.export.export(model, (x,), dynamic_shapes=shapes)
        qlower.clear_reports()
        path = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(root / "build" / "model.pt2"), inductor_configs=options
        )
        report = qlower.last_report()
        if not report.pass_ran or not report.entries:
            problems.append(f"aoti: no rows for the package's compile: {report.table()}")
        run_dir = root / "elsewhere"
        run_dir.mkdir()
        os.replace(path, run_dir / "model.pt2")
        torch.save({"x": [t.cpu() if case.device == "cpu" else t for t in xs]}, run_dir / "io.pt")
        env = {**os.environ, "QLOWER_CACHE_DIR": str(root / "empty_cache"), **_package_load_env(case.device)}
        for way, preamble in PACKAGE_WAYS.items():
            out_file = root / f"{way}.pt"
            script = textwrap.dedent(_RUN_PACKAGE).format(preamble=preamble)
            proc = subprocess.run(
                [sys.executable, "-c", script, str(out_file)],
                cwd=run_dir,
                env=env,
                capture_output=True,
                text=True,
                timeout=PACKAGE_TIMEOUT_S,
            )
            if proc.returncode != 0 or proc.stdout.strip() != "ok":
                tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[-400:] or "no output"
                problems.append(f"aoti package, {way}: exit status {proc.returncode}: {tail}")
                continue
            outs.append(torch.load(out_file))
    return outs
