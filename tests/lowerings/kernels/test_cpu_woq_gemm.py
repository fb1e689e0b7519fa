"""qlower::woq_int8_gemm, the CPU GEMM with int8 -> float inside the kernel (lowerings/kernels/csrc/woq_gemm.cpp).

Eager calls on small shapes against float64 and against the formula's own roundings, on every ISA path the CPU
has (QLOWER_CPU_WOQ_ISA forces one; the others skip), each through the kernel's direct and chunked paths
(QLOWER_CPU_WOQ_GEMM_PATH forces one), then one AOTInductor compile: the report picks the kernel, the wrapper
calls its C shim, and the package runs on libqlower_ops.so in a process without qlower.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.utils import run_and_get_code
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import qlower
from qlower.lowerings.aoti import build
from qlower.lowerings.devices import cpu as cpu_lowerings
from qlower.lowerings.kernels import custom_ops, native
from tests.helpers import SUBPROCESS_TIMEOUT_S
from tests.helpers.cpu_woq_choice import with_woq_gemm

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = (BF16, FP16, FP32)
ISAS = ("scalar", "avx2", "avx512", "avx512_bf16")
# (M, K, N): K and N off the vector widths (1, 7, 33, 4097); on the direct path M = 17 and 260 take the
# converted-buffer kernels (M > 8, as does a scaled weight), M <= 8 the in-register ones; N = 70 spans two column
# blocks, M = 260 two row blocks, K = 4097 five K blocks of the buffered kernels.
SHAPES = ((1, 1, 1), (1, 7, 33), (3, 33, 7), (5, 33, 70), (17, 4097, 9), (1, 4097, 7), (260, 8, 5))
# max |got - float64| / max |float64|: two roundings to x's dtype (matmul, then scale or bias)
REL_TOL = {BF16: 2**-7, FP16: 2**-10, FP32: 1e-5}


PATHS = ("direct", "chunked")
# The AMX and panel paths serve bf16 x with a [N, K] weight; forced for other operands they run auto's choice.
AMX = ("avx512_bf16", "amx")
PANEL = ("avx512_bf16", "panel")


def skip_without_amx() -> None:
    if "amx_bf16" not in native.supported_isas():
        pytest.skip(f"no AMX-BF16 tiles here (ISAs: {native.supported_isas()})")


@pytest.fixture(
    params=[*[(i, p) for p in PATHS for i in ISAS], AMX, PANEL], ids=lambda ip: f"{ip[0]}-{ip[1]}"
)
def isa(request, monkeypatch):
    """Each ISA path of the kernel, forced, through each of its paths (direct: its own micro-kernel; chunked:
    its conversion and epilogue around ATen's GEMM; amx: AMX-BF16 tiles; panel: converted VNNI panels and
    broadcast rows); skipped where this CPU lacks it."""
    name, path = request.param
    if path == "amx":
        skip_without_amx()
    if name not in native.supported_isas():
        pytest.skip(f"this CPU has only {native.supported_isas()}")
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, name)
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, path)
    return f"{name}-{path}"


def _operands(m: int, k: int, n: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, generator=g) + 0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    return x, w, s, b


def _float64(x, w, s, b, form: str) -> torch.Tensor:
    """The formula in float64 (the weight-scale form with the weight as the graph rounds it)."""
    if form.startswith("weight_scale"):
        wq = (w.to(x.dtype) * s[:, None]).double()
    else:
        wq = w.double()
    y = x.double() @ wq.t()
    if form.startswith("output_scale"):
        y = y * s.double()
    return y + b.double() if form.endswith("bias") else y


def _call(x, w, s, b, form: str, out_dtype: torch.dtype | None = None):
    scale = s if form.startswith(("output_scale", "weight_scale")) else None
    bias = b if form.endswith("bias") else None
    return custom_ops.woq_int8_gemm(x, w, scale, bias, form.startswith("weight"), out_dtype or x.dtype)


FORMS = ("no_scale", "output_scale", "weight_scale", "bias", "output_scale_bias", "weight_scale_bias")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64_on_every_isa(isa, dtype):
    for m, k, n in SHAPES:
        x, w, s, b = _operands(m, k, n, dtype)
        for form in FORMS:
            got = _call(x, w, s, b, form)
            ref = _float64(x, w, s, b, form)
            assert got.dtype == dtype and got.shape == (m, n)
            err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
            assert err <= REL_TOL[dtype], f"{isa} {dtype} (M, K, N)=({m}, {k}, {n}) {form}: rel err {err:.3g}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_exact_sums_give_the_formulas_own_roundings(isa, dtype):
    """Activations in {-1, 0, 1} make every fp32 sum exact (K = 37: |sum| < 2^14, and a weight-scale weight
    w * s, s = 1 + j/64, keeps 10 bits below 1 at most): what is left is the formula's roundings, which the
    kernel must take as eager does (matmul rounded to x's dtype; times the scale in fp32, rounded; plus the
    bias, rounded; the weight-scale form rounds w * s to x's dtype first)."""
    m, k, n = 10, 37, 29
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-1, 2, (m, k), generator=g).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    s = (torch.rand(n, generator=g) * 3 + 0.01).to(dtype)
    s_w = 1 + torch.randint(0, 64, (n,), generator=g).to(dtype) / 64
    b = torch.randn(n, generator=g).to(dtype)
    mm = (x.double() @ w.double().t()).to(dtype)  # the exact sum, rounded once
    cases = {
        "no_scale": (s, mm),
        "output_scale": (s, mm * s),
        "bias": (s, mm + b),
        "output_scale_bias": (s, mm * s + b),
        "weight_scale": (s_w, F.linear(x.double(), (w.to(dtype) * s_w[:, None]).double()).to(dtype)),
    }
    for form, (scale, expected) in cases.items():
        for rows in (slice(0, 3), slice(0, 10)):  # direct: in-register (M <= 8) and buffered (M > 8) kernels
            got = _call(x[rows], w, scale, b, form)
            torch.testing.assert_close(got, expected[rows], atol=0, rtol=0, msg=f"{isa} {form} rows {rows}")


