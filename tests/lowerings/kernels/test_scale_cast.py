"""torchao's per-call cast of its fp32 weight scale, absorbed into qlower's CUDA woq-int8 Triton kernels.

torchao `Int8WeightOnlyConfig` keeps the scale fp32 [N, 1] and its linear casts it to x's dtype on every call
(`prims.convert_element_type(s, bf16)`, then a view): one extra small kernel per linear per call. The pattern
records that rounding (`patterns.record.ScaleCast`); the CUDA emission hands the kernels the fp32 tensor and
`round_scale`, and they round it to x's dtype in registers (`int8_kernels.load_scale`): the graph's scale,
and the cast dies. (`Int8DynamicActivationInt8WeightConfig` multiplies its fp32 scale in fp32: no cast there.)

CPU: the recognizer on traced graphs; every woq kernel the op launches under TRITON_INTERPRET=1 (fp16: bf16 is
broken in the interpreter), bit-exact against the graph's eager formula; the emitted graph. GPU: a compiled
torchao linear against the uncompiled one, with no Inductor kernel left.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch
import torch.nn.functional as F

from qlower import testing
from qlower.lowerings.preference import KernelPreference
from qlower.patterns import woq_int8
from qlower.patterns.record import QuantLinear, ScaleCast, ScaleSite
from tests.forms.woq_int8 import assert_close_to_reference
from tests.helpers import run_python

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def _torchao_linear(k: int, n: int, dtype: torch.dtype, bias: bool = False, device: str = "cpu"):
    ao = pytest.importorskip("torchao.quantization")
    lin = torch.nn.Linear(k, n, bias=bias, dtype=dtype, device=device)
    ao.quantize_(lin, ao.Int8WeightOnlyConfig())
    return lin


def _record(fn, *args) -> tuple[torch.fx.GraphModule, QuantLinear]:
    gm = testing.trace_for_inductor(fn, *args)
    (rec,) = woq_int8.find(gm.graph)
    assert isinstance(rec, QuantLinear), rec
    return gm, rec


def _casts_of(gm: torch.fx.GraphModule, source: torch.fx.Node) -> list[torch.fx.Node]:
    return [
        n
        for n in gm.graph.nodes
        if n.target is torch.ops.prims.convert_element_type.default and n.args[0] is source
    ]


# ------------------------------------------------------------------------------------------- recognizer
@pytest.mark.parametrize("bias", [False, True])
def test_torchao_scale_cast_is_recorded(bias: bool) -> None:
    """torchao's graph: the fp32 [N, 1] scale, its cast to bf16 and the view are the record's; `weight_scale`
    stays the bf16 view (every other lowering reads it unchanged) and the form says "scale_cast"."""
    lin = _torchao_linear(64, 32, BF16, bias)
    gm, rec = _record(lin, torch.randn(4, 64, dtype=BF16))
    cast = rec.scale_cast
    assert isinstance(cast, ScaleCast) and cast.dtype == BF16, rec
    src = cast.source
    sv = src.meta["val"]
    assert src.op == "placeholder" and (sv.dtype, tuple(sv.shape)) == (FP32, (32, 1)), src
    (convert,) = _casts_of(gm, src)
    assert convert in rec.nodes and rec.weight_scale in rec.nodes
    assert rec.weight_scale.meta["val"].dtype == BF16
    assert "scale_cast" in rec.form.split("+"), rec.form


def test_weight_side_cast_is_recorded() -> None:
    """The scale cast on the weight side (`w.to(bf16) * s.to(bf16)[:, None]`, s fp32) is the same fact."""
    w, s = torch.randint(-127, 128, (32, 64), dtype=torch.int8), torch.rand(32) * 0.02

    def f(x):
        return F.linear(x, w.to(x.dtype) * s[:, None].to(x.dtype))

    _, rec = _record(f, torch.randn(4, 64, dtype=BF16))
    assert rec.scale_site is ScaleSite.WEIGHT and isinstance(rec.scale_cast, ScaleCast)
    assert rec.scale_cast.source.meta["val"].dtype == FP32


def _second_user(x, w, s):
    s16 = s.to(x.dtype)
    return F.linear(x, w.to(x.dtype)) * s16, s16  # the cast is also a graph output


def _fp64_source(x, w, s):
    return F.linear(x, w.to(x.dtype)) * s.double().to(x.dtype)  # fp64 -> bf16 in one rounding


def _other_dtype(x, w, s):
    return F.linear(x, w.to(x.dtype)) * s.to(FP16)  # fp16 scale on a bf16 matmul (the product is fp32)


@pytest.mark.parametrize("fn", [_second_user, _fp64_source, _other_dtype], ids=lambda f: f.__name__[1:])
def test_cast_not_absorbed(fn) -> None:
    """No absorption where the cast must stay (another user) or is not fp32 rounded to the matmul's dtype."""
    w, s = torch.randint(-127, 128, (32, 64), dtype=torch.int8), torch.rand(32) * 0.02
    _, rec = _record(lambda x: fn(x, w, s), torch.randn(4, 64, dtype=BF16))
    assert rec.scale_cast is None and "scale_cast" not in rec.form, (rec.form, rec)


