"""Every linear-shaped candidate gets one row, and each column of a row means one thing.

- Rows are never silent: batched expert matmuls over stacked int8 weights (`bmm`, `einsum("mk,enk->emn")`,
  one expert or four) and the weight as the left operand (`w @ x`, 1-D and 2-D x) each get a left-alone row
  with its reason (`patterns/unclaimed.py`), and the compiled numbers stay eager's.
- The reason of a rejected MX-shaped decode names the half that differs (e4m3 scale bytes: the scales), and
  the dtype column is the activation's on every row.
- A lowered row's "why" is the choice's own reason; the lowerings passed over are data, printed on demand.
- An absorbed residual add at M = 1 is named "residual", not "bias".
- An exported `Dim("batch", min=1, max=4096)` prints `1..4096`; a compiled symbolic batch `2..inf`.
"""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower.passes.report import NO_COMPILE_YET, SERVED_FROM_CACHE, Report
from qlower.patterns import mx_format as fmt
from qlower.testing import apply_pass, trace_for_inductor

BF16 = torch.bfloat16
E, N, K, M = 4, 48, 64, 8
torch.manual_seed(0)
W = torch.randint(-127, 128, (E, N, K), dtype=torch.int8)
S = torch.rand(E, N) / 100 + 1e-3


def bmm_experts(x):
    return torch.bmm(x, W.to(BF16).transpose(1, 2)) * S.to(BF16)[:, None]


def bmm_one_expert(x):
    return torch.bmm(x, W[:1].to(BF16).transpose(1, 2)) * S[:1].to(BF16)[:, None]


def einsum_experts(x):
    return torch.einsum("mk,enk->emn", x, W.to(BF16)) * S.to(BF16)[:, None]


def einsum_one_expert(x):
    return torch.einsum("mk,enk->emn", x, W[:1].to(BF16)) * S[:1].to(BF16)[:, None]


def weight_left_vector(v):
    return (W[0].to(BF16) @ v) * S[0].to(BF16)


def weight_left_matrix(v):
    return W[0].to(BF16) @ v


def dynamic_addmm_m1_decomposed(x):
    """Inductor's CPU decomposition of `addmm` at M = 1, `(x.T * w.T).sum(0, keepdim=True) + b`, of a
    dequantized int8 activation and weight (a PT2E dynamic-int8 linear with bias at batch 1)."""
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-5) / 127
    xd = (x / s).round().clamp(-128, 127).to(torch.int8).float() * s.float()
    wd = W[0].float() * S[0][:, None]
    return ((xd.t() * wd.t()).sum(0, keepdim=True) + S[1]).to(x.dtype)


SILENT_BEFORE = [
    (bmm_experts, (E, M, K), "woq_int8", "batched matmul"),
    (bmm_one_expert, (1, M, K), "woq_int8", "batched matmul"),
    (einsum_experts, (M, K), "woq_int8", "batched matmul"),
    (einsum_one_expert, (M, K), "woq_int8", "batched matmul"),
    (weight_left_vector, (K,), "woq_int8", "matrix-vector product W @ x"),
    (weight_left_matrix, (K, 3), "woq_int8", "is the left operand (W @ x)"),
    (dynamic_addmm_m1_decomposed, (1, K), "dynamic_int8", "decomposed to sum(a * b) over K"),
]


@pytest.mark.parametrize(
    ("fn", "shape", "family", "why"), SILENT_BEFORE, ids=[f.__name__ for f, *_ in SILENT_BEFORE]
)
def test_every_linear_shaped_product_gets_a_row(fn, shape, family, why):
    x = torch.randn(*shape, dtype=BF16)
    report = apply_pass(trace_for_inductor(fn, x))
    assert len(report) == 1, report.table()
    (d,) = report
    assert d.family == family and not d.lowered and why in d.reason, d
    # the activation's dtype as the product sees it (the dequantized fp32 one where the graph computes in fp32)
    assert (
        d.dtype == ("torch.float32" if family == "dynamic_int8" else "torch.bfloat16") and d.device == "cpu"
    )
    assert "int8[" in d.reason  # names the quantized storage it saw


@pytest.mark.parametrize("fn", [bmm_experts, weight_left_vector], ids=lambda f: f.__name__)
def test_left_alone_products_compile_to_eagers_numbers(fn):
    x = torch.randn(*(E, M, K) if fn is bmm_experts else (K,), dtype=BF16)
    torch._dynamo.reset()
    qlower.clear_reports()
    got = torch.compile(fn, options=qlower.inductor_options())(x)
    assert [d.lowered for d in qlower.last_report()] == [False]
    want = fn(x)  # eager is the reference: qlower left the graph as written
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