def test_fp32_scale_gives_an_fp32_product(isa):
    """bf16 x with an fp32 scale: the graph's product is fp32, (mm rounded to bf16) * s in fp32."""
    x, w, _, b = _operands(5, 40, 24, BF16)
    s = torch.rand(24) / 7
    got = _call(x, w, s, b, "output_scale_bias", FP32)
    want = F.linear(x, w.to(BF16)).float() * s + b
    assert got.dtype == FP32
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2**-7)


def test_fp16_weight_scale_overflows_where_the_graph_does(isa):
    """`w.to(fp16) * s` is inf where |w * s| > 65504: eager's output is inf/NaN there, and so is the kernel's."""
    x, w, _, _ = _operands(3, 16, 8, FP16)
    w[0].fill_(127)
    s = torch.full((8,), 1 / 64, dtype=FP16)
    s[0] = 1024.0  # 127 * 1024 = 130048 > 65504
    got = _call(x, w, s, None, "weight_scale")
    eager = F.linear(x, w.to(FP16) * s[:, None])
    assert not torch.isfinite(eager[:, 0]).any() and not torch.isfinite(got[:, 0]).any()
    torch.testing.assert_close(got[:, 1:], eager[:, 1:], atol=1e-3, rtol=2**-9)


def test_empty_and_strided_operands(isa):
    x, w, s, b = _operands(5, 33, 20, BF16)
    empty = _call(x[:0], w, s, b, "output_scale_bias")
    assert empty.shape == (0, 20) and empty.dtype == BF16
    want = _call(x, w, s, b, "output_scale_bias")
    wide = torch.zeros(5, 80, dtype=BF16)
    wide[:, 7:40] = x  # rows with a stride of 80 elements
    every_other = torch.zeros(5, 66, dtype=BF16)
    every_other[:, ::2] = x  # an inner stride of 2 (the kernel copies it)
    for view in (wide[:, 7:40], every_other[:, ::2]):
        assert not view.is_contiguous()
        torch.testing.assert_close(_call(view, w, s, b, "output_scale_bias"), want, atol=0, rtol=0)


def test_kn_weight_view_matches_the_nk_weight(isa):
    """A [K, N] weight passed as its transposed view: the buffered path packs it to the same fp32 rows."""
    x, w, s, b = _operands(6, 33, 20, FP32)
    w_kn = w.t().contiguous()
    for form in ("output_scale", "weight_scale_bias"):
        torch.testing.assert_close(_call(x, w_kn.t(), s, b, form), _call(x, w, s, b, form), atol=0, rtol=0)


# (M, K, N) for the chunked path at 2 threads: N = 100 in chunks of 64 + 36 columns (K = 33), 48 + 48 + 4
# (bf16, K = 4097) or 6 x 16 + 4 (fp32, K = 4097); N = 9 (one chunk, fewer than threads) in two blocks of
# 65 M rows; M = 2100 in three blocks of 700 rows (at most 1024 each) by chunks of 32 + 8 columns; M = 1 and
# 3 one block with a partial chunk.
CHUNKED_SHAPES = ((1, 7, 33), (3, 33, 7), (17, 33, 100), (5, 4097, 100), (130, 33, 9), (2100, 7, 40))


def _shapes_match_float64(label: str, shapes, dtype: torch.dtype, seed: int, threads: int) -> None:
    """Every form of each (M, K, N) against float64, at `threads` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for m, k, n in shapes:
            x, w, s, b = _operands(m, k, n, dtype, seed=seed)
            for form in FORMS:
                got = _call(x, w, s, b, form)
                ref = _float64(x, w, s, b, form)
                assert got.dtype == dtype and got.shape == (m, n)
                err = ((got.double() - ref).abs().max() / ref.abs().max()).item()
                assert err <= REL_TOL[dtype], (
                    f"{label} {dtype} (M, K, N)=({m}, {k}, {n}) {form}: rel err {err:.3g}"
                )
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", (BF16, FP32), ids=str)
def test_chunked_tails_match_float64(dtype, monkeypatch):
    """The chunked path's partial chunks and M blocks (the shapes above, at 2 threads) against float64."""
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, "chunked")
    _shapes_match_float64("chunked", CHUNKED_SHAPES, dtype, seed=3, threads=2)


# (M, K, N) for the AMX path: M below, at and past one and two 16-column tiles of X^T (the small-M path up to
# 32; above it chunks of 128 columns: 260 in three chunks of 32-column blocks), K short of, at and past one
# 32-element tile step and one 256-element conversion block, N short of and past one 32-row weight block; and
# the small-M path's ring of converted K steps (K a multiple of 32, whole 32-row blocks): K of as many steps as
# it converts ahead (64), and of many steps, with a partial last block of rows beside whole ones.
AMX_SHAPES = (
    (1, 31, 1),
    (1, 64, 32),
    (16, 4096, 64),
    (17, 1024, 80),
    (32, 2048, 96),
    (15, 32, 33),
    (16, 33, 31),
    (17, 300, 70),
    (32, 257, 32),
    (33, 64, 33),
    (100, 513, 65),
    (260, 96, 40),
)


@pytest.mark.parametrize("threads", (1, 2))
def test_amx_blocks_match_float64(threads, monkeypatch):
    """The AMX path's partial tiles, blocks and K steps (the shapes above), every form, against float64."""
    skip_without_amx()
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, "amx")
    _shapes_match_float64("amx", AMX_SHAPES, BF16, seed=5, threads=threads)


# (M, K, N) for the panel path: N short of, at and past one 16-column vector and one 48-column panel; K from one
# pair, short of and past one 32-element conversion block, past one 2048-element panel (two panels, the second
# with a pair tail), and odd (the direct kernels run it); M below and past one 8-row tile and one 512-row block.
PANEL_SHAPES = (
    (1, 2, 1),
    (7, 34, 15),
    (8, 64, 16),
    (9, 96, 47),
    (17, 30, 48),
    (130, 4098, 49),
    (520, 66, 100),
    (3, 33, 7),
)


@pytest.mark.skipif("avx512_bf16" not in native.supported_isas(), reason="needs AVX512-BF16")
@pytest.mark.parametrize("threads", (1, 2))
def test_panel_blocks_match_float64(threads, monkeypatch):
    """The panel path's partial vectors, panels, row tiles, K panels and pair tails (the shapes above), every
    form, against float64."""
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, "panel")
    assert native.woq_gemm_plan(64, BF16) == "panel-avx512_bf16"
    _shapes_match_float64("panel", PANEL_SHAPES, BF16, seed=8, threads=threads)


# (path, K, seed): the AMX path with an odd K, the panel path with an even one (an odd K runs the direct kernels)
SPECIAL_VALUE_PATHS = (("amx", 45, 6), ("panel", 46, 9))


@pytest.mark.parametrize("path, k, seed", SPECIAL_VALUE_PATHS, ids=[p[0] for p in SPECIAL_VALUE_PATHS])
def test_special_values_follow_eager(path, k, seed, monkeypatch):
    """inf and NaN activations, and an x whose next row (read past K by a careless tile) holds inf: non-finite
    exactly where eager's bf16 F.linear is, the finite rest within bf16 bounds."""
    if path == "amx":
        skip_without_amx()
    elif "avx512_bf16" not in native.supported_isas():
        pytest.skip("the panel path needs AVX512-BF16")
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, path)
    x, w, s, b = _operands(40, k, 36, BF16, seed=seed)
    x[3, 7] = float("inf")
    x[20, 0] = float("nan")
    w[5].zero_()  # inf * 0 = NaN in row 3, column 5, as in eager
    wide = torch.full((40, 64), float("inf"), dtype=BF16)
    wide[:, :k] = x  # rows of 64 elements: infs after each row's K
    got = _call(wide[:, :k], w, s, b, "output_scale_bias")
    eager = F.linear(x.float(), w.float()).to(BF16) * s + b
    assert torch.equal(torch.isfinite(got), torch.isfinite(eager))
    assert torch.equal(torch.isnan(got), torch.isnan(eager))
    finite = torch.isfinite(eager)
    torch.testing.assert_close(got[finite], eager[finite], atol=2e-2, rtol=2**-7)


def test_kernel_plan_names_the_path_it_runs(monkeypatch):
    """The report's tier comes from the kernel: a forced path shows in the plan, and each plan's path gives the
    same numbers as the forced run."""
    x, w, s, b = _operands(24, 64, 40, BF16, seed=7)
    paths = ["direct", "chunked"] + (["amx"] if "amx_bf16" in native.supported_isas() else [])
    paths += ["panel"] if "avx512_bf16" in native.supported_isas() else []
    for path in paths:
        monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, path)
        plan = native.woq_gemm_plan(24, BF16)
        assert plan.startswith("amx_bf16" if path == "amx" else f"{path}-"), (path, plan)
        assert native.woq_gemm_plan(24, FP16).startswith("direct-" if path != "chunked" else "chunked-")
    monkeypatch.delenv(cpu_lowerings.WOQ_GEMM_PATH_ENV)
    auto = native.woq_gemm_plan(24, BF16)
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, "amx" if auto == "amx_bf16" else auto.split("-")[0])
    forced = _call(x, w, s, b, "output_scale_bias")
    monkeypatch.delenv(cpu_lowerings.WOQ_GEMM_PATH_ENV)
    torch.testing.assert_close(_call(x, w, s, b, "output_scale_bias"), forced, atol=0, rtol=0)


def test_forced_path_is_checked(monkeypatch):
    x, w, s, b = _operands(1, 8, 8, BF16)
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, "tiled")
    with pytest.raises(
        RuntimeError, match="QLOWER_CPU_WOQ_GEMM_PATH=tiled is not one of auto, direct, chunked"
    ):
        _call(x, w, s, b, "output_scale")


def _linear(m, dtype=BF16, k=4096, n=4096):
    """What woq_gemm_preferred reads of a QuantLinear."""
    return SimpleNamespace(m=m, k=k, n=n, compute_dtype=dtype, weight_layout="NK")


def test_preference_table_holds_m_ranges(monkeypatch):
    """WOQ_GEMM_MAX_M's (min_m, max_m): a static M inside the range prefers the kernel, a dynamic M only where
    the range is every M; the measured avx2 limits keep their meaning."""
    dynamic_m = ShapeEnv().create_unbacked_symint()
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, "avx512_bf16")
    monkeypatch.setitem(cpu_lowerings.WOQ_GEMM_MAX_M, ("avx512_bf16", BF16), (16, None))
    prefers = cpu_lowerings.woq_gemm_preferred
    assert [prefers(_linear(m)) is None for m in (1, 15, 16, 4096)] == [False, False, True, True]
    assert "M is dynamic" in prefers(_linear(dynamic_m))
    monkeypatch.setitem(cpu_lowerings.WOQ_GEMM_MAX_M, ("avx512_bf16", BF16), (0, 4))
    assert [prefers(_linear(m)) is None for m in (0, 4, 5)] == [True, True, False]
    assert prefers(_linear(dynamic_m)) is not None
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, "avx2")
    assert prefers(_linear(dynamic_m)) is None and prefers(_linear(1024)) is None
    assert prefers(_linear(128, FP32)) is None and prefers(_linear(129, FP32)) is not None
    # avx2's small weights: every M from K*N = 2^19; below, M > PACKED_MAX_M (and a dynamic M) only
    assert prefers(_linear(1, k=1024, n=512)) is None and prefers(_linear(16, k=128, n=128)) is None
    assert "WOQ_GEMM_SMALL_PACKED" in prefers(_linear(1, k=512, n=512))
    assert "WOQ_GEMM_SMALL_PACKED" in prefers(_linear(8, k=128, n=128))
    assert prefers(_linear(9, k=128, n=128)) is None and prefers(_linear(dynamic_m, k=512, n=512)) is None
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, "avx512_bf16")  # no small-weight entry: 2^22
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert "WOQ_GEMM_MIN_WEIGHT" in prefers(_linear(4, k=1024, n=2048))
    assert prefers(_linear(4, k=2048, n=2048)) is None  # the (0, 4) patched above
    # without AMX: small weights at a static M <= 128 (int8pack below K*N = 2^19 at M <= 8)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setitem(cpu_lowerings.WOQ_GEMM_MAX_M, ("avx512_bf16", BF16), cpu_lowerings.WOQ_GEMM_EVERY_M)
    assert prefers(_linear(16, k=1024, n=1024)) is None and prefers(_linear(1, k=1024, n=512)) is None
    assert prefers(_linear(128, k=1024, n=1024)) is None
    assert "WOQ_GEMM_MIN_WEIGHT" in prefers(_linear(129, k=1024, n=1024))
    assert "WOQ_GEMM_MIN_WEIGHT" in prefers(_linear(dynamic_m, k=1024, n=1024))
    assert "WOQ_GEMM_SMALL_PACKED" in prefers(_linear(1, k=512, n=512))
    assert prefers(_linear(128, k=2048, n=2048)) is None  # 2^22: every M
    # fp16: every M on AVX512 CPUs without AMX (the tier's key before the ISA's), not measured with AMX
    assert all(prefers(_linear(m, FP16)) is None for m in (1, 64, 1024, dynamic_m))
    assert all(prefers(_linear(m, FP32)) is None for m in (1, 64, 1024, dynamic_m))
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert "not measured faster" in prefers(_linear(64, FP16))
    assert "not measured faster" in prefers(_linear(64, FP32))
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, "avx512")
    assert all(prefers(_linear(m, dtype)) is None for m in (1, 64, 1024, dynamic_m) for dtype in (BF16, FP16))
    assert "not measured faster" in prefers(_linear(64, FP32))


def test_forced_isa_is_checked(monkeypatch):
    x, w, s, b = _operands(1, 8, 8, BF16)
    monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, "sse9")
    with pytest.raises(RuntimeError, match="QLOWER_CPU_WOQ_ISA=sse9 is not one of"):
        _call(x, w, s, b, "output_scale")
    missing = [i for i in ISAS if i not in native.supported_isas()]
    if missing:
        monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, missing[0])
        with pytest.raises(RuntimeError, match="this CPU supports only"):
            _call(x, w, s, b, "output_scale")


# ---- torch.compile: the scale reaches the kernel as the graph holds it

SCALE_FORMS = {  # name: (scale dtype, shape of the stored scale); x is bf16
    "bf16_vector": (BF16, (48,)),
    "fp16_column": (FP16, (48, 1)),  # bf16 * fp16 promotes the product to fp32
    "fp32_row": (FP32, (1, 48)),  # torchao-like fp32 scale, no cast in the graph: an fp32 product
    "one_element": (BF16, (1,)),  # broadcast over N: an [N] fp32 copy is passed
}


@pytest.mark.parametrize("form", list(SCALE_FORMS))
def test_compiled_call_passes_the_graphs_scale(form, monkeypatch):
    """A scale in a dtype the kernel reads goes in as the graph's tensor (a view), so no conversion kernel runs
    before the op; the output equals the eager op on the same operands bit for bit, and float64 within the
    formula's roundings. A one-element scale is expanded to an [N] copy first."""
    dtype, shape = SCALE_FORMS[form]
    with_woq_gemm(monkeypatch)
    g = torch.Generator().manual_seed(5)
    w = torch.randint(-128, 128, (48, 40), generator=g, dtype=torch.int8)
    s = (torch.rand(shape, generator=g) + 0.5).to(dtype)
    x = torch.randn(3, 40, generator=g).to(BF16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w.to(x.dtype)) * s.reshape(-1)

    qlower.clear_reports()
    got, (code,) = run_and_get_code(torch.compile(f, options=qlower.inductor_options()), x)
    assert [d.lowering for d in qlower.last_report().lowered] == ["qlower.woq_int8_gemm"]
    assert got.dtype == f(x).dtype
    assert "qlower.woq_int8_gemm.default(" in code
    if s.numel() == 1:
        assert "cpp_fused" in code  # the [N] copy of the scale
    else:
        assert "cpp_fused" not in code, code
    want = custom_ops.woq_int8_gemm(x, w, s.reshape(-1).float().expand(48), None, False, got.dtype)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    ref = (x.double() @ w.double().t()) * s.reshape(-1).double()
    assert ((got.double() - ref).abs().max() / ref.abs().max()).item() <= 2 * REL_TOL[BF16]


# ---- one AOTInductor compile: the lowering, its C shim, the package, the C++ deployment

K, N = 256, 192


class GptFast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(2)
        self.register_buffer("w", torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8))
        self.register_buffer("s", (torch.rand(N, generator=g) / 64).to(BF16))
        self.register_buffer("b", torch.randn(N, generator=g).to(BF16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w.to(x.dtype)) * self.s + self.b


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The model exported at a static M = 4, compiled by AOTInductor with qlower. AUTO takes the kernel where
    it was measured faster (cpu_lowerings.WOQ_GEMM_MAX_M, for larger weights): the table is patched so the
    test holds on every CPU."""
    model = GptFast().eval()
    x = torch.randn(4, K, dtype=BF16)
    with pytest.MonkeyPatch.context() as mp:
        with_woq_gemm(mp)
        qlower.clear_reports()
        ep = torch.export.export(model, (x,))
        path = str(tmp_path_factory.mktemp("woq_gemm") / "model.pt2")
        torch._inductor.aoti_compile_and_package(
            ep, package_path=path, inductor_configs=qlower.inductor_options()
        )
        report = qlower.last_report()
    return model, x, path, report


def test_aoti_package_calls_the_kernel_through_its_shim(package):
    model, x, path, report = package
    assert [d.lowering for d in report.lowered] == ["qlower.woq_int8_gemm"], report.table()
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".wrapper.cpp")]
        wrapper = z.read(name).decode()
    assert "AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_woq_int8_gemm(" in wrapper
    assert "aoti_torch_proxy_executor_call_function" not in wrapper
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        got = runner(x)
    ref = (x.double() @ model.w.double().t()) * model.s.double() + model.b.double()
    assert ((got.double() - ref).abs().max() / ref.abs().max()).item() <= REL_TOL[BF16]
    eager_op = custom_ops.woq_int8_gemm(x, model.w, model.s, model.b, False, BF16)
    torch.testing.assert_close(got, eager_op, atol=0, rtol=0)


_WITHOUT_QLOWER = """
import sys, torch
torch.ops.load_library(sys.argv[1])
data = torch.load(sys.argv[3])
runner = torch._inductor.aoti_load_package(sys.argv[2])
torch.testing.assert_close(runner(data["x"]), data["want"], atol=0, rtol=0)
for args, want in data["calls"]:
    torch.testing.assert_close(torch.ops.qlower.woq_int8_gemm(*args), want, atol=0, rtol=0)
assert not any(m == "qlower" or m.startswith("qlower.") for m in sys.modules)
print("ok")
"""


_NEITHER = """
import sys
sys.modules["qlower"] = None  # any import of qlower fails
import torch
data = torch.load(sys.argv[2])
runner = torch._inductor.aoti_load_package(sys.argv[1])
torch.testing.assert_close(runner(data["x"]), data["want"], atol=0, rtol=0)
assert not hasattr(torch.ops.qlower, "woq_int8_gemm")  # no registration: the package's own copy ran
print("ok")
"""


def test_package_runs_its_own_copy_of_the_kernel(package, tmp_path):
    """The package's shim calls the kernel compiled into its wrapper, not the dispatcher: it runs with
    neither qlower's Python nor the ops library, bit for bit as in-process, and builds nothing."""
    model, x, path, _ = package
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        want = runner(x)
    data = tmp_path / "data.pt"
    torch.save({"x": x, "want": want}, data)
    empty = tmp_path / "empty_cache"
    empty.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_NEITHER), path, str(data)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=tmp_path,
        env={**os.environ, "QLOWER_CACHE_DIR": str(empty)},
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
    assert not list(empty.iterdir())
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".so")]
        so = z.extract(name, tmp_path)
    kernel = "_ZN6qlower13woq_int8_gemm"  # qlower::woq_int8_gemm(...), mangled
    defined = subprocess.run(["nm", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    exported = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True)
    assert kernel in defined and kernel not in exported.stdout  # inside, hidden from other libraries


def test_package_and_op_run_on_the_cpp_ops_library_without_qlower(package, tmp_path):
    """libqlower_ops.so serves the op to a process without qlower's Python, bit for bit as in-process."""
    model, x, path, _ = package
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        want = runner(x)
    calls = []
    for m, k, n, dtype, on_weight in (
        (1, 33, 7, BF16, False),
        (6, 40, 70, FP16, True),
        (3, 9, 5, FP32, False),
    ):
        xi, w, s, b = _operands(m, k, n, dtype)
        args = (xi, w, s, b, on_weight, dtype)
        calls.append((args, custom_ops.woq_int8_gemm(*args)))
    data = tmp_path / "data.pt"
    torch.save({"x": x, "want": want, "calls": calls}, data)
    lib = build.ops_library()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_QLOWER), str(lib.path), path, str(data)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


