"""The report (`qlower.last_report()`, `qlower.all_reports()`, `Report.table()` / `explain()`): every
linear-shaped candidate gets one row, each column of a row means one thing, and a report describes the compile
that ran qlower, never another one.

Rows:
- Rows are never silent: batched expert matmuls over stacked int8 weights (`bmm`, `einsum("mk,enk->emn")`,
  one expert or four) and the weight as the left operand (`w @ x`, 1-D and 2-D x) each get a left-alone row
  with its reason (`patterns/unclaimed.py`), and the compiled numbers stay eager's.
- The reason of a rejected MX-shaped decode names the half that differs (e4m3 scale bytes: the scales), and
  the dtype column is the activation's on every row.
- A lowered row's "why" is the choice's own reason; the lowerings passed over are data, printed on demand.
- An absorbed residual add at M = 1 is named "residual", not "bias".
- An exported `Dim("batch", min=1, max=4096)` prints `1..4096`; a compiled symbolic batch `2..inf`.
- The fields and the table of a row; a dynamic M is a symbol.

Compiles:
- A lazily compiled backward keeps its forward's report (it used to open an empty "served from cache" one).
- A compile without qlower's options leaves `qlower.last_report()` alone; a real AOTAutograd cache hit of a
  qlower compile still says the pass did not run.
- A compile served from Inductor's caches never shows another compile's report. Inductor runs the joint-graph
  passes (qlower's among them) before it looks up the FX graph cache, so an FX graph cache hit still runs the
  pass and reports its decisions; a compile the AOTAutograd cache serves whole runs no pass, and gets a report
  of its own that says so (`pass_ran=False`, passes/report.py `watch_compiles`). Tests: options switched
  between compiles of one model in one process, and Inductor's mega-cache
  (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) carried into a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import qlower
from qlower.passes.report import NO_COMPILE_YET, SERVED_FROM_CACHE, Report
from qlower.patterns import mx_format as fmt
from qlower.testing import apply_pass, trace_for_inductor
from tests.forms.dynamic_int8 import IntMMDivide
from tests.forms.woq_int8 import WoqLinear
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

F32 = torch.float32
BF16 = torch.bfloat16
E, N, K, M = 4, 48, 64, 8
torch.manual_seed(0)
W = torch.randint(-127, 128, (E, N, K), dtype=torch.int8)
S = torch.rand(E, N) / 100 + 1e-3

# What each preference lowers a bf16 woq-int8 linear to on a CPU (AUTO: any of the CPU's woq lowerings).
CPU_WOQ = {"aten._weight_int8pack_mm", "qlower.woq_int8_gemm", "qlower.woq_int8_mm_by_m", "dequant_mm"}
EXPECTED = {"auto": CPU_WOQ, "emulated": {"dequant_mm"}, "aten": {"aten._weight_int8pack_mm"}}


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


# ------------------------------------------------------------------------------ fields and table
def test_report_fields_and_table():
    gm = trace_for_inductor(WoqLinear(24, 32, BF16), torch.randn(2, 3, 24, dtype=BF16))
    report = apply_pass(gm)
    (d,) = report.entries
    assert (d.family, d.device, d.shape, d.dtype) == ("woq_int8", "cpu", (6, 24, 32), "torch.bfloat16")
    assert d.lowering == "dequant_mm" and d.kind == "EMULATED" and "K % 16" in d.passed_over_text
    table = report.table()
    assert "1/1 lowered" in table and "dequant_mm" in table and "6, 24, 32" in table


def test_report_has_symbolic_m_for_dynamic_shapes():
    gm = trace_for_inductor(WoqLinear(64, 32, BF16), torch.randn(3, 5, 64, dtype=BF16), dynamic=True)
    (d,) = apply_pass(gm).entries
    assert isinstance(d.shape[0], torch.SymInt) and d.shape[1:] == (64, 32)


# ------------------------------------------------------------------------------ ranges and empty reports
def test_exported_dim_prints_the_users_range(tmp_path):
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


def test_a_compile_without_qlowers_pass_opens_no_report():
    """Only compiles whose Inductor config carries qlower's pass have reports (more: below)."""
    qlower.clear_reports()
    qlower.inductor_options()  # configuring qlower is not compiling with it
    torch.compile(lambda x: x + 1, backend="eager")(torch.randn(3))
    torch.compile(lambda x: x * 2)(torch.randn(3))
    assert qlower.all_reports() == [] and qlower.last_report().compile_id is None


