"""Packaging: one import package `qlower` from four source folders; every module imports; patterns/ is device-free."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import shutil
import subprocess
import sys
import zipfile

import qlower
import qlower.lowerings
import qlower.passes
import qlower.patterns
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

DEVICE_WORDS = re.compile(
    r"\b(cpu|cuda|xpu|mps|hpu|npu|mtia|privateuse\w*|sm_?\d\d|avx\w*|capability)\b", re.I
)


def all_module_names() -> list[str]:
    names = set()
    for pkg in (qlower, qlower.passes, qlower.patterns, qlower.lowerings):
        names.add(pkg.__name__)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + "."):
            names.add(info.name)
    return sorted(names)


def test_every_module_imports():
    names = all_module_names()
    assert {"qlower.passes.qlower_pass", "qlower.patterns.woq_int8", "qlower.lowerings.registry"} <= set(
        names
    )
    has_triton = importlib.util.find_spec("triton") is not None
    for name in names:
        if name == "qlower.__main__":
            continue
        if not has_triton and name.startswith("qlower.lowerings.kernels.triton."):
            continue  # kernel sources need Triton; the package itself must import without it
        importlib.import_module(name)


def test_no_generic_top_level_names(tmp_path):
    code = (
        "import importlib.util as u; print([n for n in ('passes','patterns','lowerings') if u.find_spec(n)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_patterns_hold_no_device_names():
    offenders = []
    for path in sorted((ROOT / "patterns").rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if DEVICE_WORDS.search(line) and not line.rstrip().endswith("# qlower: host-device"):
                offenders.append(f"{path.name}:{lineno}: {line.strip()}")
    assert not offenders, "device knowledge belongs in lowerings/:\n" + "\n".join(offenders)


def test_wheel_maps_folders_into_one_package(tmp_path):
    # from a copy of the sources: a build/ folder of an earlier build would hand setuptools stale files
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".whl", "build", "dist", "*.egg-info", "__pycache__", "bench-out", ".devcarry"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    (wheel,) = tmp_path.glob("qlower-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"qlower", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for must in (
        "qlower/passes/qlower_pass.py",
        "qlower/patterns/woq_int8.py",
        "qlower/lowerings/registry.py",
        "qlower/lowerings/kernels/csrc/woq_gemm.cpp",
    ):
        assert must in names
    # every data file the package reads at run time: the kernel sources qlower builds at first use (C++ and
    # CUDA, lowerings/kernels/cpp_build.py and cutlass/build.py) and the tuned tables read at import
    data = sorted(
        p.relative_to(ROOT).as_posix()
        for pattern in (
            "lowerings/kernels/csrc/**/*",
            "lowerings/kernels/**/tuned/*.json",
            "lowerings/aoti/abi.lock",
        )
        for p in ROOT.glob(pattern)
        if p.is_file() and "__pycache__" not in p.parts
    )
    assert any(p.endswith(".cu") for p in data) and any(p.endswith("tuned/h100.json") for p in data), data
    for path in data:  # the tuned config tables, read at import (lowerings/kernels/triton/tuned.py)
        assert f"qlower/{path}" in names, path
