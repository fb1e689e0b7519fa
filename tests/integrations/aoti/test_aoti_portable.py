"""AOTInductor packages that call qlower's C shims run wherever they are copied, with nothing but torch.

Every shim of a qlower op calls the op's C++ kernel compiled into the package's own wrapper
(lowerings/kernels/cpp_build.py, DIRECT_KERNELS), so a package needs no qlower op registered. Packages
(woq-int8 pinned to each qlower op a CPU wrapper can call, with a `Dim` batch; and one model holding every
family, static and `Dim` batch) are exported with a private qlower cache, copied into a fresh folder, and the
export's cache and folder are deleted. Each then runs in a fresh process, in that folder, with
`QLOWER_CACHE_DIR` pointing at a new empty directory, four ways (`WAYS`; the every-family packages the first
alone, `RUNS`): qlower blocked (its import fails), after `import qlower` alone, after `qlower.load_ops()`, and
on the ops library `python -m qlower ops-library` wrote (a C++ deployment's recipe, docs/aoti.md). Each matches eager at every batch size it was run with, and
builds nothing. On CUDA (gpu), one package per family, run the first three ways.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.lowerings.aoti import cli
from qlower.quantize import QUANTIZERS
from tests.helpers.aoti_cuda import needs_cuda_package_load
from tests.helpers.aoti_models import quantize_mx, quantized_mlp
from tests.helpers.aoti_package import (
    WAYS,
    Moved,
    assert_matches_eager,
    elf,
    export_and_move,
    run_fresh,
    run_script,
    wrapper_library,
)
from tests.helpers.cpu_woq_choice import with_woq_gemm, without_woq_gemm

BF16 = torch.bfloat16
K, N = 512, 256
STATIC_M = 8  # the batch a static package was exported with, and the only one it runs
# The qlower ops a CPU wrapper can call for woq-int8 with a dynamic batch, each pinned by `moved`.
OPS = ("woq_int8_mm_by_m", "woq_int8_gemm")
PACKAGES = (*OPS, "families_dim", "families_static")


class Int8Linear(nn.Module):
    """gpt-fast's weight-only int8 linear."""

    def __init__(self, w: torch.Tensor, s: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w)
        self.register_buffer("s", s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype)) * self.s


def every_family_model(device: str = "cpu") -> nn.Module:
    """Two 64x64 linears per family (woq-int8, dynamic int8, MX fp8 then fp4), chained: one package holds
    every family."""
    torch.manual_seed(0)
    blocks = []
    for family in qlower.FAMILIES:
        block = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64)).to(BF16)
        quantize = QUANTIZERS.get(family) or {"mx": quantize_mx}[family]
        assert quantize(block) == 2, family
        blocks.append(block)
    return nn.Sequential(*blocks).to(device).eval()


@pytest.fixture(scope="module")
def ops_library(tmp_path_factory) -> Path:
    """libqlower_ops.so as `python -m qlower ops-library` writes it, from a private qlower cache deleted
    afterwards. Built once for every package: it holds every op whichever one a package calls, and its C++
    build is the slowest step of a package's set-up."""
    root = tmp_path_factory.mktemp("ops_library")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QLOWER_CACHE_DIR", str(root / "cache"))
        assert cli.main(["ops-library", "--out", str(root / "out")]) == 0
    shutil.rmtree(root / "cache")
    (lib,) = (root / "out").iterdir()
    return lib


@pytest.fixture(scope="module", params=list(PACKAGES))
def moved(request, tmp_path_factory, ops_library: Path) -> Moved:
    """PACKAGES[param]: a woq-int8 package calling that qlower op (AUTO's choice pinned, since it depends on
    the CPU's ISA level), or the every-family model with a `Dim` or a static batch."""
    root = tmp_path_factory.mktemp("portable")
    if request.param in OPS:
        torch.manual_seed(0)
        model = Int8Linear(torch.randint(-127, 128, (N, K), dtype=torch.int8), torch.rand(N, dtype=BF16) / 64)
        with pytest.MonkeyPatch.context() as mp:
            (with_woq_gemm if request.param == "woq_int8_gemm" else without_woq_gemm)(mp)
            moved = export_and_move(model, torch.randn(8, K, dtype=BF16), root, ops_library)
    else:
        x = torch.randn(STATIC_M, 64, dtype=BF16)
        moved = export_and_move(
            every_family_model(), x, root, ops_library, dynamic=request.param == "families_dim"
        )
    moved.name = request.param
    return moved


def test_the_package_calls_qlower_through_its_c_shim(moved):
    assert "aoti_torch_proxy_executor_call_function" not in moved.wrapper
    if moved.name not in OPS:
        rows = {d.family for d in moved.report.lowered}
        assert rows == set(qlower.FAMILIES) and len(moved.report.lowered) == 6, moved.report.table()
        return
    assert [d.lowering for d in moved.report.lowered] == [f"qlower.{moved.name}"], moved.report.table()
    assert f"AOTI_TORCH_ERROR_CODE_CHECK({moved.shim}(" in moved.wrapper


# Each package a qlower op's shim is pinned to runs every way; the every-family packages (the slowest to export)
# run the strictest way, qlower blocked: a package that runs so needs nothing of qlower's.
RUNS = [(p, w) for p in OPS for w in WAYS] + [(p, "qlower_blocked") for p in PACKAGES if p not in OPS]


@pytest.mark.parametrize("way", list(WAYS))
def test_moved_package_runs_in_a_fresh_process(moved, way, tmp_path):
    """Every way matches eager; the package builds nothing where it runs (`run_fresh`)."""
    if (moved.name, way) not in RUNS:
        pytest.skip("an every-family package runs qlower-blocked only (RUNS); the op packages run every way")
    assert_matches_eager(moved, run_fresh(moved, run_script(way), tmp_path))


def test_wrapper_library_holds_its_shims_and_links_no_qlower_library(moved, tmp_path):
    """The shims are linked into the package's own wrapper: no qlower library, no path of the export machine."""
    so = wrapper_library(moved, tmp_path)
    dynamic = elf(["readelf", "-d"], so)
    assert "qlower" not in dynamic, dynamic  # no NEEDED libqlower_*, no RPATH/RUNPATH into a qlower cache
    assert str(moved.export_cache) not in so.read_bytes().decode("latin-1")
    if moved.name not in OPS:
        return
    assert f" {moved.shim}\n" in elf(["nm", "--defined-only"], so)
    # hidden: another package's copy of the same shim (or a loaded shim library) cannot take its place
    assert f" {moved.shim}\n" not in elf(["nm", "-D", "--defined-only"], so)


@pytest.mark.gpu
@needs_cuda_package_load
@pytest.mark.parametrize("family", list(qlower.FAMILIES))
def test_moved_cuda_package_runs_in_fresh_processes(family, tmp_path):
    """CUDA wrappers link the same way: the qlower ops a family emits there are called through shims inside,
    and the package runs with qlower blocked, imported, and after load_ops()."""
    root = tmp_path / "export_root"
    root.mkdir()
    moved = export_and_move(
        quantized_mlp(family, "cuda"), torch.randn(4, 64, dtype=BF16, device="cuda"), root
    )
    assert len(moved.report.lowered) == 2, moved.report.table()
    assert "aoti_torch_proxy_executor_call_function" not in moved.wrapper
    assert "qlower" not in elf(["readelf", "-d"], wrapper_library(moved, tmp_path))
    for way in ("qlower_blocked", "import_qlower", "load_ops"):
        run_dir = tmp_path / way
        run_dir.mkdir()
        assert_matches_eager(moved, run_fresh(moved, run_script(way), run_dir))
