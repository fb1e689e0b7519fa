"""MX graphs whose unlowered parts still read e8m0 values must compile and give eager's numbers.

A training compile's backward multiplies the gradient by the dequantized weight (blocks along N), which no
recognizer lowers; Inductor's C++ backend has no e8m0 type, so without `legalize_e8m0` that graph fails to
compile (stock `torch.compile` too). The decode it substitutes is checked on all 256 codes. Once the forward is
lowered, that backward reads qlower's exact decode, not the graph's spelling (`redecode_readers`).
"""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower import testing
from qlower.lowerings.emit.mx import mx_bytes
from qlower.lowerings.emit.mx_readers import legalize_e8m0
from qlower.patterns import mx_format as mx_fmt
from qlower.patterns.graph_utils import tensor_val
from qlower.testing import trace_for_inductor
from tests.forms import mx as mm


@pytest.fixture(autouse=True)
def _no_compile_caches():
    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _e8m0_readers(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Nodes other than qlower::mx_bytes that take an e8m0 value."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is not mx_bytes:
            for a in node.all_input_nodes:
                v = tensor_val(a)
                if v is not None and v.dtype == torch.float8_e8m0fnu:
                    out.append(node)
    return out


def test_legalized_decode_matches_torch_on_every_code():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e8m0fnu)

    def f(e):
        return e.float(), e.to(torch.bfloat16), e.view(torch.uint8), e.view(torch.int8)

    gm = trace_for_inductor(f, codes)
    assert _e8m0_readers(gm)
    assert legalize_e8m0(gm.graph) == 4
    gm.recompile()
    assert _e8m0_readers(gm) == []
    for got, want in zip(gm(codes), f(codes), strict=True):
        assert got.dtype == want.dtype
        if want.dtype.is_floating_point:
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num())  # 2**-127 at code 0 included
        else:
            assert torch.equal(got, want)


@pytest.mark.parametrize("a_elem", [None, "e4m3"])
@pytest.mark.parametrize("w_elem", ["e4m3", "e2m1"])
def test_training_with_e8m0_scales_compiles_and_matches_eager(a_elem, w_elem):
    torch.manual_seed(0)
    model = mm.MXLinear(a_elem, w_elem, 96, 64, e8m0=True, bias=True)
    model.b = torch.nn.Parameter(model.b.clone())
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    cot = torch.randn(2, 5, 96, dtype=torch.bfloat16)

    def grads(fn):
        xi = x.clone().requires_grad_(True)
        model.b.grad = None
        y = fn(xi)
        (y * cot).sum().backward()
        return y.detach(), xi.grad, model.b.grad.clone()

    eager = grads(model)
    torch._dynamo.reset()
    qlower.clear_reports()
    compiled = grads(torch.compile(model, options=qlower.inductor_options(families=("mx",))))
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    rows = [d for r in qlower.all_reports() for d in r]
    assert [d.lowering for d in rows if str(d.shape[2]) == "96"] == ["mx_dequant_mm"], rows  # the forward
    backward = [d for d in rows if str(d.shape[2]) == "64"]  # grad_x = grad_y @ dequant(w): blocks along N
    assert len(backward) == 1 and backward[0].lowering is None, rows


# torchao's MX training recipes (forward x @ w.T, dgrad g @ w, wgrad g.T @ x, each quantized to MXFP8 along its
# own K): (tokens, K, N) with square, non-square and odd block counts (K = 160: 5 blocks; 96 tokens: 3 blocks
# for the wgrad). Each failed in Inductor's C++ loop split before
# `inductor_fixes.fix_cpp_loop_split_sizes`.
TRAINING_SHAPES = [(128, 64, 64), (128, 160, 64), (128, 128, 256), (96, 96, 160)]


def _torchao_mx_training(kind: str, k: int, n: int, device: str) -> torch.nn.Module:
    pytest.importorskip("torchao")
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    if kind == "MXFP8Linear":
        return MXFP8Linear(k, n, bias=True, kernel_preference=KernelPreference.EMULATED).to(
            device, torch.bfloat16
        )
    model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to(device, torch.bfloat16)
    try:
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL))
    except AssertionError as err:  # torchao 0.18 refuses this config on torch < 2.12 ("latest nightly")
        if "nightly" not in str(err):
            raise
        pytest.skip(f"torchao refuses MXFP8TrainingOpConfig on torch {torch.__version__}: {err}")
    return model


