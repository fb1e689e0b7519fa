"""Smoke test of scripts/bench.py's machinery on tiny shapes: grid, compile, check, time, table, files."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _load_bench():
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module("bench")


def test_shapes_and_grids() -> None:
    bench = _load_bench()
    assert bench.parse_shapes("1x64x64,16X64x128") == [(1, 64, 64), (16, 64, 128)]
    fam = bench.load_family("woq_int8")
    assert bench.grid(fam, False, None) == {
        (4096, 4096): [1, 4, 16, 128, 1024],
        (4096, 14336): [1, 4, 16, 128, 1024],
    }
    assert bench.grid(fam, False, None, "cuda")[(4096, 4096)] == [1, 4, 16, 128, 1024, 4096]  # GRID_M_CUDA
    assert bench.grid(fam, True, "1x64x64,4x64x64,1x32x64") == {(64, 64): [1, 4], (32, 64): [1]}
    assert {"bf16", "stock", "qlower"} <= set(fam.VARIANTS)


def test_missing_family_module_is_a_clear_error() -> None:
    bench = _load_bench()
    with pytest.raises(SystemExit, match="no scripts/bench_nope.py"):
        bench.load_family("nope")


def test_bench_quick_tiny_shapes_cpu(tmp_path: Path) -> None:
    cmd = [sys.executable, str(SCRIPTS / "bench.py"), "--quick", "--family", "woq_int8", "--device", "cpu"]
    cmd += ["--shapes", "1x64x64,32x64x128", "--out", str(tmp_path), "--budget", "0.02", "--rotate", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((tmp_path / "woq_int8_cpu.json").read_text())
    got = {(r["m"], r["k"], r["n"], r["variant"]) for r in data["results"]}
    variants = _load_bench().load_family("woq_int8").VARIANTS
    assert got == {(m, 64, n, v) for m, n in ((1, 64), (32, 128)) for v in variants}
    for r in data["results"]:
        assert r["seconds"] > 0
        if r["variant"] == "qlower":
            assert not r["lowering"].startswith("LEFT ALONE"), r
    table = (tmp_path / "woq_int8_cpu.md").read_text()
    assert "| 32 | 64→128 |" in table and "torch" in table
    steps = 2 * len(variants)
    assert (
        f"[{steps}/{steps}]" in proc.stderr
    )  # progress over the grid (plain lines when stderr is not a tty)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "skipping the plot" in proc.stderr
    else:
        assert (tmp_path / "woq_int8_cpu.png").stat().st_size > 0
    # --replot rebuilds the same table from the JSON without measuring.
    replot = tmp_path / "replot"
    args = ["--family", "woq_int8", "--device", "cpu", "--out", str(replot)]
    assert _load_bench().main([*args, "--replot", str(tmp_path / "woq_int8_cpu.json")]) == 0
    assert (replot / "woq_int8_cpu.md").read_text() == table


def test_bench_woq_alias_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_woq.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--shapes" in proc.stdout


CUT_SHORT = """
import sys
sys.path.insert(0, {scripts!r})
import bench

real_run_kn = bench.run_kn


def run_kn(mod, device, k, n, *args):
    if (k, n) == (32, 64):
        raise TimeoutError("cut")
    return real_run_kn(mod, device, k, n, *args)


bench.run_kn = run_kn
try:
    bench.main(["--family", "woq_int8", "--shapes", "1x64x64,1x32x64", "--out", {out!r}, "--threads", "1"])
except TimeoutError:
    print("cut short")
"""


def test_a_run_cut_short_keeps_its_finished_tables(tmp_path: Path) -> None:
    """After each (K, N) the tables so far are on disk, marked partial: a time limit loses only the rest.
    (In a subprocess: bench.main sets process-wide torch configs.)"""
    code = CUT_SHORT.format(scripts=str(SCRIPTS), out=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "cut short" in proc.stdout, proc.stderr[-2000:]
    data = json.loads((tmp_path / "woq_int8_cpu.json").read_text())
    assert data["meta"]["partial"].startswith("yes")
    assert {(r["m"], r["k"], r["n"]) for r in data["results"]} == {(1, 64, 64)}
    assert "| 1 | 64→64 |" in (tmp_path / "woq_int8_cpu.md").read_text()
