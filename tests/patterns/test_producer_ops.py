"""A quantized product inside a producer library's own op is lowered, or gets a row naming the op.

optimum-quanto's frozen `QLinear` (qint8 weights) reaches the graph as `quanto::qbytes_mm(x, w_int8, scales)`:
no aten matmul, so every linear of such a model was silent ("no candidate linears"). Its arithmetic is read
from quanto's source (`patterns/producers.py`); passes/canonicalize.py rewrites the op into the aten form
woq_int8 (a float activation) or dynamic_int8 (an int8 one, quanto's `activations=qint8`) records, and the
numbers stay eager's. A producer's op qlower cannot prove (a float8 weight, an op it does not know) stays,
with a left-alone row naming it.

compressed-tensors has no op of its own: its models run a float linear on weights decompressed at the first
call, or fake-quantized in float each call, so no quantized product reaches a compiled graph (checked by
hand for W8A16, W8A8 and W4A16, compressed-tensors 0.20); it has no test here.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qlower
from qlower.patterns.producers import op_name
from qlower.testing import apply_pass, trace_for_inductor

oq = pytest.importorskip("optimum.quanto")

BF16 = torch.bfloat16
K, H, N = 64, 48, 32


def _quanto_mlp(dtype: torch.dtype, weights: object, activations: object = None) -> nn.Sequential:
    """Linear(K, H) + bias, ReLU, Linear(H, N): quantized and frozen as quanto's README does."""
    model = nn.Sequential(nn.Linear(K, H), nn.ReLU(), nn.Linear(H, N, bias=False)).to(dtype)
    oq.quantize(model, weights=weights, activations=activations)
    if activations is not None:
        with oq.Calibration():
            model(torch.randn(16, K, dtype=dtype))
    oq.freeze(model)
    return model