# ----------------------------------------------------------------------------------- kernels (interpreter)
# x in {-1, 0, 1} and |w| <= 42 at K = 48: |x @ w.T| <= 2016 is an integer exact in fp16 and fp32, in any
# sum order, and its products with an fp16 scale are exact in fp32. So the graph's
# `mm(x, w.t().half()) * s.half()` (eager fp16) rounds exactly once, at the end, as the kernels do: any kernel
# must match it bit for bit, and a kernel using the fp32 scale itself does not. Scales: not fp16 values, fp16
# subnormals (3e-6, 1e-7), values rounding to the smallest subnormal (4.5e-8) or to 0 (2.9e-8), outputs
# overflowing fp16 (40.1 * 2016), 65519 (-> 65504) and 65520 (the tie between 65504 and inf: to even is inf,
# so x @ w.T = 0 gives NaN in both).
INTERPRETER_SCRIPT = """
import torch
from qlower.lowerings.kernels.triton.int8 import ops
from qlower.lowerings.kernels.triton.configs import decode_dot, decode_fma, gemv, limbs, mm, tma

torch.manual_seed(0)
K, N = 48, 24
w = torch.randint(-42, 43, (N, K), dtype=torch.int8)
special = [3e-6, 1e-7, 4.5e-8, 2.9e-8, -0.0123, 32.77, 40.1, 65519.0, 65520.0, 0.0]
s = torch.cat([torch.rand(N - len(special)) * 0.02 + 0.005, torch.tensor(special)])
s16 = s.half()
assert (s16.float() != s).sum() >= N - 3 and torch.isinf(s16).sum() == 1

def graph(x):
    g = torch.mm(x, w.t().half()) * s16  # the torchao graph's formula, eager fp16
    f64 = (x.double() @ w.double().T * s16.double()).half()
    assert torch.equal(g.isnan(), f64.isnan()) and torch.equal(g[~g.isnan()], f64[~f64.isnan()])
    return g

def same(out, ref, what, cols=slice(None)):
    out, ref = out[:, cols], ref[:, cols]
    assert out.dtype == ref.dtype and torch.equal(out.isnan(), ref.isnan()), what
    assert torch.equal(out[~out.isnan()], ref[~ref.isnan()]), (what, (out.float() - ref.float()).abs().max())

CONFIGS = [gemv(1, 16, 32), gemv(4, 16, 16, fast=0), gemv(2, 8, 32, split_k=2), mm(16, 16, 32, swap=True),
           mm(16, 32, 16), mm(32, 16, 32, split_k=3), decode_fma(1, 16, 32), decode_fma(1, 8, 64, acc3=True),
           decode_fma(2, 16, 16), decode_dot(16, 16, 32), limbs(16, 16, 32)]
finite = torch.isfinite(s16)
for m in (1, 3, 17):
    x = torch.randint(-1, 2, (m, K)).half()
    if m > 1:
        x[0] = 0  # a zero row: 0 * inf is NaN in the graph and in the kernels
    ref = graph(x)
    for cfg in CONFIGS:
        out = ops.launch_config(cfg, x, w, s, round_scale=True)
        # split-K sums scaled partials: an inf scale gives inf - inf (NaN) where the graph's full sum times
        # inf is +-inf, for any inf scale; the other columns are exact
        same(out, ref, (m, str(cfg)), finite if cfg.split_k > 1 else slice(None))
    for cfg in (tma(16, 16, 32, fast=2), tma(16, 32, 16, progs_per_sm=2), tma(16, 16, 16, fast=0)):
        out = torch.empty(m, N, dtype=torch.float16)
        ops._launch_tma(cfg, x, w, s, None, None, out, 1, ops.round_code(torch.float16, True))
        same(out, ref, (m, str(cfg)))
    # the dequantized weight of the cuBLAS range: w * round(s), one rounding to fp16, then the same mm
    dense = ops._dense(x, w, s, None, torch.float16, round_ws=ops.round_code(torch.float16, True))
    same(dense, torch.mm(x, (w.float() * s16.float()[:, None]).half().t()), (m, "dense"))
    plain = ops.launch_config(mm(16, 32, 16), x, w, s)  # the fp32 scale as is: not the graph's numbers
    assert not torch.equal(plain[:, finite], ref[:, finite]), m
# the launches a symbolic M gets (gates evaluated at M), with and without AUTO's cuBLAS range above 256
for dense_above in (0, 256):
    for m in (1, 2, 16, 17, 65, 257):
        x = torch.randint(-1, 2, (m, K)).half()
        out = ops.launch_as_dynamic(x, w, s, dense_above=dense_above, round_scale=True)
        if dense_above and m > dense_above:
            ref = torch.mm(x, (w.float() * s16.float()[:, None]).half().t())
        else:
            ref = graph(x)
        same(out, ref, ("dynamic", dense_above, m))
print("ok")
"""


