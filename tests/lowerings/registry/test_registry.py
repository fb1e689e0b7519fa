"""The backend registry: in-tree devices through fake tensors, the clear error, and out-of-tree onboarding."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch._inductor.decomposition import select_decomp_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import qlower
from qlower.lowerings import registry
from qlower.testing import apply_pass, graph_summary
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S
from tests.helpers.fake_gpu_trace import fake_woq_graph

BF16 = torch.bfloat16


def test_xpu_uses_packed_kernel_for_any_m_and_k():
    gm = fake_woq_graph("xpu", m=512, k=24)
    report = apply_pass(gm)
    assert report.entries[0].lowering == "aten._weight_int8pack_mm"
    assert report.entries[0].device.startswith("xpu")
    assert "= aten._weight_int8pack_mm(" in graph_summary(gm)


def test_cuda_never_uses_packed_kernel():
    for m in (1, 16, 4096):
        gm = fake_woq_graph("cuda", m=m)
        report = apply_pass(gm)
        assert report.entries[0].lowering != "aten._weight_int8pack_mm", report.table()
        assert "_weight_int8pack_mm" not in graph_summary(gm)


def test_explicit_preference_the_device_cannot_honour_raises_clear_error():
    gm = fake_woq_graph("cpu", m=1)
    with pytest.raises(qlower.UnsupportedPlatformError) as err:
        apply_pass(gm, kernel_preference=qlower.KernelPreference.TRITON)
    msg = str(err.value)
    for part in ("platform unsupported", "device=cpu", "family=woq_int8", "kernel_preference=TRITON"):
        assert part in msg, msg
    assert "Preferences that work here: AUTO, ATEN, EMULATED" in msg


def test_explicit_aten_on_unsupported_shape_names_the_reason(monkeypatch):
    import qlower.lowerings.kernels.native

    # without a C++ compiler qlower.woq_int8_gemm (which takes any K) cannot be built: the other ATEN lowerings'
    # shape rules then decide
    monkeypatch.setattr(qlower.lowerings.kernels.native, "compiler_available", lambda: False)
    gm = fake_woq_graph("cpu", m=1, k=24)
    with pytest.raises(
        qlower.UnsupportedPlatformError, match=r"K % 16 == 0 \(K=24\).*work here: AUTO, EMULATED"
    ):
        apply_pass(gm, kernel_preference=qlower.KernelPreference.ATEN)


def test_unregistered_device_left_alone_under_auto_and_error_when_explicit():
    saved = registry.backends()["xpu"]
    qlower.unregister_backend("xpu")
    try:
        gm = fake_woq_graph("xpu")
        report = apply_pass(gm)
        assert report.entries[0].lowering is None
        assert "no qlower backend registered for device type 'xpu'" in report.entries[0].reason
        with pytest.raises(qlower.UnsupportedPlatformError, match="platform unsupported.*xpu.*EMULATED"):
            apply_pass(fake_woq_graph("xpu"), kernel_preference="emulated")
    finally:
        qlower.register_backend("xpu", saved.lowerings, describe=saved.describe, replace=True)


ONBOARDING_SCRIPT = """
import types, torch, qlower
from tests.helpers.fake_gpu_trace import fake_woq_graph
from qlower.testing import apply_pass

# A PrivateUse1 device qlower does not ship, with the tiny device module fake tensors need.
torch.utils.rename_privateuse1_backend("qdev")
mod = types.ModuleType("qdev")
mod.is_available = lambda: True
mod.is_initialized = lambda: True
mod.current_device = lambda: 0
mod.device_count = lambda: 1
mod._is_in_bad_fork = lambda: False
torch._register_device_module("qdev", mod)

calls = []

def emit(graph, rec):
    calls.append(rec)
    from qlower.lowerings.emit.woq_int8 import emit_int8pack_mm
    return emit_int8pack_mm(graph, rec)

plugin = qlower.Lowering(
    name="qdev.packed_woq",
    family="woq_int8",
    kind=qlower.KernelPreference.ATEN,
    supports=lambda rec: None if rec.compute_dtype == torch.bfloat16 else "bf16 only",
    emit=emit,
)
qlower.register_backend("qdev", [plugin])  # the one call: no edit inside qlower

report = apply_pass(fake_woq_graph("qdev", m=8))
assert [d.lowering for d in report] == ["qdev.packed_woq"], report.table()
assert report.entries[0].device.startswith("qdev")
assert len(calls) == 1 and calls[0].shape == (8, 64, 32)
assert "qdev.packed_woq" in report.table()
left = apply_pass(fake_woq_graph("qdev", dtype=torch.float16))
assert left.entries[0].lowering is None and "bf16 only" in left.entries[0].reason
print("ok")
"""


def test_out_of_tree_backend_onboards_with_one_call():
    """A device qlower does not ship declares a lowering with one register_backend call: chosen and reported.

    In a subprocess: renaming PrivateUse1 is permanent for a process and would confuse later compiles.
    """
    proc = subprocess.run(
        [sys.executable, "-c", ONBOARDING_SCRIPT],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=ROOT,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_registering_existing_device_ranks_new_lowering_first():
    first = qlower.Lowering(
        "test.first", "woq_int8", qlower.KernelPreference.EMULATED, lambda r: None, lambda g, r: None
    )
    saved = registry.backends()["cpu"]
    try:
        qlower.register_backend("cpu", [first])
        names = [lw.name for lw in registry.backends()["cpu"].lowerings]
        assert names[0] == "test.first" and "aten._weight_int8pack_mm" in names
    finally:
        qlower.register_backend("cpu", saved.lowerings, describe=saved.describe, replace=True)


def test_register_backend_rejects_bad_input():
    with pytest.raises(TypeError):
        qlower.register_backend("cpu", ["not a lowering"])
    with pytest.raises(ValueError):
        qlower.register_backend("", [])


def test_cuda_graph_with_cpu_scalar_scale():
    """A 0-d CPU scale may legally mix with CUDA tensors; the lowering must keep it legal."""

    def f(x, w, s):
        return torch.nn.functional.linear(x, w.to(x.dtype)) * s

    with FakeTensorMode():
        x = torch.empty(4, 64, dtype=BF16, device="cuda")
        w = torch.empty(32, 64, dtype=torch.int8, device="cuda")
        s = torch.empty((), dtype=BF16)
        gm = make_fx(f, decomposition_table=select_decomp_table())(x, w, s)
    report = apply_pass(gm)
    assert report.entries[0].lowered and report.entries[0].device.startswith("cuda"), report.table()
    text = graph_summary(gm)
    assert "= aten.mm(" in text and "bfloat16[4, 32]" in text


def test_decode_matvec_decomposition_is_still_recognized():
    """torchao's quantize_ turns on coordinate_descent_tuning process-wide; then Inductor decomposes a GPU
    mm with M == 1 into (x[:, :, None] * w[None]).sum(1) before qlower's pass. It must still be found."""
    with torch._inductor.config.patch(coordinate_descent_tuning=True):
        gm = fake_woq_graph("cuda", m=1)
    assert "aten.sum" in graph_summary(gm)
    report = apply_pass(gm)
    (d,) = report.entries
    assert d.lowered and d.form.startswith("matvec"), report.table()
    text = graph_summary(gm)
    assert "aten.sum" not in text and "aten.unsqueeze" not in text, text
