"""Smoke test of scripts/bench.py's machinery on tiny shapes: grid, compile, check, time, table, files."""

from __future__ import annotations

import builtins
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

SCRIPTS = ROOT / "scripts"


def test_shapes_and_grids() -> None:
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
    with pytest.raises(SystemExit, match="no scripts/bench_families/nope.py"):
        bench.load_family("nope")


def test_bench_quick_tiny_shapes_cpu(tmp_path: Path) -> None:
    """Run as docs/development.md says (no --out): the files go to ./bench-out, never to the committed
    benchmarks/."""
    cmd = [sys.executable, "-m", "scripts.bench", "--quick", "--family", "woq_int8", "--device", "cpu"]
    cmd += ["--shapes", "1x64x64,32x64x128", "--budget", "0.02", "--rotate", "2"]
    committed = {p: p.stat().st_mtime_ns for p in (ROOT / "benchmarks").glob("woq_int8_cpu.*")}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # `-m scripts.bench` from another folder than the root
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {p: p.stat().st_mtime_ns for p in committed} == committed
    assert not (tmp_path / "benchmarks").exists()
    tmp_path = tmp_path / "bench-out"
    data = json.loads((tmp_path / "woq_int8_cpu.json").read_text())
    got = {(r["m"], r["k"], r["n"], r["variant"]) for r in data["results"]}
    variants = bench.load_family("woq_int8").VARIANTS
    assert got == {(m, 64, n, v) for m, n in ((1, 64), (32, 128)) for v in variants}
    for r in data["results"]:
        assert r["seconds"] > 0
        if r["variant"] == "qlower":
            assert not r["lowering"].startswith("LEFT ALONE"), r
    table = (tmp_path / "woq_int8_cpu.md").read_text()
    assert "| 32 | 64→128 |" in table and "torch" in table
    # Progress, stderr not a terminal: one whole line per shape, with the elapsed time and an ETA.
    lines = [line for line in proc.stderr.splitlines() if line.startswith("bench woq_int8 cpu [")]
    assert [line.split()[3] for line in lines] == ["[1/2]", "[2/2]"], proc.stderr
    assert "M=32 K=64 N=128 done" in lines[1] and "ETA 0s" in lines[1] and "\r" not in proc.stderr
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "skipping the plot" in proc.stderr
    else:
        assert (tmp_path / "woq_int8_cpu.png").stat().st_size > 0
    # --replot rebuilds the same table from the JSON without measuring.
    replot = tmp_path / "replot"
    args = ["--family", "woq_int8", "--device", "cpu", "--out", str(replot)]
    assert bench.main([*args, "--replot", str(tmp_path / "woq_int8_cpu.json")]) == 0
    assert (replot / "woq_int8_cpu.md").read_text() == table


def test_out_defaults_to_a_scratch_folder() -> None:
    assert bench.parse_args(["--family", "woq_int8"]).out == "bench-out"
    assert bench.parse_args(["--family", "woq_int8", "--out", "benchmarks"]).out == "benchmarks"


def test_progress_bar_on_a_terminal_redraws_one_line_with_an_eta() -> None:
    stream = io.StringIO()
    bar = bench.Progress(4, "bench woq_int8 cpu", stream=stream, tty=True)
    bar.set_postfix_str("M=1 K=64 N=64 qlower (compile, check)")
    bar.update(1)
    assert "\n" not in stream.getvalue() and stream.getvalue().count("\r") >= 1
    last = stream.getvalue().rsplit("\r", 1)[1]
    assert "[######" in last and "1/4" in last and " 25% " in last and "ETA " in last and "ETA --" not in last
    bar.update(3)
    bar.close()
    text = stream.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    assert "[########################] 4/4 100%" in text.rsplit("\r", 1)[1]


def test_progress_without_a_terminal_prints_a_line_per_shape() -> None:
    stream = io.StringIO()
    bar = bench.Progress(2, "bench mx cpu", stream=stream, tty=False)
    bar.set_postfix_str("M=1 K=64 N=64 bf16 (round 1/5)")  # steps inside a shape print nothing
    assert stream.getvalue() == ""
    bar.set_postfix_str("M=1 K=64 N=64 done")
    bar.update(1)
    bar.close()
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("bench mx cpu [1/2] M=1 K=64 N=64 done · ") and "ETA " in line
    assert "\r" not in stream.getvalue()


