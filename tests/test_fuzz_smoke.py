"""Smoke test of scripts/fuzz_compile.py on CPU: a few seeded cases end to end, every family, a JSON record.

The fuzz is the tool that checks qlower against inputs the unit tests do not pin (see BENCHMARKS.md, session
4); this keeps it runnable. A qlower failure in these cases fails the test (the script exits 1).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "fuzz_compile.py"
OK = {"pass", "left_alone", "declined", "unmatched", "misrecognized", "imprecise", "upstream"}


def test_fuzz_runs_and_records_every_case(tmp_path: Path) -> None:
    cmd = [sys.executable, "-P", str(SCRIPT), "--device", "cpu", "--cases", "6", "--seed", "11",
           "--budget-s", "120", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "fuzz_cpu.json").read_text())
    cases = record["cases"]
    assert len(cases) == 6 and {c["outcome"] for c in cases} <= OK, [(c["seed"], c["outcome"]) for c in cases]
    assert {c["family"] for c in cases} <= {"woq_int8", "dynamic_int8", "mx"}
    assert all(c["seed"] and c["m"] >= 1 for c in cases)
    assert "qlower failures: 0" in proc.stdout
