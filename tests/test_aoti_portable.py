"""AOTInductor packages that call qlower's C shims load wherever they are copied.

Two packages (woq-int8, dynamic batch: one wrapper calls `aoti_torch_cpu_woq_int8_mm_by_m`, the other
`aoti_torch_cpu_woq_int8_gemm`, whose kernel is compiled into the package) are exported with a private qlower
cache, copied into a fresh folder, and the export's cache and folder are deleted. Each load
then runs in a fresh process, in that folder, with `QLOWER_CACHE_DIR` pointing at a new empty directory:
- with qlower's Python (`qlower.load_ops()`: its Python kernels serve the ops);
- without qlower's Python, on the ops library `python -m qlower ops-library` wrote (the recipe in docs/aoti.md).
Both match eager at M = 1 and M = 300 (the by-M op's packed kernel and dequant + GEMM). Two AOTI compiles
on CPU; on CUDA (gpu) one per family, loaded with `qlower.load_ops()`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from aoti_cuda import needs_cuda_package_load
from conftest import SUBPROCESS_TIMEOUT_S
from cpu_woq_choice import with_woq_gemm, without_woq_gemm
from test_aoti_export import quantized_mlp
from torch import nn

import qlower
from qlower.lowerings.aoti import cli

BF16 = torch.bfloat16
K, N = 512, 256
SIZES = (1, 300)  # either side of the CPU by-M crossover (64)
# The package's one qlower op: the by-M op's shim calls the dispatcher, woq_int8_gemm's the kernel compiled
# into the package (lowerings/kernels/cpp_build.py, DIRECT_KERNELS).
OPS = ("woq_int8_mm_by_m", "woq_int8_gemm")


class Int8Linear(nn.Module):
    """gpt-fast's weight-only int8 linear."""

    def __init__(self, w: torch.Tensor, s: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w)
        self.register_buffer("s", s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype)) * self.s


@dataclass
class Moved:
    folder: Path  # holds model.pt2, io.pt (inputs, eager outputs) and libqlower_ops.so, nothing else
    report: qlower.Report
    wrapper: str
    export_cache: Path  # deleted
    op: str = ""  # the qlower op its wrapper calls (OPS)

    @property
    def shim(self) -> str:
        return f"aoti_torch_cpu_{self.op}"


def export_and_move(model: nn.Module, x: torch.Tensor, root: Path, ops_library: Path | None = None) -> Moved:
    """Export `model` (dynamic batch) with a private qlower cache, copy the package (and `ops_library`) into a
    fresh folder with the eager outputs at every M in SIZES, and delete the export's cache and folder."""
    export_dir, export_cache, folder = root / "export", root / "export_cache", root / "elsewhere"
    export_dir.mkdir()
    folder.mkdir()
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QLOWER_CACHE_DIR", str(export_cache))
        qlower.clear_reports()
        opts = qlower.inductor_options(force_disable_caches=True)  # the pass must run: no Inductor cache hit
        path = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(export_dir / "model.pt2"), inductor_configs=opts
        )
        report = qlower.last_report()
    if ops_library is not None:
        shutil.copy(ops_library, folder / ops_library.name)
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
        wrapper = z.read(name).decode()
    xs = [torch.randn(m, *x.shape[1:], dtype=x.dtype, device=x.device) for m in SIZES]
    with torch.no_grad():
        torch.save({"x": xs, "want": [model(x) for x in xs]}, folder / "io.pt")
    shutil.copy(path, folder / "model.pt2")
    shutil.rmtree(export_cache, ignore_errors=True)  # absent where no shim library was built (CUDA Triton)
    shutil.rmtree(export_dir)
    return Moved(folder, report, wrapper, export_cache)


@pytest.fixture(scope="module")
def ops_library(tmp_path_factory) -> Path:
    """libqlower_ops.so as `python -m qlower ops-library` writes it, from a private qlower cache deleted
    afterwards. Built once for both packages: it holds every op whichever one a package calls, and its C++
    build is the slowest step of a package's set-up."""
    root = tmp_path_factory.mktemp("ops_library")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QLOWER_CACHE_DIR", str(root / "cache"))
        assert cli.main(["ops-library", "--out", str(root / "out")]) == 0
    shutil.rmtree(root / "cache")
    (lib,) = (root / "out").iterdir()
    return lib


@pytest.fixture(scope="module", params=list(OPS))
def moved(request, tmp_path_factory, ops_library: Path) -> Moved:
    """The package calling OPS[param]: AUTO's choice pinned, since it depends on the CPU's ISA level."""
    torch.manual_seed(0)
    model = Int8Linear(torch.randint(-127, 128, (N, K), dtype=torch.int8), torch.rand(N, dtype=BF16) / 64)
    x = torch.randn(8, K, dtype=BF16)
    with pytest.MonkeyPatch.context() as mp:
        (with_woq_gemm if request.param == "woq_int8_gemm" else without_woq_gemm)(mp)
        moved = export_and_move(model, x, tmp_path_factory.mktemp("portable"), ops_library)
    moved.op = request.param
    return moved


def run_fresh(moved: Moved, script: str, tmp_path: Path) -> list[torch.Tensor]:
    """Run `script` in a fresh process inside the package's folder with an empty qlower cache; its outputs."""
    empty = tmp_path / "empty_cache"
    empty.mkdir()
    env = {**os.environ, "QLOWER_CACHE_DIR": str(empty)}
    env.pop("LD_LIBRARY_PATH", None)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(tmp_path / "out.pt")],
        cwd=moved.folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == "ok", proc.stdout[-2000:]
    assert not moved.export_cache.exists()
    assert not list(empty.iterdir()), "loading a package built something: it must not need a compiler"
    return torch.load(tmp_path / "out.pt")


