"""qlower's CUTLASS MXFP4 weight-only GEMM (lowerings/kernels/cutlass/mxfp4.py, csrc/cuda/mxfp4_sm90.cu).

On any machine: which MX records the lowering takes and why it declines the rest (fake CUDA traces, capability
pinned); the graph it emits, run on CPU through the op's torch reference, against the original graph for the
MX spellings and special scale codes (the block-scale bits and their [K/128, N, 4] layout are the graph's
work); nvcc compiling the source for sm_90a where the `qlower[cuda]` extra is installed. On an sm_90 GPU (gpu):
every configuration against float64, special values included, and a compiled model running the kernel.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import qlower
from qlower.lowerings.devices import cuda_cutlass
from qlower.lowerings.devices.crossovers import CUTLASS_MXFP4_M_RANGE
from qlower.lowerings.devices.cuda import override_cuda_capability
from qlower.lowerings.kernels.cutlass import build, configs, mxfp4
from qlower.patterns import mx_format as fmt
from qlower.testing import apply_pass, graph_summary
from tests.forms.mx import special_code_inputs, trace

BF16 = torch.bfloat16
LOWERING = "cutlass.mxfp4_weight_only"
N, K = 48, 256


@pytest.fixture
def built(monkeypatch):
    """Pretend the library exists (decision and CPU-reference tests never load it)."""
    build.library.cache_clear()
    monkeypatch.setattr(build, "library", lambda: Path("/nonexistent/libqlower_cutlass_sm90.so"))


def spec_decode(x, q, e):
    return F.linear(x, fmt.dequantize(q, e, "e2m1", x.dtype))


def exp2_decode(x, q, e):  # 255 -> +inf (float32 exp2 overflows), 0 -> 2**-127
    vals = fmt.dequantize(q, torch.full_like(e, 127), "e2m1", torch.float32)
    s = torch.exp2(e.float() - 127).repeat_interleave(32, dim=1)
    return F.linear(x, (vals * s).to(x.dtype))


def bit_shift_decode(x, q, e):  # the exponent field: 0 -> 0.0, 255 -> +inf
    vals = fmt.dequantize(q, torch.full_like(e, 127), "e2m1", torch.float32)
    s = (e.to(torch.int32) << 23).view(torch.float32).repeat_interleave(32, dim=1)
    return F.linear(x, (vals * s).to(x.dtype))


def nan_guard_decode(x, q, e):  # torchao's guard: 255 -> NaN, the spec
    vals = fmt.dequantize(q, torch.full_like(e, 127), "e2m1", torch.float32)
    s = torch.where(e == 255, float("nan"), torch.exp2(e.float() - 127)).repeat_interleave(32, dim=1)
    return F.linear(x, (vals * s).to(x.dtype))


def scale_t_decode(x, q, e_t):  # scales stored [K/32, N]
    return F.linear(x, fmt.dequantize(q, e_t.t(), "e2m1", x.dtype))


def e8m0_dtype_decode(x, q, e):  # scales stored as torch.float8_e8m0fnu; .float() is the decode
    vals = fmt.dequantize(q, torch.full_like(e.view(torch.uint8), 127), "e2m1", torch.float32)
    s = e.float().repeat_interleave(32, dim=1)
    return F.linear(x, (vals * s).to(x.dtype))


def swizzled_decode(x, q, flat):  # scales stored in cuBLAS's 128x4 tiles, un-tiled in the graph
    n, cols = q.shape[0], q.shape[1] // 16
    rt, ct = -(-n // 128), -(-cols // 4)
    e = flat.view(rt, ct, 32, 4, 4).permute(0, 3, 2, 1, 4).reshape(rt * 128, ct * 4)[:n, :cols]
    return F.linear(x, fmt.dequantize(q, e, "e2m1", x.dtype))


FORMS = {
    "spec": spec_decode,
    "exp2": exp2_decode,
    "bit_shift": bit_shift_decode,
    "nan_guard": nan_guard_decode,
    "scale_t": scale_t_decode,
    "swizzled": swizzled_decode,
    "e8m0_dtype": e8m0_dtype_decode,
}


def _fake_graph(fn, m, dtype=BF16, k=K, n=N, scale_t=False):
    with FakeTensorMode():
        x = torch.empty(m, k, dtype=dtype, device="cuda")
        q = torch.empty(n, k // 2, dtype=torch.uint8, device="cuda")
        e = torch.empty(*((k // 32, n) if scale_t else (n, k // 32)), dtype=torch.uint8, device="cuda")
        from torch._inductor.decomposition import select_decomp_table

        return make_fx(fn, decomposition_table=select_decomp_table())(x, q, e)


def _decide(m, capability=(9, 0), preference="AUTO", **kw) -> qlower.Report:
    gm = _fake_graph(spec_decode, m, **kw)
    with override_cuda_capability(capability):
        report = apply_pass(gm, families=("mx",), kernel_preference=qlower.KernelPreference[preference])
    report.graph = graph_summary(gm)  # type: ignore[attr-defined]
    return report


def test_auto_takes_cutlass_for_static_m_in_its_range(built):
    lo, hi = CUTLASS_MXFP4_M_RANGE
    report = _decide(lo)
    assert report.entries[0].lowering == LOWERING, report.table()
    assert "qlower.mxfp4_cutlass(" in report.graph, report.graph
    below = _decide(lo - 1)
    assert below.entries[0].lowering == "triton.mx_linear", below.table()
    assert "measured range" in dict(below.entries[0].passed_over)[LOWERING]
    if hi is not None:
        assert _decide(hi + 1).entries[0].lowering != LOWERING


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"capability": (10, 0)}, "capability 9.0 only"),
        ({"capability": (8, 9)}, "capability 9.0 only"),
        ({"k": 224}, "K % 128 == 0"),
        ({"n": 44}, "N % 8 == 0"),
        ({"dtype": torch.float16}, "takes 2-D bf16 x"),
    ],
)
def test_cutlass_declines_with_its_reason(built, kw, reason):
    report = _decide(512, **kw)
    entry = report.entries[0]
    assert entry.lowering != LOWERING, report.table()
    assert reason in dict(entry.passed_over).get(LOWERING, ""), report.table()


def _symbolic_m_graph() -> torch.fx.GraphModule:
    """The spec decode traced on fake CUDA tensors whose M is a size symbol (a dynamic batch)."""
    from torch._dynamo.source import ConstantSource
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    m = env.create_symintnode(env.create_symbol(300, ConstantSource("m")), hint=300)
    with FakeTensorMode(shape_env=env):
        args = (
            torch.empty(m, K, dtype=BF16, device="cuda"),
            torch.empty(N, K // 2, dtype=torch.uint8, device="cuda"),
            torch.empty(N, K // 32, dtype=torch.uint8, device="cuda"),
        )
    return make_fx(spec_decode, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(*args)


def test_symbolic_m_runs_the_triton_op_with_the_cutlass_branch(built):
    """A symbolic M: the Triton MX op, handed the block scales and the M from which it runs the CUTLASS GEMM
    (its buckets below keep the Triton kernels)."""
    gm = _symbolic_m_graph()
    with override_cuda_capability((9, 0)):
        (entry,) = apply_pass(gm, families=("mx",)).entries
    assert entry.lowering == LOWERING, entry


def test_missing_toolchain_is_the_reason_and_triton_serves(monkeypatch):
    """No nvcc: the report says so (naming the extra to install) and the Triton MX op serves the record."""
    build.library.cache_clear()
    monkeypatch.setenv("QLOWER_NVCC", "/nonexistent/nvcc")
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    try:
        report = _decide(128)
    finally:
        build.library.cache_clear()
    entry = report.entries[0]
    assert entry.lowering == "triton.mx_linear", report.table()
    why = dict(entry.passed_over)[LOWERING]
    assert "nvcc" in why and "qlower[cuda]" in why, why


@pytest.fixture
def objects(built, monkeypatch):
    """Pretend the library's objects exist too (what a C++-wrapper compile links); no switch set."""
    monkeypatch.delenv("QLOWER_AOTI_CUTLASS", raising=False)
    monkeypatch.setattr(build, "objects", lambda: [Path("/nonexistent/mxfp4_t128x64_c1x1_coop.o")])


