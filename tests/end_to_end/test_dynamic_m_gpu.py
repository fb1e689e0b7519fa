"""A symbolic M on CUDA (automatic dynamic shapes, `dynamic=True`, export `Dim`s): per M bucket the kernel a static
compile picks, chosen on the host from the size (`configs.dynamic_plan`, gated grids), right at every bucket
boundary, captured by CUDA graphs, and inside AOTInductor packages. The plan itself (every M covered once, the
static configs) is checked on CPU in tests/lowerings/kernels/test_triton_dynamic_m.py."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import run_and_get_code

import qlower
from tests.forms.dynamic_int8 import IntMMDivide
from tests.forms.woq_int8 import WoqLinear
from tests.helpers.aoti_cuda import needs_cuda_package_load

pytestmark = pytest.mark.gpu

EDGES = (2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000)  # M = 1 specializes (0/1): its own graph, below
K, N = 4096, 4096  # a tuned shape: the device table's entries, not only the rules


def _model(family: str) -> torch.nn.Module:
    cpu = WoqLinear(K, N, torch.bfloat16, bias=True) if family == "woq_int8" else IntMMDivide(K, N)
    return cpu


def _ref(cpu_model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return cpu_model.reference(x.cpu()).to(torch.float64)


TOL = {"woq_int8": 1e-2, "dynamic_int8": 2e-2}  # dynamic-int8: the per-token activation rounding too


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().cpu() - ref).norm() / ref.norm()).item()


def _kernels(code: str) -> set[str]:
    return set(re.findall(r"\b(woq_decode_kernel|qlinear_mm_kernel|woq_mm_tma_dev_kernel|int8_mm_tma_dev_kernel"
                          r"|woq_int8_gemv_kernel|woq_dequant_kernel)", code))  # fmt: skip


@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8"])
def test_dynamic_m_matches_float64_at_every_bucket_edge(family):
    torch._dynamo.reset()
    cpu_model = _model(family)
    model = copy.deepcopy(cpu_model).cuda()
    compiled = torch.compile(model, dynamic=True, options=qlower.inductor_options())
    with torch.no_grad():
        for m in (1, *EDGES):
            x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
            assert _rel(compiled(x), _ref(cpu_model, x)) < TOL[family], (family, m)
    lowered = [d.lowering for r in qlower.all_reports()[-2:] for d in r]
    want = "triton.woq_int8_linear" if family == "woq_int8" else "triton.int8_dynamic_linear"
    assert lowered == [want, want], qlower.last_report().table()


@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8"])
def test_dynamic_compile_emits_the_kernels_static_compiles_pick(family):
    cpu_model = _model(family)
    model = copy.deepcopy(cpu_model).cuda()
    static: set[str] = set()
    with torch.no_grad():
        for m in (2, 16, 64, 128, 256):
            torch._dynamo.reset()
            x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
            _, code = run_and_get_code(torch.compile(model, options=qlower.inductor_options()), x)
            static |= _kernels("\n".join(code))
        torch._dynamo.reset()
        x = torch.randn(17, K, dtype=torch.bfloat16, device="cuda")
        compiled = torch.compile(model, dynamic=True, options=qlower.inductor_options())
        _, code = run_and_get_code(compiled, x)
    dynamic = _kernels("\n".join(code))
    assert static and static <= dynamic, (static, dynamic)
    if family == "woq_int8":  # AUTO's cuBLAS range above M = 256: the gated weight dequantization
        assert "woq_dequant_kernel" in dynamic and "extern_kernels.addmm" in "\n".join(code)


@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8"])
def test_cuda_graphs_capture_dynamic_m_without_skips(family):
    torch._dynamo.reset()
    counters.clear()
    cpu_model = _model(family)
    model = copy.deepcopy(cpu_model).cuda()
    compiled = torch.compile(model, dynamic=True, options=qlower.inductor_options(mode="reduce-overhead"))
    with torch.no_grad():
        for m in (1, 16, 4, 300, 16, 1):
            x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
            for _ in range(3):  # record, then replay
                out = compiled(x)
            assert _rel(out, _ref(cpu_model, x)) < TOL[family], (family, m)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


def test_dynamic_m_split_k_range_under_cuda_graphs():
    """At 14336->4096 the device's table splits K for some static M bucket (H200: M 3..16 in two, H100:
    M 17..128 in four); a symbolic M under CUDA graphs runs that split launch (its own fp32 buffer, a gated cast
    into the shared output) in its range and the other ranges' kernels elsewhere, right at each edge, with the
    same split a static compile at that M emits."""
    from qlower.lowerings.kernels.triton import configs

    k, n = 14336, 4096
    split_m = next((m for m in configs.M_BUCKETS if configs.woq_int8_config(m, k, n).split_k > 1), None)
    if split_m is None:
        pytest.skip(f"{torch.cuda.get_device_name()}: no M bucket splits K at {k}->{n}")
    split_k = configs.woq_int8_config(split_m, k, n).split_k
    torch._dynamo.reset()
    counters.clear()
    cpu_model = WoqLinear(k, n, torch.bfloat16, bias=True)
    model = copy.deepcopy(cpu_model).cuda()
    opts = qlower.inductor_options(mode="reduce-overhead")
    with torch.no_grad():
        x_split = torch.randn(split_m, k, dtype=torch.bfloat16, device="cuda")
        _, static_code = run_and_get_code(torch.compile(model, options=opts), x_split)
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=True, options=opts)
        _, code = run_and_get_code(compiled, torch.randn(5, k, dtype=torch.bfloat16, device="cuda"))
        edges = sorted(
            {1, 2, 3, 4, 15, 16, 17, 64, 300} | {b + d for b in configs.M_BUCKETS if b <= 256 for d in (0, 1)}
        )
        for m in [*edges, split_m]:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            for _ in range(3):  # record, then replay
                out = compiled(x)
            assert _rel(out, _ref(cpu_model, x)) < TOL["woq_int8"], m
    split = re.compile(rf"SPLIT_K['\"]?: {split_k}\b")
    dynamic = "\n".join(code)
    assert split.search("\n".join(static_code)), f"the static M = {split_m} compile does not split K"
    assert split.search(dynamic) and "splitk_reduce_kernel" in dynamic, (
        "the symbolic M's range lost its split"
    )
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


def _kernels_per_call(fn, x) -> list[str]:
    """The CUDA kernels one call launches (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8"])
def test_default_mode_dynamic_m_launches_one_kernel_per_call(family):
    """Without CUDA graphs a symbolic M picks its kernel with a host `if` (`torch.cond`, generated into the
    wrapper): one call launches its bucket's kernel only, not one gated launch per bucket (the host cost per
    call). woq-int8 M > 256 runs the weight dequantization + cuBLAS; dynamic-int8 adds its quantize kernel."""
    torch._dynamo.reset()
    cpu_model = _model(family)
    model = copy.deepcopy(cpu_model).cuda()
    compiled = torch.compile(model, dynamic=True, options=qlower.inductor_options())
    with torch.no_grad():
        x = torch.randn(17, K, dtype=torch.bfloat16, device="cuda")
        _, code = run_and_get_code(compiled, x)
        assert re.search(r"\bif [su]\d+ <= \d+:", "\n".join(code)), "no host branch on M in the wrapper"
        for m in (2, 16, 17, 100, 256, 300):
            x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
            assert _rel(compiled(x), _ref(cpu_model, x)) < TOL[family], (family, m)
            ours = [k for k in _kernels_per_call(compiled, x) if _kernels(k)]  # qlower's, not cuBLAS's
            if family == "woq_int8" and m > 256:
                assert len(ours) == 1 and "woq_dequant_kernel" in ours[0], (m, ours)
            else:
                assert len(ours) == 1 and "woq_dequant_kernel" not in ours[0], (family, m, ours)


@needs_cuda_package_load
def test_aoti_package_with_a_dim_batch_runs_every_bucket(tmp_path):
    from torch.export import Dim, export

    cpu_model = _model("woq_int8")
    model = copy.deepcopy(cpu_model).cuda()
    x = torch.randn(8, K, dtype=torch.bfloat16, device="cuda")
    ep = export(model, (x,), dynamic_shapes=({0: Dim("m", min=1, max=4096)},))
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(tmp_path / "woq.pt2"), inductor_configs=qlower.inductor_options()
    )
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"], (
        qlower.last_report().table()
    )
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        for m in (1, *EDGES):
            x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
            assert _rel(runner(x), _ref(cpu_model, x)) < 1e-2, m
