"""Exporting an AOTInductor package, moving it to a folder of its own, and running it in a fresh process
where qlower may be blocked: the steps the portability tests share (tests/integrations/aoti/)."""

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
from torch import nn

import qlower
from tests.helpers import SUBPROCESS_TIMEOUT_S

SIZES = (1, 300)  # the batch sizes a `Dim` package runs at: either side of the CPU by-M crossover (64)


@dataclass
class Moved:
    folder: Path  # holds model.pt2, io.pt (inputs, eager outputs) and libqlower_ops.so, nothing else
    report: qlower.Report
    wrapper: str
    export_cache: Path  # deleted
    name: str = ""  # PACKAGES' entry
    sizes: tuple[int, ...] = SIZES  # the batch sizes io.pt holds

    @property
    def shim(self) -> str:
        return f"aoti_torch_cpu_{self.name}"


def export_and_move(
    model: nn.Module,
    x: torch.Tensor,
    root: Path,
    ops_library: Path | None = None,
    dynamic: bool = True,
    sizes: tuple[int, ...] = SIZES,
) -> Moved:
    """Export `model` (a `Dim` batch, else static) with a private qlower cache, copy the package (and
    `ops_library`) into a fresh folder with the eager outputs at every M in `sizes` (a static package: its
    own M), and delete the export's cache and folder."""
    export_dir, export_cache, folder = root / "export", root / "export_cache", root / "elsewhere"
    export_dir.mkdir()
    folder.mkdir()
    batch = torch.export.Dim("batch", min=1, max=4096)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},) if dynamic else None)
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
    sizes = sizes if dynamic else (x.shape[0],)
    xs = [torch.randn(m, *x.shape[1:], dtype=x.dtype, device=x.device) for m in sizes]
    with torch.no_grad():
        torch.save({"x": xs, "want": [model(x) for x in xs]}, folder / "io.pt")
    shutil.copy(path, folder / "model.pt2")
    shutil.rmtree(export_cache, ignore_errors=True)  # absent where no shim library was built (CUDA Triton)
    shutil.rmtree(export_dir)
    return Moved(folder, report, wrapper, export_cache, sizes=sizes)


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
    assert len(outs) == len(moved.sizes)
    for m, got, want in zip(moved.sizes, outs, io["want"], strict=True):
        assert got.shape == want.shape and got.shape[0] == m and got.dtype == want.dtype
        err = (got.float() - want.float()).abs().max().item()
        assert err <= 0.02 * want.float().abs().max().item(), f"M={m}: max error {err}"


def wrapper_library(moved: Moved, tmp_path: Path) -> Path:
    """The package's one shared library (its wrapper), extracted."""
    with zipfile.ZipFile(moved.folder / "model.pt2") as z:
        (name,) = [n for n in z.namelist() if n.endswith(".so")]
        return Path(z.extract(name, tmp_path))


def elf(args: list[str], path: Path) -> str:
    proc = subprocess.run([*args, str(path)], capture_output=True, text=True, check=True)
    return proc.stdout


# How a process runs a package it was given (the script's preamble): qlower cannot be imported at all; only
# `import qlower` (which registers no op); `qlower.load_ops()`; the C++ ops library, qlower blocked.
WAYS = {
    "qlower_blocked": 'sys.modules["qlower"] = None  # any import of qlower fails\nimport torch',
    "import_qlower": "import torch, qlower",
    "load_ops": "import torch, qlower\nqlower.load_ops()",
    "ops_library": 'sys.modules["qlower"] = None\nimport torch\ntorch.ops.load_library("./libqlower_ops.so")',
}
_RUN = """
import sys
{preamble}
runner = torch._inductor.aoti_load_package("model.pt2")
with torch.no_grad():
    torch.save([runner(x) for x in torch.load("io.pt")["x"]], sys.argv[1])
if {blocked}:
    assert not any(m == "qlower" or m.startswith("qlower.") for m in sys.modules if sys.modules[m] is not None)
print("ok")
"""


def run_script(way: str) -> str:
    return _RUN.format(preamble=WAYS[way], blocked=way in ("qlower_blocked", "ops_library"))
