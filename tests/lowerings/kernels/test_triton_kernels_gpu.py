"""qlower's CUDA Triton kernels (woq-int8, dynamic-int8) on a GPU (`pytest -m gpu tests/`): numerics vs float64
on shapes off the tile grid (every tuned config, every kernel shape, the inline-PTX conversion bit for bit), and
torch.compile / AOTInductor calling the kernels. Their CPU checks: test_triton_kernels.py.
"""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower.lowerings.devices import crossovers
from qlower.lowerings.kernels.triton import configs
from qlower.lowerings.kernels.triton.configs import decode_dot, mm
from tests.forms.woq_int8 import WoqLinear
from tests.helpers.aoti_cuda import needs_cuda_package_load
from tests.helpers.triton_launches import KERNEL_NAMES

# ------------------------------------------------------------------------------------------------ GPU
GPU_SHAPES = [(100, 72), (1000, 520), (4096, 4096)]  # (K, N): the first two are off every tile grid
GPU_M = [1, 3, 17, 200, 1000]  # 200: AUTO's Triton range above 64 (swap-AB tile), 1000: dequant + mm


def _woq_inputs(m, k, n, dtype, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
    s = (torch.rand(n, device="cuda", generator=g) * 0.02 + 0.005).to(dtype)
    b = torch.randn(n, device="cuda", dtype=dtype, generator=g) if bias else None
    ref = x.double() @ (w.double() * s.double()[:, None]).t()
    return x, w, s, b, (ref if b is None else ref + b.double())


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref).norm() / ref.norm()).item()


TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