# ------------------------------------------------------------------------------ compiles: backward
class _WoqThenTrainable(torch.nn.Module):
    """A frozen woq-int8 linear feeding a trainable float linear (weight and bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = WoqLinear(64, 48, F32)
        self.f = torch.nn.Linear(48, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self.q(x))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return self.q.reference(x) @ self.f.weight.double().t() + self.f.bias.double()


def _grads(model: torch.nn.Module, x: torch.Tensor, fn) -> tuple[torch.Tensor, ...]:
    model.zero_grad()
    x = x.detach().requires_grad_(True)
    out = fn(x)
    out.square().sum().backward()
    return out.detach(), x.grad, model.f.weight.grad, model.f.bias.grad


def test_report_after_backward_keeps_the_forward_rows():
    model, x = _WoqThenTrainable(), torch.randn(4, 64)
    fn = torch.compile(model, options=qlower.inductor_options())
    qlower.clear_reports()
    model.zero_grad()
    xg = x.clone().requires_grad_(True)
    out = fn(xg)
    forward = qlower.last_report()
    # The pass sees the joint graph: the forward linear, and the backward's grad_x = (dy * s) @ w.to(f32), a
    # woq linear of its own (unscaled, weight as [K, N]).
    assert forward.pass_ran and {d.shape for d in forward} == {(4, 64, 48), (4, 48, 64)}, forward.table()
    assert all(d.family == "woq_int8" and d.lowered for d in forward), forward.table()
    rows = list(forward.entries)
    out.square().sum().backward()  # compiles the backward lazily, here
    after = qlower.last_report()
    assert after is forward and after.pass_ran and after.entries == rows, after.table()
    assert len(qlower.all_reports()) == 1
    assert "did not run" not in after.table() and "2/2 lowered" in after.table()
    # The numbers: the forward against float64, every gradient against eager autograd.
    ref = model.reference(x)
    assert (out.double() - ref).abs().max() <= 1e-4 * ref.abs().max()
    compiled = (out.detach(), xg.grad, model.f.weight.grad.clone(), model.f.bias.grad.clone())
    for got, want in zip(compiled, _grads(model, x, model), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_report_after_backward_dynamic_int8_with_trainable_bias():
    model = IntMMDivide(256, 128)
    model.b = torch.nn.Parameter(model.b.clone())  # trainable; the int8 weight and scales stay buffers
    x = torch.randn(6, 256)
    fn = torch.compile(model, options=qlower.inductor_options(families=("dynamic_int8",)))
    qlower.clear_reports()
    out = fn(x)
    forward = qlower.last_report()
    (d,) = forward
    assert forward.pass_ran and d.family == "dynamic_int8" and d.lowered, forward.table()
    out.sum().backward()
    assert qlower.last_report() is forward and forward.pass_ran and list(forward) == [d]
    assert len(qlower.all_reports()) == 1
    torch.testing.assert_close(model.b.grad, torch.full((128,), 6.0))
    with torch.no_grad():
        eager = model(x)
    assert (out.detach() - eager).abs().max() <= 1e-5 * eager.abs().max()


def test_backward_after_another_compile_adds_no_report():
    """The backward belongs to the first compile: it neither opens a report nor takes over the newer one."""
    model, x = _WoqThenTrainable(), torch.randn(4, 64, requires_grad=True)
    qlower.clear_reports()
    out = torch.compile(model, options=qlower.inductor_options())(x)
    first = qlower.last_report()
    with torch.no_grad():
        torch.compile(WoqLinear(32, 16, F32), options=qlower.inductor_options())(torch.randn(2, 32))
    second = qlower.last_report()
    assert second is not first and second.pass_ran and len(second) == 1
    out.sum().backward()
    assert qlower.all_reports() == [first, second] and qlower.last_report() is second
    assert first.pass_ran and len(first) == 2  # the forward linear and its grad_x (see above)


# ------------------------------------------------------------------------------ compiles: other compiles, caches
def test_unrelated_compile_leaves_the_report_alone():
    model, x = WoqLinear(64, 48, torch.bfloat16), torch.randn(2, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.compile(model, options=qlower.inductor_options())(x)
    report = qlower.last_report()
    assert report.pass_ran and report.entries[0].lowering == "aten._weight_int8pack_mm"
    count = len(qlower.all_reports())
    other = torch.nn.Linear(8, 8)
    with torch.no_grad():
        torch.compile(other)(torch.randn(3, 8))  # Inductor, without qlower's options
        torch.compile(other, backend="eager")(torch.randn(5, 8))
        torch.compile(other, options={"max_autotune": False})(torch.randn(7, 8))
    assert qlower.last_report() is report and len(qlower.all_reports()) == count
    assert report.pass_ran and "did not run" not in qlower.last_report().table()


def test_aot_autograd_cache_hit_gets_a_report_of_its_own():
    """A compile served whole from AOTAutograd's cache never runs the pass: its report says so (no rows, the
    options named), never the previous compile's; an unrelated stock compile adds none."""
    model, x = WoqLinear(64, 48, F32), torch.randn(4, 64)
    caches = (
        fresh_cache(),
        torch._inductor.config.patch(fx_graph_cache=True),
        torch._functorch.config.patch(enable_autograd_cache=True),
    )
    with caches[0], caches[1], caches[2], torch.no_grad():
        counters.clear()
        first = torch.compile(model, options=qlower.inductor_options())(x)
        first_report, count = qlower.last_report(), len(qlower.all_reports())
        assert first_report.pass_ran and len(first_report) == 1
        torch._dynamo.reset()
        again = torch.compile(model, options=qlower.inductor_options())(x)
        assert counters["aot_autograd"]["autograd_cache_hit"] == 1
        served = qlower.last_report()
        assert served is not first_report and len(qlower.all_reports()) == count + 1
        assert not served.pass_ran and not served.entries and "served it whole" in served.table()
        torch.compile(torch.nn.Linear(4, 4))(torch.randn(2, 4))  # unrelated: no report either
        assert qlower.last_report() is served
    torch.testing.assert_close(again, first)
    ref = model.reference(x)
    assert (again.double() - ref).abs().max() <= 1e-4 * ref.abs().max()