def _decide_cpp_wrapper(gm: torch.fx.GraphModule) -> qlower.Report:
    from torch._inductor import config as inductor_config

    with (
        override_cuda_capability((9, 0)),
        inductor_config.patch({"cpp_wrapper": True, "triton.cudagraphs": False}),
    ):
        return apply_pass(gm, families=("mx",))


def _targets(gm: torch.fx.GraphModule) -> list:
    """Every call's target in `gm` and in its subgraphs (the branches of `torch.cond`)."""
    found = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    for sub in gm.children():
        if isinstance(sub, torch.fx.GraphModule):
            found += _targets(sub)
    return found


def test_cpp_wrapper_takes_cutlass_for_static_and_symbolic_m(objects, monkeypatch):
    """The op has a C shim: a C++ wrapper (AOTInductor, cpp_wrapper) takes it at a static M in its range, and for
    a size-symbol M as the host branch's leaves inside the range (no Python-only op in the graph)."""
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    gm = _fake_graph(spec_decode, CUTLASS_MXFP4_M_RANGE[0])
    assert _decide_cpp_wrapper(gm).entries[0].lowering == LOWERING
    assert torch.ops.qlower.mxfp4_cutlass.default in _targets(gm)
    monkeypatch.setattr(mx_ops, "bf16_decodes", lambda x_dtype, w_fmt: True)  # as on a GPU
    gm = _symbolic_m_graph()
    (entry,) = _decide_cpp_wrapper(gm).entries
    assert entry.lowering == LOWERING, entry
    targets = _targets(gm)
    assert torch.ops.qlower.mxfp4_cutlass.default in targets
    assert torch.ops.qlower.mxfp4_dense.default not in targets