def test_plot_without_matplotlib_is_one_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    results = [bench.Result(1, 64, 64, v, 1e-3) for v in ("bf16", "qlower")]
    assert bench.plot(results, "t", tmp_path / "p.png") is None
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "skipping the plot" in err and ".[test]" in err, err
    assert not (tmp_path / "p.png").exists()


def test_the_test_extra_installs_matplotlib() -> None:
    """The README's set-up (scripts/run_tests.sh) installs the test extra: the bench's plot works from it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "matplotlib" in extras["test"]
    assert "'.[test,cuda]'" in (SCRIPTS / "run_tests.sh").read_text()


def test_bench_woq_alias_runs() -> None:
    """Run as a file from the repository root (it runs itself again as `python -m scripts.bench_woq`)."""
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_woq.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=ROOT,
    )
    assert proc.returncode == 0 and "--shapes" in proc.stdout, proc.stderr[-2000:]


CUT_SHORT = """
from scripts import bench

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
    code = CUT_SHORT.format(out=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT
    )
    assert proc.returncode == 0 and "cut short" in proc.stdout, proc.stderr[-2000:]
    data = json.loads((tmp_path / "woq_int8_cpu.json").read_text())
    assert data["meta"]["partial"].startswith("yes")
    assert {(r["m"], r["k"], r["n"]) for r in data["results"]} == {(1, 64, 64)}
    assert "| 1 | 64→64 |" in (tmp_path / "woq_int8_cpu.md").read_text()


def test_timing_median_and_spread() -> None:
    """qlower.timing: the median of the repeats and their spread, IQR / median (inclusive quartiles)."""
    from qlower.timing import format_spread, iqr_spread, summarize

    t = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (t.median, t.n) == (3.0, 5)
    assert t.spread == pytest.approx((4.0 - 2.0) / 3.0)  # Q1 = 2, Q3 = 4
    assert t.spread_text() == "±67%" and format_spread(0.04) == "±4%"
    assert iqr_spread([2.0]) == 0.0 and summarize([2.0]).spread == 0.0
    # one slow repeat of nine (a page fault) leaves the spread small; a third of them slow does not
    assert iqr_spread([1.0] * 8 + [20.0]) == 0.0
    assert iqr_spread([1.0] * 6 + [3.0] * 3) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        summarize([])


def test_timing_warning_on_an_unstable_series_or_a_loaded_machine() -> None:
    from qlower.timing import UNSTABLE_SPREAD, stability_warning, summarize

    steady = summarize([1.00, 1.01, 0.99, 1.02, 1.00])
    swinging = summarize([1.0, 2.5, 1.1, 4.0, 1.2, 3.0])  # load came and went between repeats
    assert steady.spread < UNSTABLE_SPREAD < swinging.spread
    assert stability_warning({"steady": steady.spread}, load=(0.5, 2)) is None
    warning = stability_warning({"steady": steady.spread, "qlower M=16": swinging.spread}, load=(0.5, 2))
    assert warning is not None and warning.startswith("WARNING") and "\n" not in warning
    assert "1 of 2" in warning and "qlower M=16" in warning and swinging.spread_text() in warning
    loaded = stability_warning({"steady": steady.spread}, load=(3.5, 2))
    assert loaded is not None and "load average 3.5 on 2 CPUs" in loaded
    assert stability_warning({}, load=None) is None


def test_bench_table_shows_each_median_with_its_spread(tmp_path: Path) -> None:
    mod = bench.load_family("woq_int8")
    results = [bench.Result(1, 64, 64, v, 2e-3, spread=0.04) for v in mod.VARIANTS]
    results[-1].spread = 0.5
    text = bench.table(results, mod, 1e10)
    assert "2.00 ms ±4%" in text and "2.00 ms ±50% (1.00×)" in text
    warning = bench.timing_warning(results, None)
    assert warning is not None and f"{list(mod.VARIANTS)[-1]} 1x64x64 ±50%" in warning
    meta = {"family": "woq_int8", "device": "cpu", "torch": "x", "date": "d", "bandwidth_GBps": 10.0}
    written = bench.write(tmp_path, "cpu", mod, {**meta, "warning": warning}, results, with_plot=False)
    assert written.splitlines()[2] == warning  # its own line under the header
    old = bench.Result(1, 64, 64, "bf16", 2e-3)  # JSON from before the spread was measured
    assert bench._fmt_result(old) == "2.00 ms"
