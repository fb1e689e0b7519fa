"""MX recognized by what its decode computes on every code, special codes included.

Look-alike decodes that differ from MX only at special codes (e8m0 255 -> 0, NaN fp8 elements zeroed) are left
alone with the code that differs; decodes that agree (NaN guards, e5m2 Inf, every fp4 code) or differ in ways
the emulation reproduces (+Inf at e8m0 255, 0.0 at code 0) are lowered and match eager bit for bit in their
NaN / Inf positions. An fp4 table held as a module buffer is verified where its values are known at compile
time (freezing, export) and left alone with a reason where they are not; high-nibble-first packing and partial
last blocks (K % 32) are lowered by the emulation. Each CPU test compiles with qlower and compares to eager or
a float64 reference; the `gpu` tests check CUDA picks the emulation where its kernels cannot take a record.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower.patterns import mx
from qlower.patterns import mx_format as fmt
from qlower.patterns.record import Rejection
from tests.forms import mx as mm

N, K = 48, 64


@pytest.fixture(autouse=True)
def _no_compile_caches():
    """A cached compile skips qlower's pass (and its report): every test compiles afresh."""
    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _compile(fn, **opts):
    torch._dynamo.reset()
    qlower.clear_reports()
    return torch.compile(fn, options=qlower.inductor_options(families=("mx",), **opts))


def _decision():
    (d,) = [d for r in qlower.all_reports() for d in r]
    return d


def _assert_same_numbers(out: torch.Tensor, eager: torch.Tensor) -> None:
    """NaN and Inf where eager has them, the finite values close (bf16 matmuls summed in another order)."""
    assert torch.equal(out.isnan(), eager.isnan()), "NaN positions differ"
    torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2, equal_nan=True)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


# ------------------------------------------------------------------------------------------ special codes
@pytest.mark.parametrize("name", list(mm.special_code_forms(N, K)))
def test_special_code_forms_vs_eager(name):
    form = mm.special_code_forms(N, K)[name]
    x, q, e = mm.special_code_inputs(form.elem, N, K)
    eager = form.fn(x, q, e)
    assert not eager.isfinite().all()  # the planted special codes reach the output
    out = _compile(form.fn)(x, q, e)
    d = _decision()
    if form.left_alone is None:
        assert d.lowering == "mx_dequant_mm", d
    else:
        assert d.lowering is None and form.left_alone in d.reason, d
    _assert_same_numbers(out, eager)


def test_unguarded_exp2_reproduces_inf_at_code_255():
    """`exp2(e - 127)` is +Inf at code 255: the record says so and the emulation decodes it that way."""
    form = mm.special_code_forms(N, K)["e8m0_unguarded"]
    x, q, e = mm.special_code_inputs(form.elem, N, K)
    (rec,) = mx.find(mm.trace(form.fn, x, q, e).graph)
    assert rec.weight_mx.scale_special == {255: float("inf")}
    q.view(torch.uint8)[0, :32] = (
        0x30  # row 0's first block (code 255): all 0.5, so x @ w.T is +Inf for x > 0
    )
    x = x.abs() + 0.5
    eager = form.fn(x, q, e)
    assert eager[:, 0].isposinf().all()
    out = _compile(form.fn)(x, q, e)
    assert out[:, 0].isposinf().all()  # the spec's decode would give NaN here
    _assert_same_numbers(out, eager)