def _step(fn, model: torch.nn.Module, x: torch.Tensor, cot: torch.Tensor) -> list[torch.Tensor]:
    """Output and every gradient of one forward + backward."""
    xi = x.clone().requires_grad_(True)
    params = list(model.parameters())
    for p in params:
        p.grad = None
    y = fn(xi)
    y.backward(cot)
    return [y.detach(), xi.grad, *(p.grad.clone() for p in params)]


def check_torchao_mx_training(
    kind: str, tokens: int, k: int, n: int, device: str, preference: str = "AUTO", lowered: bool = True
) -> None:
    """Compiled with qlower, torchao's MX training step matches torchao's eager MX, and each of its three
    matmuls (forward, dgrad, wgrad) is a row of the report: (M, K, N) = (T, K, N), (T, N, K), (N, T, K),
    lowered, or (`lowered=False`) left to stock with the training-compile reason."""
    torch.manual_seed(0)
    model = _torchao_mx_training(kind, k, n, device)
    x = torch.randn(2, tokens // 2, k, dtype=torch.bfloat16, device=device)
    cot = torch.randn(2, tokens // 2, n, dtype=torch.bfloat16, device=device)
    eager = _step(model, model, x, cot)
    torch._dynamo.reset()
    qlower.clear_reports()
    options = qlower.inductor_options(kernel_preference=preference)
    compiled = _step(torch.compile(model, options=options), model, x, cot)
    names = ["out", "grad x", *(name for name, _ in model.named_parameters())]
    for name, got, want in zip(names, compiled, eager, strict=True):
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert rel <= 1e-2, (name, rel)  # the same MX decode; only bf16 output rounding may differ
    rows = [d for r in qlower.all_reports() for d in r]
    shapes = sorted(tuple(int(s) for s in d.shape) for d in rows if d.family == "mx")
    assert shapes == sorted([(tokens, k, n), (tokens, n, k), (n, tokens, k)]), rows
    mx_rows = [d for d in rows if d.family == "mx"]
    if lowered:
        assert all(d.lowered for d in mx_rows), [(d.shape_text, d.reason) for d in rows]
    else:
        assert not any(d.lowered for d in mx_rows), [(d.shape_text, d.lowering) for d in rows]
        assert all("training compile" in d.reason for d in mx_rows), [d.reason for d in mx_rows]


CASES = [("MXFP8Linear", s) for s in TRAINING_SHAPES] + [
    ("MXFP8TrainingOpConfig", s) for s in TRAINING_SHAPES[::3]
]


@pytest.mark.parametrize(
    ("kind", "shape"), CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v
)
def test_torchao_mx_training_matches_eager_mx(kind, shape):
    check_torchao_mx_training(kind, *shape, device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("kind", "shape"), CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v
)
def test_torchao_mx_training_matches_eager_mx_cuda(kind, shape):
    """AUTO leaves a training step's MX linears to stock on CUDA (`devices/cuda.py::_prefer_mx_emulated`);
    EMULATED lowers them: both give eager MX's numbers."""
    check_torchao_mx_training(kind, *shape, device="cuda", lowered=False)
    check_torchao_mx_training(kind, *shape, device="cuda", preference="EMULATED")


def _mx_records(gm: torch.fx.GraphModule) -> list:
    from qlower.patterns import QuantLinear
    from qlower.patterns import mx as mx_patterns

    return [c for c in mx_patterns.find(gm.graph) if isinstance(c, QuantLinear)]


def test_cuda_auto_leaves_whole_block_training_mx_to_stock():
    """The CUDA rule reads the graph, not the device: a training compile's joint graph (AOTAutograd's
    backward tags) with whole MX blocks is left to stock, with a reason naming the measurement and the
    preference that lowers it anyway; the same linear in an inference graph, and a partial last block in a
    training graph (whose exact decode the backward needs) and a weight-only MX linear in a training graph
    (not measured against stock), keep the emulation."""
    from qlower.lowerings.devices import cuda
    from qlower.patterns.graph_utils import differentiates

    model = mm.MXLinear("e4m3", "e4m3", 96, 64, e8m0=True, bias=True)
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    joint, _ = testing.trace_joint_for_inductor(model, x.clone().requires_grad_(True))
    assert differentiates(joint.graph)
    recs = _mx_records(joint)
    assert [int(r.n) for r in recs] == [96], recs  # the forward (the backward's matmul has blocks along N)
    why = cuda._prefer_mx_emulated(recs[0])
    assert why is not None and "training compile" in why and "EMULATED" in why, why

    inference = trace_for_inductor(model, x)
    assert not differentiates(inference.graph)
    (rec,) = _mx_records(inference)
    assert cuda._prefer_mx_emulated(rec) is None

    weight_only = mm.MXLinear(None, "e4m3", 96, 64, e8m0=True, bias=True)
    joint, _ = testing.trace_joint_for_inductor(weight_only, x.clone().requires_grad_(True))
    (rec,) = _mx_records(joint)
    assert cuda._prefer_mx_emulated(rec) is None

    partial = mm.MXPartialBlock("e4m3", 24, 80)
    joint, _ = testing.trace_joint_for_inductor(partial, torch.randn(16, 80).requires_grad_(True))
    (rec,) = _mx_records(joint)
    assert cuda._prefer_mx_emulated(rec) is None
    from qlower.lowerings.registry import backends

    assert cuda.MX_EMULATED_CUDA in backends()["cuda"].lowerings


def _dim_cast_model(dims: str):
    """A matmul of two MX-cast operands, each cast along its K as torchao's MX recipe writes it: "1", a dim-1
    cast `to_mx(t.t().contiguous())` of a [K, rows] tensor (a wgrad's operands); "0", `to_mx(t)` of a
    [rows, K] tensor."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    def cast(t: torch.Tensor, dim1: bool) -> torch.Tensor:
        src = t.t().contiguous() if dim1 else t
        return MXTensor.to_mx(src, torch.float8_e4m3fn, 32).dequantize(torch.bfloat16)

    def f(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(cast(g, dims[0] == "1"), cast(x, dims[1] == "1").t())

    return f


@pytest.mark.parametrize("dims", ["11", "10", "01", "00"])
def test_dim1_cast_is_decoded_in_its_source_order(dims):
    """The emulation stores a dim-1 cast's decoded operand in its source's order, [K, rows] (one coalesced pass
    fused with the cast, not a transpose Inductor cannot tile), and hands the matmul the transposed view; other
    operands keep [rows, K]. Numbers: eager torchao."""
    pytest.importorskip("torchao")
    f = _dim_cast_model(dims)
    torch.manual_seed(0)
    shapes = {"1": ((64, 96), (64, 128)), "0": ((96, 64), (128, 64))}  # K = 64, rows 96 and 128
    g = torch.randn(shapes[dims[0]][0], dtype=torch.bfloat16)
    x = torch.randn(shapes[dims[1]][1], dtype=torch.bfloat16)
    gm = trace_for_inductor(f, g, x)
    rows = testing.apply_pass(gm)
    assert [(d.family, d.lowering) for d in rows] == [("mx", "mx_dequant_mm")], rows
    (mm,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default]

    def source_ordered(node: torch.fx.Node) -> bool:
        """permute(clone(permute(decoded))): stored [K, rows], read as [rows, K]."""
        inner = node.args[0] if node.target is torch.ops.aten.permute.default else None
        return (
            inner is not None
            and inner.target is torch.ops.aten.clone.default
            and (inner.args[0].target is torch.ops.aten.permute.default)
        )

    a, b_t = mm.args
    assert source_ordered(a) == (dims[0] == "1")
    assert b_t.target is torch.ops.aten.permute.default  # x's decoded [rows, K], transposed for the mm
    assert source_ordered(b_t.args[0]) == (dims[1] == "1")
    got, want = gm(g, x)[0], f(g, x)
    assert torch.equal(got, want), (got - want).abs().max()


# ------------------------------------------------ the backward through a lowered decode (`redecode_readers`)
def _partial_block_fn(elem: str, n: int, k: int):
    """MXPartialBlock (tests/forms/mx.py) as f(x, q, e): K % 32 != 0, as `repeat_interleave(32)[:, :K]`."""
    model = mm.MXPartialBlock(elem, n, k)

    def f(x: torch.Tensor, q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, {"q": q, "e": e}, (x,))

    return f, model.q, model.e


def _training_forms() -> dict[str, tuple]:
    """name -> (f(x, q, e), x, q, e, float64 [N, K] weight): every hand-written form, and partial blocks in
    fp16 (what the fuzz found wrong)."""
    n, k = 48, 64
    forms = {}
    for name, f in mm.hand_written_forms(n, k).items():
        x, q, e = mm.form_inputs(name, n, k)
        codes = e.t() if name == "fp4_table_scale_t" else e
        w64 = mx_fmt.dequantize_f64(q, codes, "e2m1" if name.startswith("fp4") else "e4m3")
        forms[name] = (f, x, q, e, w64)
    for elem in ("e4m3", "e2m1"):
        f, q, e = _partial_block_fn(elem, 40, 80)
        x = torch.randn(6, 80, generator=torch.Generator().manual_seed(1)).to(torch.float16)
        forms[f"partial_block_{elem}_fp16"] = (f, x, q, e, mx_fmt.dequantize_f64(q, e, elem))
    return forms


TRAINING_FORMS = _training_forms()


def _joint_graph(f, x: torch.Tensor, q: torch.Tensor, e: torch.Tensor, cot: torch.Tensor):
    """The forward + backward graph of (y, grad_x) with Inductor's decompositions, as the joint pass sees it."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    def joint(x, q, e, cot):
        y = f(x, q, e)
        (gx,) = torch.autograd.grad(y, x, cot)
        return y, gx

    return make_fx(joint, decomposition_table=select_decomp_table(), tracing_mode="fake")(
        x.detach().requires_grad_(True), q, e, cot
    )


def _ancestors(node: torch.fx.Node) -> list[torch.fx.Node]:
    seen, todo = {}, [node]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen[n] = None
            todo.extend(n.all_input_nodes)
    return list(seen)


@pytest.mark.parametrize("name", list(TRAINING_FORMS))
def test_backward_reads_the_exact_decode(name):
    """grad_x = grad_y @ dequant(w) (blocks along N: no MX linear, left alone) reads qlower's decode once the
    forward is lowered, not the graph's multiply: the graph's spelling may be miscompiled (the partial block's
    `repeat_interleave(32)[:, :K]` under Inductor's C++ loop split: test_partial_block_training_compiles_right).
    The substitute's values are the multiply's: both outputs bit for bit those of the unrewritten graph."""
    f, x, q, e, w64 = TRAINING_FORMS[name]
    cot = torch.randn(f(x, q, e).shape, generator=torch.Generator().manual_seed(2)).to(x.dtype)
    gm = _joint_graph(f, x, q, e, cot)
    want = gm(x, q, e, cot)
    rows = testing.apply_pass(gm, families=("mx",))
    assert [d.lowering for d in rows] == ["mx_dequant_mm", None], rows  # the forward; the backward's matmul
    (bwd,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default and not n.meta.get("qlower")]
    reads = _ancestors(bwd.args[1])
    assert any(n.meta.get("qlower") for n in reads), name
    graph_muls = [n for n in reads if n.target is torch.ops.aten.mul.Tensor and not n.meta.get("qlower")]
    assert graph_muls == [], graph_muls
    got = gm(x, q, e, cot)
    assert torch.equal(got[1], want[1]), (got[1] - want[1]).abs().max()
    ref = cot.double().reshape(-1, w64.shape[0]) @ w64
    gx = got[1].double().reshape(ref.shape)
    assert ((gx - ref).norm() / ref.norm()).item() <= 1e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_partial_block_training_compiles_right(dtype):
    """Compiled forward + backward through a partial-block MX weight (K = 80): grad_x is eager's, finite. The
    graph's own decode, which the backward read before `redecode_readers`, is compiled by Inductor's C++ loop
    split into K // 32 whole blocks per row: columns 64..79 of the backward's weight were never written (fp16
    grad_x non-finite where eager's is finite; the fuzz's seed 514967150)."""
    torch.manual_seed(0)
    model = mm.MXPartialBlock("e4m3", 24, 80)
    x = torch.randn(16, 80, dtype=dtype)
    cot = torch.randn(16, 24, dtype=dtype)

    def grads(fn):
        xi = x.clone().requires_grad_(True)
        y = fn(xi)
        (y.float() * cot.float()).sum().backward()
        return y.detach(), xi.grad

    eager = grads(model)
    torch._dynamo.reset()
    qlower.clear_reports()
    compiled = grads(torch.compile(model, options=qlower.inductor_options(families=("mx",))))
    assert compiled[1].isfinite().all()
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want)
    ref = cot.double() @ mx_fmt.dequantize_f64(model.q, model.e, "e4m3")
    assert ((compiled[1].double() - ref).norm() / ref.norm()).item() <= 1e-2
    rows = [d for r in qlower.all_reports() for d in r]
    assert [(d.lowering, "partial_block" in d.form) for d in rows] == [("mx_dequant_mm", True), (None, False)]