def _caches_on():
    return (
        torch._inductor.config.patch(fx_graph_cache=True, force_disable_caches=False),
        torch._functorch.config.patch(enable_autograd_cache=True),
    )


def test_options_switched_between_cached_compiles_never_show_another_compiles_rows():
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    fx_on, aot_on = _caches_on()
    served = 0
    with fresh_cache(), fx_on, aot_on, torch.no_grad():
        counters.clear()
        previous = None
        for pref in ("auto", "emulated", "auto", "aten", "emulated"):
            torch._dynamo.reset()
            hits = counters["aot_autograd"]["autograd_cache_hit"]
            out = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))(x)
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=1e-1)
            report = qlower.last_report()
            assert report is not previous, f"{pref}: the previous compile's report"
            if counters["aot_autograd"]["autograd_cache_hit"] > hits:
                served += 1
                assert not report.pass_ran and not report.entries, report.table()
                assert SERVED_FROM_CACHE in report.table() and pref.upper() in report.table()
            else:
                assert report.pass_ran and len(report.entries) == 1, report.table()
                assert report.entries[0].lowering in EXPECTED[pref], (pref, report.table())
            previous = report
    # the third and fifth compiles repeat an earlier one's options: the AOTAutograd cache serves them
    assert served == 2, counters["aot_autograd"]


def test_stock_compiles_beside_qlower_ones_open_no_report():
    """A compile without qlower's options, served from the caches or not, leaves the reports alone."""
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    fx_on, aot_on = _caches_on()
    with fresh_cache(), fx_on, aot_on, torch.no_grad():
        torch.compile(model, options=qlower.inductor_options())(x)
        ours = qlower.all_reports()
        for _ in range(2):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(model)(x), model(x), rtol=2e-2, atol=1e-1)
        assert [id(r) for r in qlower.all_reports()] == [id(r) for r in ours]


_FRESH_PROCESS = """
import os, sys, torch
import qlower
from tests.forms.woq_int8 import WoqLinear
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = WoqLinear(64, 48, torch.bfloat16)
x = torch.randn(2, 64, dtype=torch.bfloat16)
with open(sys.argv[1], "rb") as f:
    torch.compiler.load_cache_artifacts(f.read())
with torch.no_grad():
    out = torch.compile(model, options=qlower.inductor_options())(x)
    torch.testing.assert_close(out, model(x), rtol=2e-2, atol=1e-1)
report = qlower.last_report()
if counters["aot_autograd"]["autograd_cache_hit"]:  # served from the loaded artifacts: a report saying so
    assert not report.pass_ran and not report.entries, report.table()
else:  # an AOTAutograd cache miss (its key covers more of the process than the FX graph): the pass ran
    assert report.pass_ran and [d.family for d in report.lowered] == ["woq_int8"], report.table()
print("served" if report.pass_ran is False else "ran", "ok")
"""


def test_mega_cache_in_a_fresh_process_reports_a_served_compile(tmp_path):
    torch.manual_seed(0)
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    fx_on, aot_on = _caches_on()
    with fresh_cache(), fx_on, aot_on, torch.no_grad():
        torch.compile(model, options=qlower.inductor_options())(x)
        assert qlower.last_report().pass_ran
        artifacts = torch.compiler.save_cache_artifacts()
    assert artifacts is not None
    (tmp_path / "cache.bin").write_bytes(artifacts[0])
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor_cache")}
    script = textwrap.dedent(_FRESH_PROCESS)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cache.bin")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
