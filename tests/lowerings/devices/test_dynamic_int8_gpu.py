"""CUDA: qlower's own dynamic-int8 lowerings (cuBLASLt `_int_mm` with M padding, the emulated path for K or N
not a multiple of 8, the run-time choice for dynamic M) compiled and run on the GPU, against a float64
reference and the eager model run on CPU (eager CUDA `_int_mm` itself rejects M <= 16 and odd K/N).
No expecttest/torchao: the GPU image lacks them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import qlower
from qlower.lowerings import register_backend, register_builtin_backends
from qlower.lowerings.devices.cuda import DYNAMIC_INT8_INT_MM_CUDA
from qlower.lowerings.devices.emulated import DYNAMIC_INT8_EMULATED
from tests.forms.dynamic_int8 import PT2E, IntMMDivide

pytestmark = pytest.mark.gpu
OPTIONS = dict(families=("dynamic_int8",))


@pytest.fixture(autouse=True)
def only_qlower_cuda_lowerings():
    """Rank only this family's cuBLASLt and emulated lowerings (the Triton kernels are tested elsewhere)."""
    register_backend("cuda", [DYNAMIC_INT8_INT_MM_CUDA, DYNAMIC_INT8_EMULATED], replace=True)
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    register_builtin_backends()


def _check(model, x: torch.Tensor, out: torch.Tensor) -> None:
    cpu_model = copy.deepcopy(model).cpu()
    with torch.no_grad():
        eager = cpu_model(x.cpu())
        ref = cpu_model.reference(x.cpu())
    err = (out.cpu().double() - ref).abs().max().item()
    eager_err = (eager.double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= 1.02 * eager_err + 1e-5 * scale, (err, eager_err)
    assert (out.cpu().double() - eager.double()).abs().max().item() <= 1e-4 * scale


@pytest.mark.parametrize(
    "m, k, n, lowering",
    [
        (1, 256, 512, "aten._int_mm"),  # padded to 17 rows
        (16, 256, 512, "aten._int_mm"),
        (17, 256, 512, "aten._int_mm"),
        (64, 100, 72, "int8_mm_emulated"),  # K % 8 != 0
        (32, 256, 36, "int8_mm_emulated"),  # N % 8 != 0
    ],
)
def test_static_shapes(m, k, n, lowering):
    model = IntMMDivide(k, n).cuda()
    x = torch.randn(2, m, k, device="cuda")
    with torch.no_grad():
        out = torch.compile(model, options=qlower.inductor_options(**OPTIONS))(x)
    assert [d.lowering for d in qlower.last_report()] == [lowering]
    _check(model, x, out)


def test_dynamic_m_pads_only_small_m():
    model = IntMMDivide(256, 512).cuda()
    fn = torch.compile(model, options=qlower.inductor_options(**OPTIONS), dynamic=True)
    with torch.no_grad():
        x = torch.randn(2, 3, 256, device="cuda")
        out, (code,) = run_and_get_code(fn, x)
        assert "int8_mm_min_m" in code
        _check(model, x, out)
        for m in (9, 17, 40):
            x = torch.randn(1, m, 256, device="cuda")
            _check(model, x, fn(x))


def test_pt2e_asymmetric_on_gpu():
    model = PT2E(256, 512, asymmetric=True).cuda()
    x = torch.randn(2, 16, 256, device="cuda") + 0.5
    with torch.no_grad():
        out = torch.compile(model, options=qlower.inductor_options(**OPTIONS))(x)
    assert [d.lowering for d in qlower.last_report()] == ["aten._int_mm"]
    _check(model, x, out)