def _reference(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """float64 of the same int8 weights and scales (the activation unquantized)."""
    y = x.double()
    for layer in model:
        if isinstance(layer, nn.ReLU):
            y = y.relu()
            continue
        w = layer.weight._data.double() * layer.weight._scale.double()
        y = y @ w.t() + (layer.bias.double() if layer.bias is not None else 0)
    return y


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _producer_ops(gm: torch.fx.GraphModule, prefix: str = "quanto::qbytes_mm") -> list[str]:
    return [n for n in map(op_name, gm.graph.nodes) if n is not None and n.startswith(prefix)]


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("dynamic", [False, True])
def test_quanto_qint8_weights_lower_as_woq_int8(dtype, dynamic):
    model = _quanto_mlp(dtype, oq.qint8)
    gm = trace_for_inductor(model, torch.randn(2, 5, K, dtype=dtype), dynamic=dynamic)
    assert len(_producer_ops(gm)) == 2  # what the pass receives: quanto's op, no aten matmul
    report = apply_pass(gm)
    rows = [(d.family, d.lowered, d.shape[1:], d.dtype) for d in report]
    assert rows == [("woq_int8", True, (K, H), str(dtype)), ("woq_int8", True, (H, N), str(dtype))], (
        report.table()
    )
    assert all("weight_scale" in d.form for d in report)  # the op's definition: the scale on the weight
    assert _producer_ops(gm) == []


def test_quanto_qint8_weights_compile_to_eagers_numbers():
    model = _quanto_mlp(BF16, oq.qint8)
    x = torch.randn(2, 5, K, dtype=BF16)
    with torch.no_grad():
        eager = model(x)
        qlower.clear_reports()
        got = torch.compile(model, options=qlower.inductor_options())(x)
    assert [(d.family, d.lowered) for d in qlower.last_report()] == [("woq_int8", True)] * 2
    ref = _reference(model, x)
    torch.testing.assert_close(got, eager, rtol=1.6e-2, atol=1e-2)
    assert _rel(got, ref) <= max(1e-2, 2 * _rel(eager, ref))


class _QuantoInt8Activation(nn.Module):
    """What a quanto `QLinear(activations=qint8)` computes, written with quanto's ops: the activation
    quantized per tensor (`quantize_symmetric`), `qbytes_mm(x_int8, w_int8, s_x * s_w)`, the bias. The
    QLinear itself breaks Dynamo's graph around its activation subclass (see the compile test below)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("w", torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8))
        self.register_buffer("sw", (torch.rand(N, 1, generator=g) / 100 + 1e-3).to(dtype))
        self.register_buffer("sx", torch.tensor(0.03, dtype=dtype))
        self.register_buffer("b", torch.randn(N, generator=g).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = torch.ops.quanto.quantize_symmetric(x, torch.int8, None, self.sx)
        return torch.ops.quanto.qbytes_mm(xq, self.w, self.sx * self.sw) + self.b


@pytest.mark.parametrize("shape", [(5, K), (2, 5, K)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_quanto_int8_activations_lower_as_dynamic_int8(shape, dynamic):
    gm = trace_for_inductor(_QuantoInt8Activation(BF16), torch.randn(*shape, dtype=BF16), dynamic=dynamic)
    report = apply_pass(gm)
    rows = [(d.family, d.lowered, d.shape[1:]) for d in report]
    assert rows == [("dynamic_int8", True, (K, N))], report.table()
    assert _producer_ops(gm) == []
    assert len(_producer_ops(gm, "quanto::quantize_symmetric")) == 1  # the activation's quantize stays


def test_an_int8_product_dynamic_int8_turns_down_keeps_quantos_kernel():
    """Tensors a function closes over are graph inputs, dynamic under `dynamic=True`: a weight of symbolic
    shape, which dynamic_int8 does not record. The op then stays (its `_int_mm` form has shape rules of its
    own on some devices), with a row naming it."""
    mod = _QuantoInt8Activation(BF16)
    w, sw, sx = mod.w, mod.sw, mod.sx

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quanto.qbytes_mm(
            torch.ops.quanto.quantize_symmetric(x, torch.int8, None, sx), w, sx * sw
        )

    gm = trace_for_inductor(f, torch.randn(5, K, dtype=BF16), dynamic=True)
    report = apply_pass(gm)
    assert [(d.family, d.lowered) for d in report] == [("dynamic_int8", False)], report.table()
    assert report.entries[0].reason.startswith("quanto::qbytes_mm: optimum-quanto's own op;")
    assert len(_producer_ops(gm)) == 1 and not any(
        n.target is torch.ops.aten._int_mm.default for n in gm.graph.nodes
    )


def test_quanto_qlinear_int8_activations_compile_to_eagers_numbers():
    """The QLinear itself, graph breaks and all: each linear's graph gets its dynamic_int8 row, lowered."""
    model = _quanto_mlp(BF16, oq.qint8, oq.qint8)
    x = torch.randn(2, 5, K, dtype=BF16)
    with torch.no_grad():
        eager = model(x)
        qlower.clear_reports()
        got = torch.compile(model, options=qlower.inductor_options())(x)
    rows = [(d.family, d.lowered, d.shape[1:]) for r in qlower.all_reports() for d in r]
    assert sorted(rows) == [("dynamic_int8", True, (H, N)), ("dynamic_int8", True, (K, H))]
    ref = _reference(model, x)
    torch.testing.assert_close(got, eager, rtol=1.6e-2, atol=1e-2)
    assert _rel(got, ref) <= 2 * _rel(eager, ref)


def test_quanto_float8_weights_are_left_alone_naming_the_op():
    gm = trace_for_inductor(_quanto_mlp(BF16, oq.qfloat8), torch.randn(5, K, dtype=BF16))
    report = apply_pass(gm)
    assert [(d.family, d.lowered, d.shape[1:]) for d in report] == [
        ("mx", False, (K, H)),
        ("mx", False, (H, N)),
    ]
    for d in report:
        assert (
            d.reason.startswith("quanto::qbytes_mm: optimum-quanto's own op;")
            and "float8_e4m3fn[" in d.reason
        )
    assert len(_producer_ops(gm)) == 2  # quanto's kernel stays


@pytest.mark.parametrize(("families", "kept"), [(("mx",), 2), (("woq_int8",), 0)])
def test_a_family_that_is_off_keeps_the_producers_kernel(families, kept):
    gm = trace_for_inductor(_quanto_mlp(BF16, oq.qint8), torch.randn(5, K, dtype=BF16))
    report = apply_pass(gm, families=families)
    assert len(_producer_ops(gm)) == kept and len(report) == 2 - kept


# An op of a producer's namespace that qlower has no proof for (vLLM's namespace; a name no library uses).
@torch.library.custom_op("vllm::qlower_probe_w4a16_gemm", mutates_args=())
def _probe_gemm(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] times a 4-bit weight packed eight to an int32 word along K ([N, K / 8]), scales [N]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    w = ((packed[..., None] >> shifts) & 15).reshape(packed.shape[0], -1).to(x.dtype) - 8
    return x @ (w * scales[:, None]).t()


@_probe_gemm.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0])


def test_an_unproven_producer_op_gets_a_row_naming_it():
    packed = torch.randint(-(2**31), 2**31 - 1, (N, K // 8), dtype=torch.int32)
    scales = torch.rand(N, dtype=BF16)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.vllm.qlower_probe_w4a16_gemm(x, packed, scales)

    report = apply_pass(trace_for_inductor(f, torch.randn(3, 5, K, dtype=BF16)))
    assert [(d.family, d.lowered, d.shape, d.dtype) for d in report] == [
        ("woq_int8", False, (15, K, N), str(BF16))
    ]
    (d,) = report
    assert d.reason.startswith("vllm::qlower_probe_w4a16_gemm: vLLM's own op;") and "int32[" in d.reason