@pytest.mark.parametrize("m", (1, 16, 1024))
def test_report_names_the_kernel_path_a_static_m_runs(m, monkeypatch):
    """The row of a woq_int8_gemm choice says which path and ISA tier the kernel takes at that M, as the kernel
    decides it (native.woq_gemm_plan); a symbolic M lists the path at each sample M."""
    from qlower.testing import apply_pass
    from tests.helpers.fake_gpu_trace import fake_woq_graph

    monkeypatch.setitem(cpu_lowerings.WOQ_GEMM_MAX_M, (cpu_lowerings.cpu_woq_isa(), BF16), (0, None))
    monkeypatch.setattr(cpu_lowerings, "WOQ_GEMM_MIN_WEIGHT_DEFAULT", 0)
    tier = cpu_lowerings.woq_weight_tier(cpu_lowerings.cpu_woq_isa())
    monkeypatch.setitem(cpu_lowerings.WOQ_GEMM_MIN_WEIGHT, tier, 0)
    monkeypatch.setitem(cpu_lowerings.WOQ_GEMM_SMALL_PACKED, tier, 0)
    report = apply_pass(fake_woq_graph("cpu", m=m, k=4096, n=64))
    row = report.entries[0]
    assert row.lowering == "qlower.woq_int8_gemm", report.table()
    assert row.why.endswith(f"[{native.woq_gemm_plan(m, BF16, True, 4096)}]"), row.why
    rec = SimpleNamespace(
        m=ShapeEnv().create_unbacked_symint().node.expr, k=4096, compute_dtype=BF16, weight_layout="NK"
    )
    tier = cpu_lowerings.woq_gemm_tier(rec)
    assert tier.startswith("by M: 1 ") and f"1024 {native.woq_gemm_plan(1024, BF16, True, 4096)}" in tier, (
        tier
    )


@pytest.mark.skipif("avx512_bf16" not in native.supported_isas(), reason="needs AVX512-BF16")
@pytest.mark.skipif(
    "amx_bf16" in native.supported_isas(),
    reason="an AMX CPU runs its own tiles at M 8-128 whatever oneDNN runs",
)
def test_auto_without_amx_gemm_takes_vdpbf16ps(monkeypatch):
    """Where oneDNN's bf16 GEMM has no AMX (an AVX512-BF16 EPYC; here oneDNN capped), auto runs the fp32-FMA
    kernels below M = 4, the vdpbf16ps ones (int8 converted in registers, 8-row tiles) from there, and the
    vdpbf16ps panels from M = 64 (32 where K <= 2048), never the chunks (woq_gemm.cpp, kDpbf16MinM, kPanelMinM); each plan's
    numbers are the forced path's."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    monkeypatch.delenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, raising=False)
    monkeypatch.delenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, raising=False)
    assert native.woq_gemm_plan(1, BF16) == "direct-avx512"
    assert native.woq_gemm_plan(4, BF16) == "direct-avx512_bf16"
    assert native.woq_gemm_plan(63, BF16) == "direct-avx512_bf16"
    assert native.woq_gemm_plan(64, BF16) == "panel-avx512_bf16"
    # one panel holds all of K from K <= 2048: the panels from M = 32 (K unknown: taken as long)
    assert native.woq_gemm_plan(31, BF16, True, 2048) == "direct-avx512_bf16"
    assert native.woq_gemm_plan(32, BF16, True, 2048) == "panel-avx512_bf16"
    assert native.woq_gemm_plan(32, BF16, True, 2050) == "direct-avx512_bf16"
    assert native.woq_gemm_plan(64, BF16, True, 33) == "direct-avx512_bf16"  # odd K: the pairs do not fit
    assert native.woq_gemm_plan(256, FP16) == "direct-avx512"  # vdpbf16ps: bf16 x only
    for m in (1, 4, 13, 40, 300):  # 13, 40, 300: 8-row tiles and a partial one; 40: panels as K = 96
        x, w, s, b = _operands(m, 96, 72, BF16, seed=m)
        auto = _call(x, w, s, b, "output_scale_bias")
        plan = native.woq_gemm_plan(m, BF16, True, 96)
        path, _, level = ("amx", "", "") if plan == "amx_bf16" else plan.partition("-")
        monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_PATH_ENV, path)
        if level:
            monkeypatch.setenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, level)
        torch.testing.assert_close(_call(x, w, s, b, "output_scale_bias"), auto, atol=0, rtol=0)
        monkeypatch.delenv(cpu_lowerings.WOQ_GEMM_PATH_ENV)
        monkeypatch.delenv(cpu_lowerings.WOQ_GEMM_ISA_ENV, raising=False)