def assert_matches_eager(moved: Moved, outs: list[torch.Tensor]) -> None:
    io = torch.load(moved.folder / "io.pt")
    assert len(outs) == len(SIZES)
    for m, got, want in zip(SIZES, outs, io["want"], strict=True):
        assert got.shape == want.shape and got.shape[0] == m and got.dtype == want.dtype
        err = (got.float() - want.float()).abs().max().item()
        assert err <= 0.02 * want.float().abs().max().item(), f"M={m}: max error {err}"


def wrapper_library(moved: Moved, tmp_path: Path) -> Path:
    """The package's one shared library (its wrapper), extracted."""
    with zipfile.ZipFile(moved.folder / "model.pt2") as z:
        (name,) = [n for n in z.namelist() if n.endswith(".so")]
        return Path(z.extract(name, tmp_path))


def _elf(args: list[str], path: Path) -> str:
    proc = subprocess.run([*args, str(path)], capture_output=True, text=True, check=True)
    return proc.stdout


def test_the_package_calls_qlower_through_its_c_shim(moved):
    assert [d.lowering for d in moved.report.lowered] == [f"qlower.{moved.op}"], moved.report.table()
    assert f"AOTI_TORCH_ERROR_CODE_CHECK({moved.shim}(" in moved.wrapper
    assert "aoti_torch_proxy_executor_call_function" not in moved.wrapper


_WITH_QLOWER = """
import sys, torch, qlower
qlower.load_ops()
runner = torch._inductor.aoti_load_package("model.pt2")
with torch.no_grad():
    torch.save([runner(x) for x in torch.load("io.pt")["x"]], sys.argv[1])
print("ok")
"""


def test_moved_package_loads_with_import_qlower_and_an_empty_cache(moved, tmp_path):
    assert_matches_eager(moved, run_fresh(moved, _WITH_QLOWER, tmp_path))


_WITHOUT_QLOWER = """
import sys
sys.modules["qlower"] = None  # any import of qlower fails
import torch
torch.ops.load_library("./libqlower_ops.so")
runner = torch._inductor.aoti_load_package("model.pt2")
with torch.no_grad():
    torch.save([runner(x) for x in torch.load("io.pt")["x"]], sys.argv[1])
assert not any(m.startswith("qlower.") for m in sys.modules)
print("ok")
"""


def test_moved_package_serves_without_qlower_python_on_the_ops_library(moved, tmp_path):
    assert_matches_eager(moved, run_fresh(moved, _WITHOUT_QLOWER, tmp_path))


_NEITHER = """
import sys
sys.modules["qlower"] = None
import torch
runner = torch._inductor.aoti_load_package("model.pt2")
try:
    runner(torch.load("io.pt")["x"][0])
except RuntimeError as e:
    print(e)
"""


_NEITHER_SERVED = """
import sys
sys.modules["qlower"] = None
import torch
runner = torch._inductor.aoti_load_package("model.pt2")
with torch.no_grad():
    torch.save([runner(x) for x in torch.load("io.pt")["x"]], sys.argv[1])
print("ok")
"""


def test_without_registered_ops_the_package_raises_naming_the_op(moved, tmp_path):
    """Neither `import qlower` nor the ops library: an exception that names the op, never a crash; a package
    whose op has a kernel of its own inside (woq_int8_gemm) serves anyway."""
    if moved.op == "woq_int8_gemm":
        assert_matches_eager(moved, run_fresh(moved, _NEITHER_SERVED, tmp_path))
        return
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NEITHER)],
        cwd=moved.folder,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"Could not find schema for qlower::{moved.op}" in proc.stdout, proc.stdout[-2000:]


def test_wrapper_library_holds_its_shims_and_links_no_qlower_library(moved, tmp_path):
    """The shims are linked into the package's own wrapper: no qlower library, no path of the export machine."""
    so = wrapper_library(moved, tmp_path)
    dynamic = _elf(["readelf", "-d"], so)
    assert "qlower" not in dynamic, dynamic  # no NEEDED libqlower_*, no RPATH/RUNPATH into a qlower cache
    assert str(moved.export_cache) not in so.read_bytes().decode("latin-1")
    assert f" {moved.shim}\n" in _elf(["nm", "--defined-only"], so)
    # hidden: another package's copy of the same shim (or a loaded shim library) cannot take its place
    assert f" {moved.shim}\n" not in _elf(["nm", "-D", "--defined-only"], so)


@pytest.mark.gpu
@needs_cuda_package_load
@pytest.mark.parametrize("family", list(qlower.FAMILIES))
def test_moved_cuda_package_loads_with_import_qlower_and_an_empty_cache(family, tmp_path):
    """CUDA wrappers link the same way: the qlower ops a family emits there are called through shims inside."""
    root = tmp_path / "export_root"
    root.mkdir()
    moved = export_and_move(
        quantized_mlp(family, "cuda"), torch.randn(4, 64, dtype=BF16, device="cuda"), root
    )
    assert len(moved.report.lowered) == 2, moved.report.table()
    assert "aoti_torch_proxy_executor_call_function" not in moved.wrapper
    assert "qlower" not in _elf(["readelf", "-d"], wrapper_library(moved, tmp_path))
    assert_matches_eager(moved, run_fresh(moved, _WITH_QLOWER, tmp_path))