# (M, K, N) where the table picks woq_decode_kernel (inline-PTX conversion): M = 1 fma on the three model
# shapes, M = 16 swap-AB dot on 14336->4096
DECODE_POINTS = [(1, 4096, 4096), (1, 4096, 14336), (1, 14336, 4096), (16, 14336, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("key", sorted(configs.WOQ_INT8_TABLE), ids=lambda t: "x".join(map(str, t)))
def test_woq_table_config_at_its_shape(key):
    """Each tuned entry at the shape it was tuned for, and one row fewer (a partial row tile), against float64."""
    from qlower.lowerings.kernels.triton.int8 import ops

    bucket, k, n = key
    cfg = configs.WOQ_INT8_TABLE[key]
    for m in sorted({bucket, max(bucket - 1, 1)}):
        x, w, s, b, ref = _woq_inputs(m, k, n, torch.bfloat16, bias=True, seed=m + n)
        assert _rel(ops.launch_config(cfg, x, w, s, bias=b), ref) < 1e-2, (m, k, n, str(cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "m,k,n", [(m, k, n) for m in GPU_M for k, n in GPU_SHAPES] + DECODE_POINTS[1:]
)  # DECODE_POINTS[0] is already in the grid
def test_woq_op_matches_float64(m, k, n, dtype):
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    x, w, s, b, ref = _woq_inputs(m, k, n, dtype, bias=m % 2 == 1, seed=m + k)
    out = torch.ops.qlower.woq_int8_linear(x, w, s, b)
    assert out.dtype == dtype and _rel(out, ref) < TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg_name", ["gemv", "gemv_splitk", "mm_swap", "mm", "mm_splitk", "mm_i2f", "limbs", "limbs_wide"]
)
def test_woq_every_kernel_shape(cfg_name):
    from qlower.lowerings.kernels.triton.configs import gemv, limbs, mm
    from qlower.lowerings.kernels.triton.int8 import ops

    cfg = {
        "gemv": gemv(1, 16, 512),
        "gemv_splitk": gemv(2, 16, 256, split_k=3),
        "mm_swap": mm(16, 64, 256, 4, 4, swap=True),
        "mm": mm(64, 128, 64, 4, 3),
        "mm_splitk": mm(32, 64, 128, 4, 3, split_k=2),
        "mm_i2f": mm(128, 128, 64, 8, 3, fast=0),
        "limbs": limbs(16, 64, 256, 4, 4),
        "limbs_wide": limbs(128, 128, 128, 8, 3),
    }[cfg_name]
    for m in GPU_M:
        x, w, s, b, ref = _woq_inputs(m, 1000, 520, torch.bfloat16, bias=True, seed=m)
        assert _rel(ops.launch_config(cfg, x, w, s, bias=b), ref) < 1e-2, (m, cfg_name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "fp32_cfg,ptx_cfg",
    [
        (mm(16, 64, 256, 4, 4), mm(16, 64, 256, 4, 4, fast=2)),  # mma.sync, the weight as B
        (mm(64, 64, 128, 4, 4, swap=True), mm(64, 64, 128, 4, 4, swap=True, fast=2)),  # wgmma, register A
        (mm(64, 64, 128, 4, 4, swap=True), mm(64, 64, 128, 4, 4, swap=True, fast=3)),  # 2 per asm call
        (mm(16, 64, 256, 4, 4), mm(16, 64, 256, 4, 4, fast=3)),
        (mm(128, 128, 64, 8, 3), mm(128, 128, 64, 8, 3, fast=2)),  # wgmma, converted B through shared memory
        (decode_dot(16, 32, 256, cvt=2), decode_dot(16, 32, 256, cvt=3)),
    ],
    ids=str,
)
def test_ptx_int8_to_half_matches_fp32_path_bitwise(fp32_cfg, ptx_cfg, dtype):
    """The inline-PTX int8 -> bf16/fp16 conversion is exact, so the tensor cores see the same operands as
    through fp32: outputs must be bit-identical, for every byte value (each column of the weight walks all
    256) and a K off the tile grid (masked tail)."""
    from qlower.lowerings.kernels.triton.int8 import ops

    m, k, n = 17, 1000, 200
    x, _, s, b, _ = _woq_inputs(m, k, n, dtype, bias=True, seed=7)
    w = (torch.arange(n * k, device="cuda").reshape(n, k) * 37 % 256 - 128).to(torch.int8)
    assert w.unique().numel() == 256
    ref = ops.launch_config(fp32_cfg, x, w, s, bias=b)
    out = ops.launch_config(ptx_cfg, x, w, s, bias=b)
    assert torch.equal(out, ref)
    exact = x.double() @ (w.double() * s.double()[:, None]).t() + b.double()
    assert _rel(out, exact) < TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", GPU_SHAPES)
@pytest.mark.parametrize("m", GPU_M)
def test_dynamic_int8_op_matches_float64(m, k, n):
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    x, w, s, b, _ = _woq_inputs(m, k, n, torch.bfloat16, bias=True, seed=m + n)
    xs = x.abs().amax(-1, keepdim=True).float() / 127
    xq = torch.round(x.float() / xs).clamp(-128, 127).to(torch.int8)
    ref = (xq.double() @ w.double().t()) * xs.double() * s.double() + b.double()
    out = torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, b, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and _rel(out, ref) < 1e-2


def _compiled_code(model, xs, dynamic=None, **opts):
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(model, options=qlower.inductor_options(**opts), dynamic=dynamic)
    with torch.no_grad():
        out, code = run_and_get_code(compiled, xs[0])
        rest = [compiled(x) for x in xs[1:]]
    return [out, *rest], "\n".join(code)


KERNEL_OF_KIND = {
    "decode": "woq_decode_kernel",
    "gemv": "woq_int8_gemv_kernel",
    "mm": "qlinear_mm_kernel",
    "limbs": "woq_limb_mm_kernel",
    "tma": "woq_mm_tma_dev_kernel",
}


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["gpt_fast", "kn_weight", "scale_first"])
@pytest.mark.parametrize("m,k,n", [(m, 1000, 520) for m in GPU_M] + DECODE_POINTS + [(4, 4096, 14336)])
def test_compile_calls_triton_kernel(form, m, k, n):
    from qlower.lowerings.kernels.triton import configs
    from qlower.lowerings.kernels.triton.int8 import ops

    bias = (k, n) == (1000, 520) or m % 2 == 1  # the decode points: M 1 with bias, M 16 without
    model = WoqLinear(k, n, torch.bfloat16, form=form, bias=bias).cuda()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    (out,), code = _compiled_code(model, [x])
    # AUTO takes the Triton kernel up to the measured crossover, the fused dequant + mm above it.
    expected = "triton.woq_int8_linear" if m <= crossovers.WOQ_INT8_TRITON_MAX_M else "dequant_mm"
    assert [d.lowering for d in qlower.last_report()] == [expected], qlower.last_report().table()
    if expected.startswith("triton"):
        cfg = configs.woq_int8_config(m, k, n)
        assert KERNEL_OF_KIND[cfg.kernel] in code, str(cfg)  # the table's / rule's kernel for this shape
        if (m, k, n) in DECODE_POINTS:  # inline PTX on the GPU: the fp32 decode (M = 1) or the bf16 tile
            cvt = cfg.cvt if cfg.kernel == "decode" else cfg.fast_cvt
            assert cvt >= 2 and ops._conversion_here(cvt, x) == cvt, str(cfg)
    assert "torch.ops.qlower" not in code  # compiled in, not a Python fallback
    assert _rel(out, model.reference(x)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n, kernel",
    [(1024, 4096, 1024, "woq_mm_tma_dev_kernel"), (600, 1000, 520, "qlinear_mm_kernel")],
)  # K = 1000: rows not 16-byte aligned, so the TMA tile falls back to its pointer twin
def test_compile_large_m_woq_on_the_tma_kernel(m, k, n, kernel):
    """Under the TRITON preference a static M above AUTO's crossover takes the TMA tile (`configs.WOQ_TMA`)."""
    model = WoqLinear(k, n, torch.bfloat16, bias=True).cuda()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    (out,), code = _compiled_code(model, [x], kernel_preference="triton")
    # the explicit preference's lowering, past AUTO's crossover (WOQ_INT8_MAX_M)
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    assert kernel in code and "torch.ops.qlower" not in code
    assert _rel(out, model.reference(x)) < 1e-2


@pytest.mark.gpu
def test_compile_dynamic_m_one_graph_every_bucket():
    model = WoqLinear(1000, 520, torch.bfloat16, bias=True).cuda()
    xs = [torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16) for m in (3, 17, 1000, 5)]
    torch._dynamo.mark_dynamic(xs[0], 0)
    outs, code = _compiled_code(model, xs, kernel_preference="triton")
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    assert "qlinear_mm_kernel" in code
    for out, x in zip(outs, xs, strict=True):
        assert _rel(out, model.reference(x)) < 1e-2


