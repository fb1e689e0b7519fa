"""Loading a qlower library whose operators are already registered never aborts the process.

Every library qlower builds registers through a gate (lowerings/kernels/cpp_build.py, `_GATE_HEADER`): where
its operators exist already it registers nothing, warns, and keeps the reason, which `torch.ops.load_library`
raises as `LibraryConflictError` once qlower's ops are registered (`qlower.load_ops()`, or a compile with
qlower; lowerings/kernels/native.py). Each case runs in a
subprocess: an ungated library aborts it (SIGABRT from a C++ exception thrown out of dlopen).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import qlower
from qlower.lowerings.aoti import build
from qlower.lowerings.kernels import cpp_build, native
from tests.helpers import SUBPROCESS_TIMEOUT_S

pytestmark = pytest.mark.skipif(not native.compiler_available(), reason="needs a C++ compiler")

REFUSED = "registered none of its operators"

# A check that the process's `qlower::woq_int8_mm_by_m` still computes x @ (w * s).T after the refused load.
_OP_RUNS = """
x = torch.randn(5, 32)
w = torch.randint(-127, 128, (16, 32), dtype=torch.int8)
s = torch.rand(16) / 64
got = torch.ops.qlower.woq_int8_mm_by_m(x, w, s, 2)
torch.testing.assert_close(got, (x.double() @ w.double().t() * s.double()).float(), rtol=1e-5, atol=1e-5)
print("op ok")
"""


def _run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def ops_library() -> Path:
    return build.ops_library().path


def test_ops_library_after_import_qlower_raises(ops_library, tmp_path):
    """Both registrations in one process: qlower's ops (`qlower.load_ops()`), then the ops library. A Python
    error, and qlower's ops still run."""
    script = (
        textwrap.dedent(
            """
        import sys, torch, qlower
        qlower.load_ops()
        from qlower.lowerings.kernels.native import LibraryConflictError
        try:
            torch.ops.load_library(sys.argv[1])
        except LibraryConflictError as e:
            print("raised:", str(e).splitlines()[0])
        """
        )
        + _OP_RUNS
    )
    proc = _run(script, str(ops_library), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"raised: libqlower_ops.so {REFUSED}: Tried to register an operator (qlower::")
    assert lines[1] == "op ok"


def test_ops_library_copy_at_another_path_is_refused(ops_library, tmp_path):
    """Without qlower's Python: the same path twice is one load; a copy elsewhere registers nothing, warns once,
    and the first copy's ops keep running."""
    copy = tmp_path / "copy" / "libqlower_ops.so"
    copy.parent.mkdir()
    shutil.copyfile(ops_library, copy)
    script = (
        textwrap.dedent(
            """
        import ctypes, sys, torch
        def reason(path):
            fn = ctypes.CDLL(path).qlower_registration_error
            fn.restype = ctypes.c_char_p
            return fn()
        torch.ops.load_library(sys.argv[1])
        torch.ops.load_library(sys.argv[1])
        print("first:", reason(sys.argv[1]))
        torch.ops.load_library(sys.argv[2])
        print("copy:", reason(sys.argv[2]).decode().splitlines()[0])
        assert "qlower" not in sys.modules
        """
        )
        + _OP_RUNS
    )
    proc = _run(script, str(ops_library), str(copy), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, copied, op = proc.stdout.splitlines()
    assert (first, op) == ("first: None", "op ok")
    assert copied.startswith(f"copy: libqlower_ops.so {REFUSED}: Only a single TORCH_LIBRARY")
    assert proc.stderr.count(REFUSED) == 1


def test_import_qlower_after_the_ops_library_is_a_python_error(ops_library, tmp_path):
    """The other order: registering qlower's ops raises torch's RuntimeError, which names the library, never
    aborts."""
    script = """
        import sys, torch
        torch.ops.load_library(sys.argv[1])
        import qlower
        qlower.load_ops()
        """
    proc = _run(script, str(ops_library), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: Tried to register an operator (qlower::")
    assert "Original registration: registered at libqlower_ops.so: qlower_op_schemas.cpp" in last


def test_second_copy_of_the_native_library_raises(tmp_path):
    """qlower's in-process library loaded twice (a copy): LibraryConflictError; the first copy's kernel runs."""
    copy = tmp_path / "libqlower_native.so"
    shutil.copyfile(cpp_build.native_library().path, copy)
    script = """
        import sys, torch, qlower
        from qlower.lowerings.kernels import native
        from qlower.lowerings.kernels.custom_ops import woq_int8_gemm
        isas = native.supported_isas()
        try:
            torch.ops.load_library(sys.argv[1])
        except native.LibraryConflictError as e:
            print("raised:", str(e).splitlines()[0])
        assert native.supported_isas() == isas
        x = torch.randn(3, 24)
        w = torch.randint(-127, 128, (8, 24), dtype=torch.int8)
        s = torch.rand(8) / 64
        got = woq_int8_gemm(x, w, s, None, False, torch.float32)
        torch.testing.assert_close(got, (x.double() @ w.double().t() * s.double()).float(), rtol=1e-5, atol=1e-5)
        print("kernel ok")
        """
    proc = _run(script, str(copy), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    raised, kernel = proc.stdout.splitlines()
    assert raised.startswith(f"raised: libqlower_native.so {REFUSED}: Only a single TORCH_LIBRARY")
    assert kernel == "kernel ok"


def test_other_libraries_load_as_before():
    """The check reads qlower's gate only: a library without one loads and raises nothing."""
    qlower.load_ops()
    assert getattr(torch.ops.load_library, "qlower_checked", False)  # installed with qlower's ops
    other = Path(torch.__file__).parent / "lib" / "libtorch_global_deps.so"
    torch.ops.load_library(str(other))
    assert native.registration_error(str(other)) is None
    assert str(other) in torch.ops.loaded_libraries
