"""What several test files share besides the model forms, the one home of test helpers: the subprocess hang
guard (below), the CUDA AOTI package-load check (`aoti_cuda`), the quantized MLPs the AOTI tests export
(`aoti_models`), AUTO's CPU woq choice pinned (`cpu_woq_choice`), GPU-decomposed graphs and woq graphs of any
device traced on any machine (`fake_gpu_trace`), what the Triton kernels' tests share (`triton_launches`). Test
modules import helpers from here, never from each other.

Subprocesses (and spawned ranks) a test waits for get `timeout=SUBPROCESS_TIMEOUT_S`: a guard against a hang,
never a speed limit. A loaded 2-core machine runs a test several times slower than a quiet one
(test_triton_dynamic_m.py's bucket-edge subprocess: 125 s alone, over 300 s under load), and no test may fail
because the machine was slow; speed targets live in the benchmarks (scripts/bench*.py), not in tests.
A subprocess that imports `tests.*` or `scripts.*` runs with `cwd=ROOT`, the repository root; `run_python` runs a
script from tests/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SUBPROCESS_TIMEOUT_S = 3600  # the one hang guard of every subprocess a test runs (see above)
ROOT = Path(__file__).resolve().parents[2]  # the repository root
TESTS = ROOT / "tests"  # run_python's working directory


def run_python(script: str, env: dict[str, str] | None = None) -> str:
    """`script` (dedented) in a fresh Python process with `env` added, from tests/; its stdout. Why a process:
    settings read once at import (TRITON_INTERPRET before Triton is imported) and a crash of ATen's own
    kernels must not take the test process down. Fails the test with the output's tail on a non-zero exit."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=TESTS,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout
