"""Dequantizing lowerings keep the scale where the graph puts it: nothing overflows (or rounds) that the user's
formula keeps finite, and what the user's formula overflows stays overflowed.

`F.linear(x, w.to(fp16)) * s` with s = 1024 is finite for small x; folding s into the fp16 weight first
(127 * 1024 > 65504) made every output inf/NaN. `F.linear(x, w.to(fp16) * s)` is the opposite: eager's weight
is inf there, and a kernel that scales its fp32 accumulator instead would "fix" it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.utils import run_and_get_code
from torch.testing import FileCheck

import qlower
from qlower.lowerings.devices import cpu as cpu_lowerings
from qlower.patterns import mx_format as fmt
from tests.forms.woq_int8 import assert_close_to_reference
from tests.helpers.cpu_woq_choice import with_woq_gemm, without_woq_gemm

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
K, N = 256, 128
SCALES = (1.0, 256.0, 1024.0, 4096.0)
MS = (1, 4, 16, 64)
PACKED, BY_M, SCRATCH, DEQUANT, GEMM = (
    "aten._weight_int8pack_mm",
    "qlower.woq_int8_mm_by_m",
    "qlower.int8_weight_mm",
    "dequant_mm",
    "qlower.woq_int8_gemm",
)


class GptFast(nn.Module):
    """gpt-fast's weight-only int8 linear: the scale multiplies the matmul result."""

    def __init__(self, scale_dtype: torch.dtype = FP16, device: str = "cpu") -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        self.w = nn.Parameter(w.to(device), requires_grad=False)
        self.s = nn.Parameter(torch.ones(N, dtype=scale_dtype, device=device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype)) * self.s

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return (x.double() @ self.w.double().t()) * self.s.double()


class ScaleOnWeight(GptFast):
    """The scale written on the weight: eager rounds w * s to x's dtype (inf in fp16 where |w * s| > 65504)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype) * self.s[:, None].to(x.dtype))


def _x(model: GptFast, m: int, scale: float, seed: int, peak: float = 3e4) -> torch.Tensor:
    """fp16 activations for which the float64 result peaks at `peak` (finite in fp16 after the scale)."""
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randn(m, K, generator=g, dtype=FP32)
    y0 = (x0.double() @ model.w.cpu().double().t()).abs().max().item() * scale
    return (x0 * (peak / y0)).to(FP16).to(model.w.device)


# name -> (kernel_preference, PACKED_MAX_M[fp16], SCRATCH_MIN_BYTES, lowering at static M=1 / M>1 / dynamic).
# qlower.woq_int8_gemm is AUTO's choice only in "woq_gemm"; the others take it out
# (tests/helpers/cpu_woq_choice.py).
CPU_LOWERINGS = {
    "auto": (qlower.KernelPreference.AUTO, None, None, (PACKED, DEQUANT, BY_M)),
    "woq_gemm": (qlower.KernelPreference.AUTO, None, None, (GEMM, GEMM, GEMM)),
    "emulated": (qlower.KernelPreference.EMULATED, None, None, (DEQUANT, DEQUANT, DEQUANT)),
    "packed": (qlower.KernelPreference.ATEN, 64, None, (PACKED, PACKED, BY_M)),  # by_m: packed at every M
    "scratch": (qlower.KernelPreference.ATEN, 0, 0, (SCRATCH, SCRATCH, BY_M)),  # by_m: int8_weight_mm always
}


@pytest.fixture
def force(monkeypatch):
    """Force a CPU lowering at small shapes by moving the crossovers it is chosen by."""

    def apply(name: str) -> qlower.KernelPreference:
        pref, packed_max_m, scratch_min, _ = CPU_LOWERINGS[name]
        (with_woq_gemm if name == "woq_gemm" else without_woq_gemm)(monkeypatch)
        if packed_max_m is not None:
            monkeypatch.setitem(cpu_lowerings.PACKED_MAX_M, FP16, packed_max_m)
        if scratch_min is not None:
            monkeypatch.setattr(cpu_lowerings, "SCRATCH_MIN_BYTES", scratch_min)
        return pref

    return apply


def _check_all_scales(model: GptFast, compiled, m: int, seed: int) -> None:
    """For each scale: finite output where float64 is, within fp16 rounding of float64 (and of eager)."""
    for scale in SCALES:
        model.s.fill_(scale)
        x = _x(model, m, scale, seed)
        with torch.no_grad():
            out, eager, ref = compiled(x), model(x), model.reference(x)
        assert torch.isfinite(eager).all() and ref.abs().max() < 6e4  # the user's formula is finite here
        assert torch.isfinite(out).all(), f"M={m} scale={scale}: {(~torch.isfinite(out)).sum()} non-finite"
        assert_close_to_reference(out, eager, ref)


@pytest.mark.parametrize("lowering", list(CPU_LOWERINGS))
def test_fp16_output_scale_static_m(lowering, force):
    pref = force(lowering)
    model = GptFast()
    for m in MS:
        torch._dynamo.reset()
        compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))
        with torch.no_grad():
            compiled(_x(model, m, 1.0, 0))
        (d,) = qlower.last_report().entries
        assert d.lowering == CPU_LOWERINGS[lowering][3][0 if m == 1 else 1], qlower.last_report().table()
        _check_all_scales(model, compiled, m, seed=m)


@pytest.mark.parametrize("lowering", list(CPU_LOWERINGS))
def test_fp16_output_scale_dynamic_m(lowering, force):
    """One graph for every M (M unbacked, so M = 1 runs it too instead of specializing)."""
    pref = force(lowering)
    model = GptFast()
    compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))
    x = _x(model, 4, 1.0, 0)
    torch._dynamo.decorators.mark_unbacked(x, 0)
    with torch.no_grad():
        compiled(x)
    (d,) = qlower.last_report().entries
    assert d.lowering == CPU_LOWERINGS[lowering][3][2], qlower.last_report().table()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for m in MS:
            _check_all_scales(model, compiled, m, seed=10 + m)


@pytest.mark.parametrize("lowering", list(CPU_LOWERINGS))
def test_fp16_x_fp32_scale_product_is_fp32(lowering, force):
    """fp16 x, fp32 scale: the graph's product is fp32, finite far above 65504; no lowering may round it
    (or its scaled weight) to fp16 on the way."""
    pref = force(lowering)
    model = GptFast(scale_dtype=FP32)
    for m in (1, 16):
        torch._dynamo.reset()
        compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))
        model.s.fill_(4096.0)
        x = _x(model, m, 4096.0, seed=m, peak=1e7)  # mm itself peaks at 2441: fp16 holds it
        with torch.no_grad():
            out, eager, ref = compiled(x), model(x), model.reference(x)
        assert out.dtype == FP32 and torch.isfinite(eager).all()
        assert_close_to_reference(out, eager, ref)


class NumberScale(nn.Module):
    """A Python-number output scale above fp16's range: `mm * 70000.0` is finite in eager for small mm."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.w = nn.Parameter(
            torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g), requires_grad=False
        )
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype)) * self.scale


@pytest.mark.parametrize("lowering", list(CPU_LOWERINGS))
def test_fp16_number_scale_beyond_fp16_range(lowering, force):
    pref = force(lowering)
    model = NumberScale(70000.0)
    for m in (1, 16):
        torch._dynamo.reset()
        g = torch.Generator().manual_seed(m)
        x0 = torch.randn(m, K, generator=g)
        x = (x0 * (0.5 / (x0.double() @ model.w.double().t()).abs().max().item())).to(FP16)
        compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))
        with torch.no_grad():
            out, eager = compiled(x), model(x)
        assert qlower.last_report().entries[0].lowered
        ref = (x.double() @ model.w.double().t()) * 70000.0
        assert torch.isfinite(eager).all()
        assert_close_to_reference(out, eager, ref)


def test_bf16_output_scale_is_not_rounded_into_the_weight(force):
    """Precision, not range: rows of large int8 values that cancel (127 - 126 - 1 + ...) sum exactly in the
    matmul; folding s into a bf16 weight rounds each 127 * s, 126 * s by up to 2**-9 relative first."""
    g = torch.Generator().manual_seed(3)
    base = torch.tensor([127, -126, -1, 0], dtype=torch.int8).repeat(K // 4)
    w = torch.stack([base[torch.randperm(K, generator=g)] for _ in range(N)])
    w[:, 0] += 1  # every row sums to 1 (or so): the exact result is tiny next to its terms
    model = GptFast(scale_dtype=BF16)
    model.w.copy_(w)
    model.s.copy_((torch.rand(N, generator=g) * 0.02 + 0.005).to(BF16))
    x = torch.ones(16, K, dtype=BF16)
    for lowering in ("emulated", "scratch"):
        torch._dynamo.reset()
        pref = force(lowering)
        compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))
        with torch.no_grad():
            out, eager, ref = compiled(x), model(x), model.reference(x)
        assert_close_to_reference(out, eager, ref, slack=1.0)


def _weight_side_x(m: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, K, generator=g) * 1e-3).to(FP16)


@pytest.mark.parametrize(
    "lowering,m,dynamic",
    [
        ("auto", 1, False),
        ("auto", 16, False),
        ("auto", 4, True),
        ("woq_gemm", 16, False),
        ("woq_gemm", 4, True),
        ("scratch", 1, False),
        ("scratch", 16, False),
    ],
)
def test_weight_side_scale_overflows_like_eager(lowering, m, dynamic, force):
    """`F.linear(x, w.to(fp16) * s)` with s = 1024: eager's weight is inf where |w| > 63, so its outputs are
    inf/NaN. qlower computes the graph's own formula (dequant + GEMM, or the scaled weight in the reused
    buffer), not a finite "fix" from the packed kernel's fp32 epilogue; at s = 256 (no overflow) the numbers
    match float64."""
    pref = force(lowering)
    model = ScaleOnWeight()
    compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref), dynamic=dynamic)
    x = _weight_side_x(m, seed=m)
    model.s.fill_(1024.0)
    with torch.no_grad():
        out, eager = compiled(x), model(x)
    assert not torch.isfinite(eager).any()  # every row holds some |w| > 63
    assert not torch.isfinite(out).any()
    model.s.fill_(256.0)
    with torch.no_grad():
        out, eager = compiled(x), model(x)
    assert_close_to_reference(out, eager, x.double() @ (model.w.double() * 256.0).t())
    (d,) = qlower.last_report().entries
    assert d.lowering == {"auto": DEQUANT, "woq_gemm": GEMM}.get(lowering, SCRATCH), (
        qlower.last_report().table()
    )
    if lowering != "woq_gemm":
        assert "scales the weight in fp16" in d.passed_over_text  # why the packed kernels were passed over


class NumberScaleOnWeight(nn.Module):
    def __init__(self, scale: float, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.w = nn.Parameter(
            torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g), requires_grad=False
        )
        self.scale, self.dtype = scale, dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(self.dtype) * self.scale)


@pytest.mark.parametrize(
    "scale,dtype,lowering",
    [(256.0, FP16, PACKED), (1024.0, FP16, DEQUANT), (1024.0, BF16, PACKED)],
)
def test_weight_side_number_scale_is_checked_at_compile_time(scale, dtype, lowering):
    """A Python-number weight scale is known: 128 * 256 fits fp16, so the packed kernel computes the graph;
    128 * 1024 does not, so only the graph's own formula does. bf16's range needs no such care."""
    model = NumberScaleOnWeight(scale, dtype)
    x = (torch.randn(1, K) * 1e-3).to(dtype)
    with torch.no_grad():
        out = torch.compile(model, options=qlower.inductor_options())(x)
        eager = model(x)
    (d,) = qlower.last_report().entries
    assert d.lowering == lowering, qlower.last_report().table()
    finite = torch.isfinite(eager)
    assert torch.equal(torch.isfinite(out), finite)
    ref = x.double() @ (model.w.double() * scale).t()
    if finite.all():
        assert_close_to_reference(out, eager, ref)


def test_dequant_mm_code_scales_the_result_not_the_weight(monkeypatch):
    """The emitted code: the int8 -> fp16 conversion alone feeds the GEMM; the scale is in its epilogue."""
    without_woq_gemm(monkeypatch)
    model = GptFast()
    model.s.fill_(1024.0)
    x = _x(model, 16, 1024.0, seed=0)
    compiled = torch.compile(model, options=qlower.inductor_options())
    with torch.no_grad():
        out, code = run_and_get_code(compiled, x)
    assert qlower.last_report().entries[0].lowering == DEQUANT
    assert torch.isfinite(out).all()
    code = "\n".join(code)
    FileCheck().check("extern_kernels.mm").check_not("_weight_int8pack_mm").run(code)


# ---------------------------------------------------------------------------------------------- MX


def _mx_operands(k_big: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """e4m3 elements and e8m0 codes where some blocks' products exceed fp16's range (code 127 + k_big) and the
    rest are ordinary; x small enough that float64's result is finite in fp16."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(N, K, generator=g) * K**-0.5
    q, e = fmt.quantize(w, "e4m3")
    e = e.clone()
    e[: N // 2, 0] = 127 + k_big  # first half of the channels: one block scaled by 2 ** k_big
    x = (torch.randn(16, K, generator=g) * 2.0**-k_big).to(FP16)
    return x, q, e


def test_mx_fp16_emulation_overflows_where_the_users_fp16_weight_does():
    """The graph dequantizes the MX weight to fp16 itself (`.to(x.dtype)` before the matmul): the emulation
    computes that same fp16 weight, so both are inf/NaN in the same channels and equal elsewhere."""

    def f(x, q, e):
        w = (q.float().view(N, K // 32, 32) * 2 ** (e.float() - 127)[..., None]).view(N, K).to(x.dtype)
        return F.linear(x, w)

    x, q, e = _mx_operands(12)
    with torch.no_grad():
        out = torch.compile(f, options=qlower.inductor_options(families=("mx",)))(x, q, e)
        eager = f(x, q, e)
    assert [d.lowering for d in qlower.last_report()] == ["mx_dequant_mm"]
    finite = torch.isfinite(eager)
    assert not finite[:, : N // 2].any() and finite[:, N // 2 :].all()
    assert torch.equal(torch.isfinite(out), finite)
    w16 = fmt.dequantize_f64(q, e, "e4m3").to(FP16).double()
    ref = x.double() @ w16[N // 2 :].t()
    assert_close_to_reference(out[:, N // 2 :], eager[:, N // 2 :], ref)


def test_mx_fp32_matmul_keeps_the_weight_in_fp32():
    """The graph multiplies in fp32 and casts only the result: the emulation must not put the e8m0-scaled
    weight into fp16 (it would overflow); its output matches float64."""

    def f(x, q, e):
        w = (q.float().view(N, K // 32, 32) * 2 ** (e.float() - 127)[..., None]).view(N, K)
        return (x.float() @ w.t()).to(x.dtype)

    x, q, e = _mx_operands(12)
    with torch.no_grad():
        out = torch.compile(f, options=qlower.inductor_options(families=("mx",)))(x, q, e)
        eager = f(x, q, e)
    assert [d.lowering for d in qlower.last_report()] == ["mx_dequant_mm"]
    ref = x.double() @ fmt.dequantize_f64(q, e, "e4m3").t()
    assert torch.isfinite(eager).all() and torch.isfinite(out).all()
    assert_close_to_reference(out, eager, ref)


# --------------------------------------------------------------------------------------------- CUDA

CUDA_LOWERINGS = {  # name -> (kernel_preference, lowering at static M <= 256, lowering at dynamic M)
    # AUTO at a symbolic M: the Triton op, whose launches pick per M bucket (dequant + cuBLAS above M = 256)
    "auto": (qlower.KernelPreference.AUTO, "triton.woq_int8_linear", "triton.woq_int8_linear"),
    "triton": (qlower.KernelPreference.TRITON, "triton.woq_int8_linear", "triton.woq_int8_linear"),
    "emulated": (qlower.KernelPreference.EMULATED, DEQUANT, DEQUANT),
}


@pytest.mark.gpu
@pytest.mark.parametrize("lowering", list(CUDA_LOWERINGS))
@pytest.mark.parametrize("dynamic", [False, True])
def test_cuda_fp16_output_scale(lowering, dynamic):
    """Dynamic: M = 4 compiles a graph with a symbolic M that M = 16 and 64 reuse; M = 1 specializes."""
    pref, static_name, dynamic_name = CUDA_LOWERINGS[lowering]
    model = GptFast(device="cuda")
    opts = qlower.inductor_options(kernel_preference=pref)
    compiled = torch.compile(model, options=opts)
    for m in (4, 16, 64, 1) if dynamic else MS:
        if not dynamic:
            torch._dynamo.reset()
            compiled = torch.compile(model, options=opts)
        x = _x(model, m, 1.0, 0)
        if dynamic and m > 1:
            torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad():
            compiled(x)
        if not dynamic or m == 4:
            (d,) = qlower.last_report().entries
            assert d.lowering == (dynamic_name if dynamic else static_name), qlower.last_report().table()
        _check_all_scales(model, compiled, m, seed=m)


@pytest.mark.gpu
@pytest.mark.parametrize("lowering", list(CUDA_LOWERINGS))
def test_cuda_fp16_x_fp32_scale_product_is_fp32(lowering):
    """The Triton kernel stores x's dtype: with an fp32 product it runs unscaled and the scale follows in fp32."""
    pref, static_name, _ = CUDA_LOWERINGS[lowering]
    model = GptFast(scale_dtype=FP32, device="cuda")
    for m in (1, 16):
        torch._dynamo.reset()
        compiled = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))
        model.s.fill_(4096.0)
        x = _x(model, m, 4096.0, seed=m, peak=1e7)
        with torch.no_grad():
            out, eager, ref = compiled(x), model(x), model.reference(x)
        assert qlower.last_report().entries[0].lowering == static_name
        assert out.dtype == FP32 and torch.isfinite(eager).all()
        assert_close_to_reference(out, eager, ref)


@pytest.mark.gpu
def test_cuda_weight_side_fp16_scale_overflows_like_eager():
    model = ScaleOnWeight(device="cuda")
    compiled = torch.compile(model, options=qlower.inductor_options())
    x = _weight_side_x(4, seed=0).cuda()
    with torch.no_grad():
        compiled(x)
    (d,) = qlower.last_report().entries
    assert d.lowering == DEQUANT and "scales the weight in fp16" in d.passed_over_text, (
        qlower.last_report().table()
    )
    model.s.fill_(1024.0)
    with torch.no_grad():
        out, eager = compiled(x), model(x)
    assert not torch.isfinite(eager).any() and not torch.isfinite(out).any()