def test_cpp_wrapper_with_a_product_m_keeps_the_triton_op(objects):
    """M = B * T (a flattened [B, T, K] batch) cannot branch on the host: the gated form's run-time choice is a
    Python op, so a C++ wrapper keeps the Triton MX op and says why."""
    from torch._dynamo.source import ConstantSource
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    b = env.create_symintnode(env.create_symbol(75, ConstantSource("b")), hint=75)
    with FakeTensorMode(shape_env=env):
        args = (
            torch.empty(b, 4, K, dtype=BF16, device="cuda"),
            torch.empty(N, K // 2, dtype=torch.uint8, device="cuda"),
            torch.empty(N, K // 32, dtype=torch.uint8, device="cuda"),
        )
    gm = make_fx(spec_decode, decomposition_table=select_decomp_table(), tracing_mode="symbolic")(*args)
    (entry,) = _decide_cpp_wrapper(gm).entries
    assert entry.lowering == "triton.mx_linear", entry
    assert "not one size symbol" in dict(entry.passed_over)[LOWERING]


def test_the_switch_off_keeps_packages_on_the_triton_op(objects, monkeypatch):
    monkeypatch.setenv("QLOWER_AOTI_CUTLASS", "0")
    (entry,) = _decide_cpp_wrapper(_fake_graph(spec_decode, 128)).entries
    assert entry.lowering == "triton.mx_linear"
    assert "QLOWER_AOTI_CUTLASS=0" in dict(entry.passed_over)[LOWERING]


def test_host_branch_leaves_end_at_the_cutlass_range(monkeypatch):
    """The host branch (default mode, C++ wrappers) splits its M ranges at the CUTLASS range's ends: the leaves
    inside call `qlower::mxfp4_cutlass` (its torch reference here, compared), the leaf above runs dequantize +
    cuBLAS, the leaves below the Triton kernels."""
    from qlower.lowerings.kernels.triton.mx import kernels as mx_kernels
    from qlower.lowerings.kernels.triton.mx import launch
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    lo, hi = CUTLASS_MXFP4_M_RANGE
    assert mx_ops.split_at(((1, 16), (17, 200), (201, None)), (lo - 1, hi)) == (
        (1, 16), (17, lo - 1), (lo, 200), (201, hi), (hi + 1, None)
    )  # fmt: skip
    monkeypatch.setattr(mx_ops, "bf16_decodes", lambda x_dtype, w_fmt: True)
    dense = []
    monkeypatch.setattr(mx_ops, "dense_bf16", lambda cfg, a, *rest, **kw: dense.append(cfg) or a.new_zeros(0))
    captured = []
    monkeypatch.setattr(mx_ops, "branch_on_m", lambda leaves, operands: captured.append(leaves) or None)
    n, k = 16, 256
    g = torch.Generator().manual_seed(0)
    w, e = fmt.quantize(torch.randn(n, k, generator=g), "e2m1")
    blocks = mxfp4.block_scales(fmt.scale_f64(e))
    bias = torch.randn(n, generator=g).to(BF16)
    fmts = (mx_kernels.FLOAT, mx_kernels.E2M1, False, False)
    for m in (lo - 1, lo, hi, hi + 1):
        captured.clear()
        x = torch.randn(m, k, generator=g).to(BF16)
        mx_ops._branch_on_m(x, None, w, e, bias, fmts, BF16, mx_ops.SPEC, (blocks, lo, hi))
        # a static M keeps its own leaf (and the M = 1 leaf, never pruned: launch_args.m_range_gate)
        leaf_hi, leaf = next((h, f) for h, f in captured[0] if h is None or h >= m)
        if m < lo:
            assert leaf_hi == lo - 1
            continue
        got = leaf(x, None, w, e, bias, blocks)
        if m <= hi:
            assert torch.equal(got, mxfp4.reference(x, w, blocks, bias)), m
        else:
            assert leaf_hi is None and dense == [launch.BF16_DENSE], m


def test_report_names_the_configuration(built):
    report = _decide(128)
    assert mxfp4.choose(128, N, K).config in report.table(full=True), report.table(full=True)


@pytest.fixture
def cutlass_on_cpu(built, monkeypatch):
    """The lowering registered for CPU records, its device rule waived: the graph it emits then runs here,
    the op computing through its torch reference."""
    from qlower.lowerings import registry

    monkeypatch.setattr(cuda_cutlass, "_device_blocker", lambda rec: None)
    old = registry.backends()["cpu"]
    registry.register_backend("cpu", [cuda_cutlass.MXFP4_CUTLASS])
    yield
    registry.register_backend("cpu", old.lowerings, describe=old.describe, replace=True, env=old.env)


def _in_graph_order(gm, *tensors):
    """`tensors` in the order of the graph's inputs (Dynamo orders them by first use), told apart by shape."""
    by_shape = {(tuple(t.shape), t.dtype): t for t in tensors}
    assert len(by_shape) == len(tensors)
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    return [by_shape[(tuple(v.shape), v.dtype)] for v in vals]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("m", [5, CUTLASS_MXFP4_M_RANGE[0]])
def test_emitted_graph_matches_the_original_on_special_codes(cutlass_on_cpu, form, m):
    """Scale codes 0, 255 and 200 and every e2m1 code planted (tests/forms/mx.py): the rewritten graph's
    block-scale bits give the original graph's numbers, NaN and inf where it has them."""
    x, q, e = special_code_inputs("e2m1", N, K, m=m)
    codes = e
    e = _stored(form, e)
    fn = FORMS[form]
    expected = fn(x, q, e)
    gm = trace(fn, x, q, e)
    report = apply_pass(gm, families=("mx",), kernel_preference=qlower.KernelPreference.CUTLASS)
    assert report.entries[0].lowering == LOWERING, report.table()
    assert "qlower.mxfp4_cutlass" in graph_summary(gm)
    (got,) = gm(*_in_graph_order(gm, x, q, e))
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.isinf(), expected.isinf()) and torch.equal(got[got.isinf()], expected[got.isinf()])
    fin = expected.isfinite()
    bound = x.double().abs() @ fmt.dequantize_f64(q, codes, "e2m1").abs().t()
    bound = bound.nan_to_num(0, 0, 0) * 2.0**-7 + 1e-30
    assert bool(((got.double() - expected.double()).abs()[fin] <= bound[fin]).all())


def _stored(form: str, e: torch.Tensor) -> torch.Tensor:
    """The [N, K/32] codes as the form stores them."""
    if form == "e8m0_dtype":
        return e.view(torch.float8_e8m0fnu)
    return e.t().contiguous() if form == "scale_t" else fmt.to_swizzled(e) if form == "swizzled" else e


SCALE_DECODES = {  # each form's own value of a scale code, as float32
    "spec": lambda e: torch.exp2(e.float() - 127),
    "exp2": lambda e: torch.exp2(e.float() - 127),
    "scale_t": lambda e: torch.exp2(e.float() - 127),
    "swizzled": lambda e: torch.exp2(e.float() - 127),
    "e8m0_dtype": lambda e: e.view(torch.float8_e8m0fnu).float(),
    "bit_shift": lambda e: (e.to(torch.int32) << 23).view(torch.float32),
    "nan_guard": lambda e: torch.where(e == 255, float("nan"), torch.exp2(e.float() - 127)),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_block_scales_are_the_graphs_decode_bit_for_bit(cutlass_on_cpu, monkeypatch, form):
    """The scales the op receives are the form's own scale values, bf16 bit for bit, at every code 0..255
    (0 -> 2**-127 or 0.0, 255 -> +inf as the form decodes them), in the [K/128, N, 4] layout."""
    n, k = 8, 8192  # 256 blocks a row: every code once per row
    x = torch.randn(2, k).to(BF16)
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    e = torch.stack([torch.roll(torch.arange(256), r) for r in range(n)]).to(torch.uint8)
    stored = _stored(form, e)
    seen = []
    monkeypatch.setattr(
        mxfp4,
        "reference",
        lambda x, w, scales, bias=None: seen.append(scales) or x.new_zeros(x.shape[0], w.shape[0]),
    )
    gm = trace(FORMS[form], x, q, stored)
    apply_pass(gm, families=("mx",), kernel_preference=qlower.KernelPreference.CUTLASS)
    gm(*_in_graph_order(gm, x, q, stored))
    (scales,) = seen
    assert tuple(scales.shape) == (k // 128, n, 4) and scales.dtype == BF16
    got = scales.permute(1, 0, 2).reshape(n, k // 32)
    want = SCALE_DECODES[form](e).to(BF16)
    assert torch.equal(got.isnan(), want.isnan())  # any NaN payload
    assert torch.equal(got[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))


def test_reference_decodes_every_code_pair_as_float64():
    """The op's CPU reference (what the graph tests rely on) against float64 for all 256 byte values."""
    w = torch.arange(256, dtype=torch.uint8).repeat(8, 1)  # [8, 256]: K = 512
    codes = torch.randint(110, 140, (8, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    x = torch.eye(512, dtype=BF16)[:512]
    got = mxfp4.reference(x, w, mxfp4.block_scales(torch.exp2(codes.double() - 127)))
    ref = fmt.dequantize_f64(w, codes, "e2m1").t().to(BF16)
    assert torch.equal(got, ref)


@pytest.mark.skipif(
    isinstance(build.toolchain(), str), reason="no nvcc / CUTLASS (pip install 'qlower[cuda]')"
)
def test_nvcc_compiles_the_source_for_sm90a(tmp_path):
    """The MXFP4 source compiles for sm_90a without a GPU (the stream-K configuration; every configuration is
    built on the GPU machine) and exports its entry point: qlower's conversion step specializes CUTLASS's."""
    tc = build.toolchain()
    cfg = next(c for c in configs.MXFP4_CONFIGS if c.stream_k)
    (obj,) = build._compile_all(tc, (), tmp_path, jobs=1, mxfp4_configs=(cfg,))
    assert obj.name == f"mxfp4_{cfg.name}.o"
    assert f"qlower_mxfp4_sm90_{cfg.name}".encode() in obj.read_bytes()


# --------------------------------------------------------------------------------------------- GPU
@pytest.fixture
def sm90() -> None:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    lib = build.library()
    if isinstance(lib, str):
        pytest.skip(lib)


def _problem(m, n, k, seed=0, special=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(BF16)
    q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, "e2m1")
    if special:
        e[0, 0], e[1, 1], e[2, :], e[3, 2] = 0, 255, 254, 1
        nib = torch.arange(16, dtype=torch.uint8)
        q[5, :16] = nib * 16 + (15 - nib)
    return x.cuda(), q.cuda(), e.cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("name", [c.name for c in configs.MXFP4_CONFIGS])
def test_every_configuration_matches_float64(sm90, name):
    """Each configuration, split-K included, within one bf16 rounding of the weight plus fp32 accumulation of the
    float64 product; NaN (scale code 255) and inf (code 254 times large elements) where float64 has them."""
    splits = (0, 3) if configs.MXFP4_BY_NAME[name].stream_k else (0,)
    for m, n, k, special in (
        (1, 8, 128, False),
        (7, 264, 384, True),
        (300, 1032, 1024, True),
        (129, 4096, 4096, False),
    ):
        x, q, e = _problem(m, n, k, special=special)
        w64 = fmt.dequantize_f64(q, e, "e2m1")
        w_bf16 = w64.to(BF16).double()  # the kernel's one rounding of each weight element
        bias = torch.randn(n, device="cuda").to(BF16)
        ref = x.double() @ w_bf16.t() + bias.double()
        scales = mxfp4.block_scales(torch.exp2(e.double() - 127).masked_fill(e == 255, float("nan")))
        for sp in splits:
            out = torch.empty(m, n, dtype=BF16, device="cuda")
            mxfp4.launch(x, q, scales, bias, out, configs.Choice(name, sp))
            assert torch.equal(out.isnan(), ref.isnan()), (name, m, sp)
            assert torch.equal(out.isinf(), ref.isinf()), (name, m, sp)
            fin = ref.isfinite()
            mag = (x.double().abs() @ w_bf16.abs().nan_to_num(0, 0, 0).t()) + bias.double().abs()
            bound = mag * (2.0**-8 + k * 2.0**-23) + 1e-30
            assert bool(((out.double() - ref).abs()[fin] <= bound[fin]).all()), (name, m, n, k, sp)


@pytest.mark.gpu
def test_compiled_model_runs_the_kernel(sm90):
    """torch.compile with qlower's options at a static M in the kernel's range: the report names it, the code
    calls the op, and the output is within the float64 bound."""
    m = CUTLASS_MXFP4_M_RANGE[1]
    x, q, e = _problem(m, 1024, 2048, seed=3)
    qlower.clear_reports()
    compiled = torch.compile(spec_decode, options=qlower.inductor_options())
    out = compiled(x, q, e)
    (entry,) = qlower.last_report().entries
    assert entry.lowering == LOWERING, qlower.last_report().table()
    ref = x.double() @ fmt.dequantize_f64(q, e, "e2m1").to(BF16).double().t()
    assert float((out.double() - ref).abs().max()) <= float(ref.abs().max()) * 2**-7


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reduce-overhead", "default"])
def test_symbolic_m_runs_triton_below_and_cutlass_above(sm90, mode):
    """A dynamic batch (CUDA graphs: gated launches; default mode: host branches on M): every M within the
    float64 bound, the Triton kernels below the CUTLASS range and the GEMM from its start."""
    torch._dynamo.reset()
    qlower.clear_reports()
    compiled = torch.compile(spec_decode, options=qlower.inductor_options(mode=mode))
    lo, hi = CUTLASS_MXFP4_M_RANGE
    for m in (3, lo - 1, lo, hi, hi + 1, 700):
        x, q, e = _problem(m, 1024, 2048, seed=m)
        torch._dynamo.mark_dynamic(x, 0)  # a symbolic batch; the weight's shapes stay static
        out = compiled(x, q, e)
        ref = x.double() @ fmt.dequantize_f64(q, e, "e2m1").to(BF16).double().t()
        assert float((out.double() - ref).abs().max()) <= float(ref.abs().max()) * 2**-7, m
    assert any(d.lowering == LOWERING for d in qlower.last_report().entries), qlower.last_report().table()


def test_dense_op_chooses_by_the_m_it_is_called_with(monkeypatch):
    """`qlower::mxfp4_dense` (the whole-output buckets of a symbolic M): gated off, the bias alone; up to
    `cutlass_max_m` the CUTLASS GEMM (its torch reference here); above, dequantize + cuBLAS."""
    from qlower.lowerings.kernels.triton.mx import launch

    n, k = 16, 256
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    codes = torch.randint(118, 126, (n, k // 32), dtype=torch.uint8)
    blocks = mxfp4.block_scales(torch.exp2(codes.float() - 127))
    bias = torch.randn(n).to(BF16)
    x = torch.randn(40, k).to(BF16)
    off = torch.ops.qlower.mxfp4_dense(x, q, blocks, codes, bias, False, 0, 32, 0)
    assert torch.equal(off, bias.expand(40, n))
    seen = []
    monkeypatch.setattr(launch, "dense_bf16", lambda *a, **kw: seen.append((a, kw)) or x.new_zeros(40, n))
    torch.ops.qlower.mxfp4_dense(x, q, blocks, codes, bias, False, 2, 32, 1)  # M = 40 > 32
    ((args, kw),) = seen
    assert args[0] is launch.BF16_DENSE and args[3] is codes and kw["w_special"] == 2 and kw["direct"]
    got = torch.ops.qlower.mxfp4_dense(x[:32], q, blocks, codes, bias, False, 0, 32, 1)
    assert len(seen) == 1 and torch.equal(got, mxfp4.reference(x[:32], q, blocks, bias))


def test_symbolic_m_trace_gates_the_dense_op_over_the_cutlass_buckets(built, monkeypatch):
    """The Triton MX op traced for a symbolic M with the CUTLASS branch (its bf16 decodes on, as on a GPU): one
    `qlower::mxfp4_dense` whose gate covers the buckets from the range's start, and the range's end passed on."""
    from torch._inductor import config as inductor_config

    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    monkeypatch.setattr(mx_ops, "bf16_decodes", lambda x_dtype, w_fmt: True)
    gm = _symbolic_m_graph()
    with override_cuda_capability((9, 0)), inductor_config.patch({"triton.cudagraphs": True}):
        apply_pass(gm, families=("mx",))
    (dense,) = [n for n in gm.graph.nodes if n.target is torch.ops.qlower.mxfp4_dense.default]
    lo, hi = CUTLASS_MXFP4_M_RANGE
    assert dense.args[7] == hi
    expr = dense.args[8].meta["val"].node.expr  # the gate as a function of M
    for mv, on in ((lo - 1, 0), (lo, 1), (hi, 1), (hi + 1, 1), (5000, 1)):
        assert int(expr.subs({s: mv for s in expr.free_symbols})) == on, (mv, expr)


@pytest.mark.parametrize("seed", range(20))
def test_fuzz_split_at_keeps_a_partition_with_the_edges(seed):
    """`split_at` on random contiguous M ranges (the last open) and edges: the result still covers M = 1 upwards
    with no gap or overlap, each edge in range ends a range, and every range lies inside one original range."""
    import random

    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    rng = random.Random(seed)
    ends = sorted(rng.sample(range(1, 600), rng.randint(0, 6)))
    ranges = tuple(zip([1, *(e + 1 for e in ends)], [*ends, None], strict=True))
    edges = tuple(rng.randint(1, 700) for _ in range(rng.randint(1, 3)))
    out = mx_ops.split_at(ranges, edges)
    assert out[0][0] == 1 and out[-1][1] is None
    for (_, hi), (lo, _) in zip(out, out[1:], strict=False):
        assert lo == hi + 1, out
    assert all(hi is None or lo <= hi for lo, hi in out), out
    his = {hi for _, hi in out}
    assert all(e in his for e in edges), (edges, out)
    for lo, hi in out:
        assert any(a <= lo and (b is None or (hi is not None and hi <= b)) for a, b in ranges), (
            lo,
            hi,
            ranges,
        )