@needs_triton
def test_kernels_round_the_fp32_scale_like_the_graph() -> None:
    out = run_python(INTERPRETER_SCRIPT, env={"TRITON_INTERPRET": "1"})
    assert out.strip().endswith("ok"), out


def _traced_dynamic_m(fn, *args) -> torch.fx.GraphModule:
    """`fn` traced as qlower's emit traces it, M (args[0]'s dim 0) symbolic."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())

    def ctx(a: torch.Tensor, first: bool) -> StatelessSymbolicContext:
        dims = [DimDynamic.DYNAMIC if first and i == 0 else DimDynamic.STATIC for i in range(a.dim())]
        return StatelessSymbolicContext(dynamic_sizes=dims)

    fakes = [mode.from_tensor(a, symbolic_context=ctx(a, i == 0)) for i, a in enumerate(args)]
    with mode:
        return make_fx(dispatch_functionalize(fn, FunctionalTensorMode()), tracing_mode="real")(*fakes)


def _launch_constants(gm: torch.fx.GraphModule) -> list[tuple[str, dict]]:
    """(kernel name, constant args) of every Triton launch in `gm` and the branch graphs it holds; a gated
    dequantization range (`qlower::woq_int8_dense_gated`, which launches the dequantize kernel inside) as
    ("woq_int8_dense_gated", {"ROUND_WS": its round_ws argument})."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    gated = torch.ops.qlower.woq_int8_dense_gated.default
    nodes = [n for g in gm.modules() if isinstance(g, torch.fx.GraphModule) for n in g.graph.nodes]
    return [
        (
            kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__,
            {**kernel_side_table.get_constant_args(n.kwargs["constant_args_idx"]), **n.kwargs["kwargs"]},
        )
        for n in nodes
        if n.target is hop
    ] + [("woq_int8_dense_gated", {"ROUND_WS": n.args[5]}) for n in nodes if n.target is gated]