def test_decode_splitting_a_factor_between_its_halves_is_mx():
    """A doubled fp4 table with exponent bias 128 computes exactly MX: recognized by its product."""

    def f(x, q, e):
        lut = torch.tensor([2 * v for v in fmt.E2M1_VALUES], device=q.device)
        vals = lut[torch.stack([q & 15, q >> 4], -1).view(N, K).long()]
        s = torch.where(e == 255, float("nan"), torch.exp2(e.float() - 128))
        return F.linear(x, (vals.view(N, K // 32, 32) * s[..., None]).view(N, K).to(x.dtype))

    x, q, e = mm.special_code_inputs("e2m1", N, K)
    (rec,) = mx.find(mm.trace(f, x, q, e).graph)
    assert not isinstance(rec, Rejection), rec.reason
    assert rec.weight_mx.scale_special == {}
    _assert_same_numbers(_compile(f)(x, q, e), f(x, q, e))


def test_probe_sees_every_code_of_a_tiny_weight():
    """Two rows of one block hold two scale codes; the decode is still checked on all 256."""
    n, k = 2, 32
    form = mm.special_code_forms(n, k)["e8m0_wrong_at_200"]
    x, q, e = mm.form_inputs("pow2_fp32_matmul", n, k)
    (rej,) = mx.find(mm.trace(form.fn, x, q, e).graph)
    assert isinstance(rej, Rejection) and "scale decode differs from e8m0 at code 200" in rej.reason
    e[0, 0] = 200
    out = _compile(form.fn)(x, q, e)
    assert _decision().lowering is None
    _assert_same_numbers(out, form.fn(x, q, e))


def test_weight_from_8bit_data_that_is_not_mx_gets_a_row():
    """fp8 elements with a float per-row scale: no e8m0 codes, not MX, and the report says so."""

    def f(x, q, s):
        return F.linear(x, (q.float() * s[:, None]).to(x.dtype))

    x = torch.randn(5, K, dtype=torch.bfloat16)
    q = (torch.randn(N, K) * 0.1).to(torch.float8_e4m3fn)
    s = torch.rand(N) + 0.5
    (rej,) = mx.find(mm.trace(f, x, q, s).graph)
    assert isinstance(rej, Rejection) and rej.shape == (5, K, N)
    assert "weight is computed from 8-bit data" in rej.reason and "float8_e4m3fn" in rej.reason


# ------------------------------------------------------------------------------------------ fp4 tables
@pytest.mark.parametrize("nibbles", fmt.NIBBLE_ORDERS)
def test_table_buffer_as_graph_input_is_lowered_reading_the_table_at_run_time(nibbles):
    """A buffer is a graph input under torch.compile: its values are unknown at compile time, so the decode
    is verified as a gather from it, and the emulation gathers from the same buffer at run time. Writing
    other values into the buffer changes the compiled result exactly as it changes eager's."""
    m = mm.MXFP4TableBuffer(N, K, nibbles)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    fn = _compile(m)
    with torch.no_grad():
        out = fn(x)
    d = _decision()
    assert d.lowering == "mx_dequant_mm" and "runtime_table" in d.form.split("+"), d
    assert _rel(out, m.reference(x)) <= 1e-2
    m.lut.copy_(torch.randn(16, generator=torch.Generator().manual_seed(3)))  # not e2m1 any more
    with torch.no_grad():
        _assert_same_numbers(fn(x), m(x))


class _SignFromCode(mm.MXFP4TableBuffer):
    """e2m1 through a table of magnitudes and the sign bit: MX with the e2m1 values in the buffer, but not a
    gather by code, so with any other table it is not what a gather computes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q
        codes = torch.stack([q & 15, q >> 4], -1).view(self.n, self.k).long()
        vals = self.lut[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
        s = torch.exp2(self.e.float() - 127)
        w = (vals.view(self.n, self.k // 32, 32) * s[..., None]).view(self.n, self.k)
        return torch.nn.functional.linear(x, w.to(x.dtype))


def test_table_buffer_read_other_than_by_code_is_left_alone_with_reason():
    m = _SignFromCode(N, K)
    x = torch.randn(5, K, dtype=torch.bfloat16)
    with torch.no_grad():
        out = _compile(m)(x)
        eager = m(x)
    d = _decision()
    assert d.lowering is None and "decode table is a runtime input" in d.reason, d
    assert "does not gather from it by the fp4 codes" in d.reason, d.reason
    _assert_same_numbers(out, eager)


@pytest.mark.parametrize("nibbles", fmt.NIBBLE_ORDERS)
def test_table_buffer_frozen_is_lowered(nibbles):
    """Under freezing the buffer is a constant: its values are verified, the linear lowered."""
    m = mm.MXFP4TableBuffer(N, K, nibbles).eval()
    x = torch.randn(5, K, dtype=torch.bfloat16)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        out = _compile(m)(x)
    d = _decision()
    assert d.lowering == "mx_dequant_mm", d
    assert _rel(out, m.reference(x)) <= 1e-2


def test_table_buffer_exported_is_lowered(tmp_path):
    """Under export + AOTInductor the buffer is an attribute (get_attr) holding real values: lowered."""
    m = mm.MXFP4TableBuffer(N, K).eval()
    x = torch.randn(5, K, dtype=torch.bfloat16)
    qlower.clear_reports()
    with torch.no_grad():
        ep = torch.export.export(m, (x,))
        path = torch._inductor.aoti_compile_and_package(
            ep,
            package_path=str(tmp_path / "m.pt2"),
            inductor_configs=qlower.inductor_options(families=("mx",)),
        )
    assert [d.lowering for r in qlower.all_reports() for d in r] == ["mx_dequant_mm"]
    out = torch._inductor.aoti_load_package(path)(x)
    assert _rel(out, m.reference(x)) <= 1e-2


# ------------------------------------------------------------------------------------------ nibble order
def test_high_nibble_first_is_lowered():
    q, e = fmt.quantize(torch.randn(N, K) * K**-0.5, "e2m1")
    q_hi = fmt.pack_e2m1(fmt.unpack_codes(q), "high_first")
    x = torch.randn(5, K, dtype=torch.bfloat16)
    f = mm.high_nibble_first_form(N, K)
    out = _compile(f)(x, q_hi, e)
    d = _decision()
    assert d.lowering == "mx_dequant_mm" and "high_nibble_first" in d.form, d
    ref = x.double() @ fmt.dequantize_f64(q_hi, e, "e2m1", "high_first").t()
    assert _rel(out, ref) <= 1e-2
    assert _rel(out, x.double() @ fmt.dequantize_f64(q_hi, e, "e2m1").t()) > 0.1  # the order matters


# ------------------------------------------------------------------------------------------ partial blocks
@pytest.mark.parametrize("k", [48, 80, 100])
@pytest.mark.parametrize("elem", ["e4m3", "e2m1"])
def test_partial_last_block_is_lowered_exactly(elem, k):
    m = mm.MXPartialBlock(elem, N, k)
    x = torch.randn(3, k, dtype=torch.bfloat16)
    with torch.no_grad():
        out = _compile(m)(x)
        eager = m(x)
    d = _decision()
    assert d.lowering == "mx_dequant_mm" and "partial_block" in d.form and d.shape == (3, k, N), d
    assert _rel(out, m.reference(x)) <= 1e-2
    _assert_same_numbers(out, eager)


def test_dynamic_mx_partial_last_block_is_lowered():
    """Both operands MX with K = 80, the activation quantized in the graph, M dynamic."""
    m = mm.MXDynamicPartialBlock(40, 80)
    torch._dynamo.reset()
    qlower.clear_reports()
    compiled = torch.compile(m, options=qlower.inductor_options(families=("mx",)), dynamic=True)
    with torch.no_grad():
        for rows in (6, 9):
            x = torch.randn(rows, 80, dtype=torch.bfloat16)
            _assert_same_numbers(compiled(x), m(x))
    (d,) = [d for r in qlower.all_reports() for d in r]
    assert (
        d.lowering == "mx_dequant_mm" and d.form.startswith("dynamic+e4m3xe4m3") and "partial_block" in d.form
    )


def _repeat_interleave_slice(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.repeat_interleave(32, dim=1)[:, :48] * b


def _padded_product_slice(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (F.pad(b, (0, 16)).view(4, 2, 32) * a[:, :, None]).view(4, 64)[:, :48] + 0


@pytest.mark.xfail(
    strict=True, reason="torch 2.13 Inductor CPU writes only the first 32 columns per block row"
)
@pytest.mark.parametrize("fn", [_repeat_interleave_slice, _padded_product_slice])
def test_upstream_repeat_interleave_slice_bug(fn):
    """Stock torch.compile, no qlower: a per-32-column factor sliced to K = 48, fused into a pointwise consumer,
    is wrong past column 32 (also at R, K = 16/24, 32/33, 64/80). qlower's emulation gathers each element's
    block scale instead (lowerings/emit/mx.py `dequant`). Starts passing when upstream fixes it."""
    a, b = torch.randn(4, 2), torch.randn(4, 48)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(fn)(a, b), fn(a, b))


# ------------------------------------------------------------------------------------------ CUDA
def _cuda_compile_report(fn, *args):
    out = _compile(fn)(*args)
    return out, _decision()


@pytest.mark.gpu
def test_cuda_partial_block_and_high_nibble_take_the_emulation():
    """The Triton / cuBLAS kernels read whole blocks, low nibble first: they decline, the emulation lowers."""
    m = mm.MXPartialBlock("e4m3", N, 80).cuda()
    x = torch.randn(3, 80, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        out, d = _cuda_compile_report(m, x)
    assert d.lowering == "mx_dequant_mm" and "partial MX block" in d.passed_over_text, d
    assert _rel(out.cpu(), m.cpu().reference(x.cpu())) <= 1e-2

    q, e = fmt.quantize(torch.randn(N, K) * K**-0.5, "e2m1")
    q_hi = fmt.pack_e2m1(fmt.unpack_codes(q), "high_first")
    x = torch.randn(1, K, dtype=torch.bfloat16)
    out, d = _cuda_compile_report(mm.high_nibble_first_form(N, K), x.cuda(), q_hi.cuda(), e.cuda())
    assert d.lowering == "mx_dequant_mm" and "high nibble" in d.passed_over_text, d
    assert _rel(out.cpu(), x.double() @ fmt.dequantize_f64(q_hi, e, "e2m1", "high_first").t()) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8])  # the f16x2 GEMV (M = 1) and a tile kernel (M = 8)
@pytest.mark.parametrize("name", ["e8m0_255_to_zero", "e8m0_255_to_nan", "e8m0_unguarded", "e4m3_nan_to_num"])
def test_cuda_special_codes(name, m):
    """On CUDA the kernels decode e8m0 codes 0 and 255 as the matched decode does (the record's special map,
    passed to `qlower::mx_linear`; tests/lowerings/kernels/test_mx_triton_special.py checks each kernel path
    value by value). Finite outputs and their positions are eager's, NaN fp8 elements included (the data
    plants 0x7f / 0xff)."""
    form = mm.special_code_forms(N, K)[name]
    x, q, e = (t.cuda() for t in mm.special_code_inputs(form.elem, N, K, m=m))
    eager = form.fn(x, q, e)
    out, d = _cuda_compile_report(form.fn, x, q, e)
    assert (d.lowering is None) == (form.left_alone is not None), d
    assert torch.equal(out.isfinite(), eager.isfinite()), d
    fin = eager.isfinite()
    torch.testing.assert_close(out[fin], eager[fin], rtol=2e-2, atol=2e-2)