# ------------------------------------------------------------------------------ MX: which half differs
def _e4m3_scaled(elem: str):
    def f(x, q, e):  # MX-shaped: 32-element blocks, but the scale bytes are e4m3 values, not e8m0 codes
        ones = torch.full_like(e, fmt.E8M0_BIAS)
        w = fmt.dequantize(q, ones, elem, torch.float32) if elem == "e2m1" else q.float()
        s = e.view(torch.float8_e4m3fn).float()
        return torch.nn.functional.linear(x, (w.view(N, K // 32, 32) * s[..., None]).view(N, K).to(x.dtype))

    return f


@pytest.mark.parametrize("elem", ["e2m1", "e4m3"])
def test_e4m3_scale_bytes_are_blamed_on_the_scales(elem):
    x = torch.randn(5, K, dtype=BF16)
    q, e = fmt.quantize(torch.randn(N, K), elem)
    (d,) = apply_pass(trace_for_inductor(_e4m3_scaled(elem), x, q, e))
    assert not d.lowered and d.reason.startswith("scale decode differs from e8m0"), d.reason
    assert d.dtype == "torch.bfloat16", d  # the activation's dtype, not the storage's (uint8)


# ------------------------------------------------------------------------------ why / passed over
def test_lowered_row_has_its_own_why_and_the_passed_over_list_on_demand():
    from tests.forms.woq_int8 import WoqLinear

    model = WoqLinear(64, 48, BF16)
    x = torch.randn(128, 64, dtype=BF16)
    report = apply_pass(trace_for_inductor(model, x))
    (d,) = report
    assert d.lowered and d.reason is None
    assert d.why.startswith("AUTO") and d.lowering not in d.why, d.why
    for name, why in d.passed_over:
        assert name != d.lowering and why and name in d.passed_over_text
    explained = report.explain(0)
    assert "chosen:" in explained and "left alone" not in explained
    if d.passed_over:
        assert d.why.startswith(f"AUTO #{len(d.passed_over) + 1}:")
        assert d.passed_over[0][0] in explained and d.passed_over[0][0] not in report.table()


# ------------------------------------------------------------------------------ residual vs bias at M = 1
class _DynInt8Residual(torch.nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.register_buffer("w", torch.randint(-127, 128, (N, K), dtype=torch.int8))
        self.register_buffer("ws", torch.rand(N) / 100)
        self.b = torch.nn.Parameter(torch.randn(N)) if bias else None

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-5) / 127
        xq = (x / s).round().clamp(-128, 127).to(torch.int8)
        y = torch._int_mm(xq.view(-1, K), self.w.t()).float() * s.view(-1, 1) * self.ws
        y = y.view(*x.shape[:-1], N)
        return y + self.b if self.b is not None else h + y


@pytest.mark.parametrize("bias", [False, True], ids=["residual", "bias"])
def test_absorbed_residual_is_named_residual(bias):
    model = _DynInt8Residual(bias)
    x, h = torch.randn(1, 1, K), torch.randn(1, 1, N)
    (d,) = apply_pass(trace_for_inductor(model, x, h))
    parts = d.form.split("+")
    assert ("bias" in parts) == bias and ("residual" in parts) == (not bias), d.form


# ------------------------------------------------------------------------------ ranges and empty reports
def test_exported_dim_prints_the_users_range(tmp_path):
    from tests.forms.woq_int8 import WoqLinear

    model = WoqLinear(64, 48, BF16)
    ep = torch.export.export(
        model,
        (torch.randn(8, 64, dtype=BF16),),
        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
    )
    qlower.clear_reports()
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(tmp_path / "m.pt2"), inductor_configs=qlower.inductor_options()
    )
    (d,) = qlower.last_report()
    assert d.shape_text.startswith("1..4096, 64, 48"), d.shape_text
    runner = torch._inductor.aoti_load_package(path)
    x = torch.randn(1, 64, dtype=BF16)
    torch.testing.assert_close(runner(x), model(x), rtol=2e-2, atol=2e-2)  # M = 1 runs, as printed


def test_compiled_symbolic_batch_prints_from_two():
    from tests.forms.woq_int8 import WoqLinear

    model = WoqLinear(64, 48, BF16)
    x = torch.randn(8, 64, dtype=BF16)
    torch._dynamo.mark_dynamic(x, 0)
    report = apply_pass(trace_for_inductor(model, x, dynamic=True))
    (d,) = report
    assert d.shape_text.startswith("2.."), d.shape_text  # a compiled graph is guarded to M >= 2


def test_empty_reports_say_which_kind_of_empty():
    assert NO_COMPILE_YET in Report(None, opened=False).table()
    assert "model.forward = torch.compile" in NO_COMPILE_YET
    cached = Report("0/0", pass_ran=False).table()
    assert SERVED_FROM_CACHE in cached and "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1" in cached
    qlower.clear_reports()
    assert NO_COMPILE_YET in qlower.last_report().table()