@needs_triton
@pytest.mark.parametrize("host_branch", [False, True], ids=["gated", "host_branched"])
def test_symbolic_m_launches_all_round_the_scale(host_branch: bool) -> None:
    """A symbolic M's every launch (each range's kernel and the dequantization above M = 256: gated, inside
    `qlower::woq_int8_dense_gated`; behind the host `if`s, the dequantize kernel) takes ROUND_WS for bf16 (1);
    without `round_scale`, 0."""
    from qlower.lowerings.kernels.triton.int8 import ops as int8_ops  # noqa: F401  (registers the triton_ops)

    k, n = 4096, 4096  # a tuned shape: several ranges, several kernels
    x, w, s = torch.randn(8, k, dtype=BF16), torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n)
    for rounds, want in ((True, 1), (False, 0)):
        gm = _traced_dynamic_m(
            lambda x, w, s, r=rounds: torch.ops.qlower.woq_int8_linear(x, w, s, None, 256, host_branch, r),
            x, w, s,
        )  # fmt: skip
        launches = _launch_constants(gm)
        names = {name for name, _ in launches}
        dense = "woq_int8_dense_gated" if not host_branch else "woq_dequant_kernel"
        assert dense in names and len(names) >= 3, names
        assert all(c["ROUND_WS"] == want for _, c in launches), launches


# ------------------------------------------------------------------------------------------ emitted graph
@needs_triton
@pytest.mark.parametrize("m", [1, 4, 40])
def test_emitted_graph_takes_the_fp32_scale_and_drops_the_cast(m: int) -> None:
    """The CUDA emission on torchao's CPU-traced graph (supports() needs CUDA; emit runs anywhere): every
    launch reads the fp32 scale through a view and rounds it (ROUND_WS 1), and erasing the record's dead
    nodes, as the pass does, leaves no convert of the scale."""
    from qlower.lowerings.emit import triton_int8
    from qlower.passes.qlower_pass import _erase_dead

    lin = _torchao_linear(256, 512, BF16, bias=True)
    gm = testing.trace_for_inductor(lin, torch.randn(1, m, 256, dtype=BF16))
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        (rec,) = woq_int8.find(gm.graph)
        src = rec.scale_cast.source
        assert _casts_of(gm, src)
        new = triton_int8.emit_woq_int8(gm.graph, rec, KernelPreference.AUTO)
        rec.output.replace_all_uses_with(new)
        _erase_dead(gm.graph, rec.nodes)
    gm.graph.lint()
    summary = testing.graph_summary(gm)
    assert not _casts_of(gm, src), summary
    launches = _launch_constants(gm)
    assert launches and all(c["ROUND_WS"] == 1 for _, c in launches), launches
    views = (torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default)
    for _, c in launches:
        ws = c["ws_ptr"] if "ws_ptr" in c else c["s_ptr"]
        assert ws.meta["val"].dtype == FP32 and tuple(ws.meta["val"].shape) == (512,), summary
        while ws is not src:  # views of the fp32 source only: no copy, no convert
            assert ws.target in views, summary
            ws = ws.args[0]


# ------------------------------------------------------------------------------------------------ GPU
_INDUCTOR_KERNEL = re.compile(r"def (triton_(?:poi|red|per)_\w+)\(")


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_torchao_linear_on_cuda(dynamic: bool) -> None:
    """torchao's bf16 linear compiled with qlower: the output of the uncompiled model within the woq
    tolerance (float64 of the graph's own formula as reference), and where qlower's kernels run (static
    M <= 256, any M of a symbolic compile) no Inductor kernel is left: the scale's cast was one."""
    import qlower

    torch.manual_seed(0)
    lin = _torchao_linear(4096, 4096, BF16, device="cuda")
    w = lin.weight
    ref_w = w.qdata.double() * w.scale.to(BF16).double().reshape(-1, 1)
    compiled = torch.compile(lin, options=qlower.inductor_options(), dynamic=dynamic)
    from torch._inductor.utils import run_and_get_code

    for m in (1, 16, 300):
        x = torch.randn(1, m, 4096, dtype=BF16, device="cuda")
        with torch.no_grad():
            out, code = run_and_get_code(compiled, x)
            eager = lin(x)
        assert_close_to_reference(out, eager, x.double() @ ref_w.t())
        if dynamic and m > 1 and not code:
            continue  # one symbolic graph serves every M after the first recompile: nothing compiled now
        entries = qlower.last_report().entries
        if not dynamic and m > 256:
            continue  # static M past the crossover: dequant + cuBLAS, which keeps the graph's cast
        (d,) = entries
        assert d.lowering == "triton.woq_int8_linear" and "scale_cast" in d.form, qlower.last_report().table()
        kernels = _INDUCTOR_KERNEL.findall("\n".join(code))
        assert not kernels, kernels
