"""AOTInductor: export every family with a dynamic batch dim, compile, load, match eager; qlower's ops are
called through C shims (never the proxy executor); the package also runs in a process without qlower's
Python, on the C++ ops library.

One AOTI compile per (family, device), shared by the tests of that pair (module-scoped fixture).
"""

from __future__ import annotations

import re
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
from qlower.lowerings.aoti import build, shim_ops
from tests.helpers import SUBPROCESS_TIMEOUT_S
from tests.helpers.aoti_cuda import needs_cuda_package_load
from tests.helpers.aoti_models import quantized_mlp

BF16 = torch.bfloat16
PROXY = "aoti_torch_proxy_executor_call_function"
SIZES = (1, 5, 70)  # below and above the CPU by-M crossover (64), and M = 1 (decode)


@dataclass
class Exported:
    family: str
    device: str
    model: nn.Module
    package: str
    wrapper: str
    report: qlower.Report


def wrapper_source(package: str) -> str:
    """The generated C++ wrapper inside an AOTI package."""
    with zipfile.ZipFile(package) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
        return z.read(name).decode()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LOAD_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda_package_load])]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """export(family, device) -> Exported, compiled once per module (AOTI compiles take ~10 s each)."""
    done: dict[tuple[str, str], Exported] = {}

    def get(family: str, device: str) -> Exported:
        if (family, device) not in done:
            model = quantized_mlp(family, device)
            x = torch.randn(4, 64, dtype=BF16, device=device)
            batch = torch.export.Dim("batch", min=1, max=1024)
            ep = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
            path = str(tmp_path_factory.mktemp(f"{family}_{device}") / "model.pt2")
            qlower.clear_reports()
            opts = qlower.inductor_options()
            torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=opts)
            done[family, device] = Exported(
                family, device, model, path, wrapper_source(path), qlower.last_report()
            )
        return done[family, device]

    return get


@pytest.mark.parametrize("device", LOAD_DEVICES)
@pytest.mark.parametrize("family", list(qlower.FAMILIES))
def test_package_matches_eager_at_every_batch_size(export, family, device):
    exported = export(family, device)
    assert len(exported.report.lowered) == 2, exported.report.table()
    runner = torch._inductor.aoti_load_package(exported.package)
    for m in SIZES:
        x = torch.randn(m, 64, dtype=BF16, device=device)
        with torch.no_grad():
            want = exported.model(x)
            got = runner(x)
        assert got.shape == want.shape == (m, 32)
        torch.testing.assert_close(got, want, atol=3e-2, rtol=3e-2, msg=f"M={m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", list(qlower.FAMILIES))
def test_wrapper_calls_c_shims_never_the_proxy_executor(export, family, device):
    exported = export(family, device)
    assert PROXY not in exported.wrapper
    for decision in exported.report.lowered:
        if decision.lowering.startswith("qlower."):  # one of qlower's own ops: its generated shim
            op = decision.lowering.removeprefix("qlower.")
            assert re.search(rf"AOTI_TORCH_ERROR_CODE_CHECK\(aoti_torch_{device}_{op}\(", exported.wrapper)


def test_dynamic_batch_woq_calls_a_qlower_op_through_its_shim(export):
    """A dynamic batch on CPU: one of qlower's ops that choose the kernel by M at run time (which one depends
    on the CPU's ISA level: lowerings/devices/cpu.py, WOQ_GEMM_MAX_M), called through its C shim."""
    exported = export("woq_int8", "cpu")
    (lowering,) = {d.lowering for d in exported.report.lowered}
    assert lowering in ("qlower.woq_int8_mm_by_m", "qlower.woq_int8_gemm"), exported.report.table()
    op = lowering.removeprefix("qlower.")
    assert exported.wrapper.count(f"AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_{op}(") == 2
    assert f"extern AOTITorchError aoti_torch_cpu_{op}(" in exported.wrapper


_WITHOUT_QLOWER = """
import sys, torch
torch.ops.load_library(sys.argv[1])
data = torch.load(sys.argv[3])
runner = torch._inductor.aoti_load_package(sys.argv[2])
for x, want in zip(data["x"], data["want"]):
    torch.testing.assert_close(runner(x), want, atol=0, rtol=0)
for name, schema in data["schemas"].items():
    op = getattr(torch.ops.qlower, name).default
    assert str(op._schema) == schema, (str(op._schema), schema)
    assert torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeExplicitAutograd"), name
for name, (args, want) in data["calls"].items():
    torch.testing.assert_close(getattr(torch.ops.qlower, name)(*args), want, atol=0, rtol=0)
assert not any(m == "qlower" or m.startswith("qlower.") for m in sys.modules)
print("ok")
"""


def test_package_runs_without_qlower_python_on_the_cpp_ops_library(export, tmp_path):
    """A C++ deployment: no qlower Python, the ops come from libqlower_ops.so (schemas generated from Python).

    Every qlower op has a C++ kernel (lowerings/kernels/csrc/qlower_ops.cpp) giving bit-identical results to its Python
    kernel; the package gives bit-identical results at M on both sides of the by-M crossover.
    """
    exported = export("woq_int8", "cpu")
    lib = build.ops_library()
    xs = [torch.randn(m, 64, dtype=BF16) for m in SIZES]
    runner = torch._inductor.aoti_load_package(exported.package)
    with torch.no_grad():
        wants = [runner(x) for x in xs]
    w = torch.randint(-127, 128, (24, 32), dtype=torch.int8)
    calls = {
        "woq_int8_mm_by_m": ((torch.randn(3, 32, dtype=BF16), w, torch.rand(24, dtype=BF16), 2),),
        "woq_int8_gemm": (
            (torch.randn(3, 32, dtype=BF16), w, torch.rand(24, dtype=BF16), None, False, BF16),
        ),
        "int8_mm_min_m": ((torch.randint(-127, 128, (3, 32), dtype=torch.int8), w, 17),),
        "int8_gemm": ((torch.randint(-128, 128, (3, 32), dtype=torch.int8), w, 4),),
        "mx_bytes": ((torch.randint(0, 255, (4, 8), dtype=torch.uint8).view(torch.float8_e8m0fnu),),),
    }
    calls = {name: (args, getattr(torch.ops.qlower, name)(*args)) for name, (args,) in calls.items()}
    schemas = {op.name: str(op.op_overload._schema) for op in shim_ops.qlower_ops()}
    assert set(calls) == set(schemas), "give each qlower op an example call here"
    data = tmp_path / "data.pt"
    torch.save({"x": xs, "want": wants, "schemas": schemas, "calls": calls}, data)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_QLOWER), str(lib.path), exported.package, str(data)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=Path(exported.package).parent,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