@pytest.mark.gpu
def test_auto_takes_dynamic_m_and_declines_a_large_static_m():
    """AUTO: a symbolic M gets the Triton op (its ranges up to M = 256, dequant + cuBLAS above, inside the op);
    a static M above the crossover gets dequant_mm."""
    model = WoqLinear(1000, 520, torch.bfloat16).cuda()
    xs = [torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16) for m in (17, 3, 300)]
    torch._dynamo.mark_dynamic(xs[0], 0)
    outs, code = _compiled_code(model, xs)
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    assert "woq_dequant_kernel" in code and "qlinear_mm_kernel" in code and "extern_kernels.mm" in code
    for out, x in zip(outs, xs, strict=True):
        assert _rel(out, model.reference(x)) < 1e-2
    _compiled_code(model, [torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)])
    assert [d.lowering for d in qlower.last_report()] == ["dequant_mm"]


@pytest.mark.gpu
@needs_cuda_package_load
def test_aot_inductor_embeds_kernel():
    import zipfile

    model = WoqLinear(1000, 520, torch.bfloat16, bias=True).cuda()
    x = torch.randn(17, 1000, device="cuda", dtype=torch.bfloat16)
    ep = torch.export.export(model, (x,))
    path = torch._inductor.aoti_compile_and_package(ep, inductor_configs=qlower.inductor_options())
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    with zipfile.ZipFile(path) as zf:
        sources = "".join(
            zf.read(n).decode(errors="ignore") for n in zf.namelist() if n.endswith((".cpp", ".h"))
        )
    assert any(name in sources for name in KERNEL_NAMES)
    assert "proxy_executor_call_function" not in sources
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        assert _rel(runner(x), model.reference(x)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n, kernel",
    [(m, 1000, 520, "qlinear_mm_kernel") for m in GPU_M]
    + [(1000, 1000, 520, "qlinear_mm_kernel"), (1000, 4096, 1024, "int8_mm_tma_dev_kernel")],
)  # K = 1000: rows not 16-byte aligned, so the TMA config falls back to the pointer kernel
def test_dynamic_int8_under_compile(m, k, n, kernel):
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    def model(x, w, s):
        xs = x.abs().amax(-1, keepdim=True).float().clamp_min(1e-6) / 127
        xq = torch.round(x.float() / xs).clamp(-128, 127).to(torch.int8)
        return torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, None, x.dtype)

    x, w, s, _, _ = _woq_inputs(m, k, n, torch.bfloat16, bias=False)
    from torch._inductor.utils import run_and_get_code

    out, code = run_and_get_code(torch.compile(model), x, w, s)
    assert kernel in "\n".join(code)
    xs = x.abs().amax(-1, keepdim=True).double() / 127
    ref = (torch.round(x.double() / xs).clamp(-128, 127) @ w.double().t()) * xs * s.double()
    assert _rel(out, ref) < 1e-2
