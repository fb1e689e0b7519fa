"""Linears spelled as `bmm` reach the recognizers as `mm` (passes/canonicalize.py): `torch.einsum`, and
`F.linear` on a 3-D activation that is not viewable as 2-D (transposed, or expanded with stride 0).

Traced graphs as qlower's pass receives them: the batch-1 `bmm` becomes `mm` with views around it, the
quantized linear behind it is lowered like its F.linear spelling, and a float einsum is left untouched.
"""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase

import qlower
from qlower.passes.canonicalize import einsum_to_mm, shared_weight_bmm_to_mm
from qlower.patterns import mx_format as fmt
from qlower.testing import apply_pass, graph_summary, trace_for_inductor
from tests.forms import woq_int8 as woq_forms
from tests.helpers.fake_gpu_trace import fake_cuda_trace

BF16 = torch.bfloat16
N, K = 48, 64


def _woq_weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    return w, (torch.rand(N, generator=g) * 0.02 + 0.005).to(BF16)


W, S = _woq_weights()
FORMS_WOQ = woq_forms.FORMS
FORMS = {
    "mk,nk": (lambda x: torch.einsum("mk,nk->mn", x, W.to(BF16)) * S, (6, K)),
    "bsk,nk": (lambda x: torch.einsum("bsk,nk->bsn", x, W.to(BF16)) * S, (2, 3, K)),
    "bsk,kn": (lambda x: torch.einsum("bsk,kn->bsn", x, W.t().to(BF16)) * S, (2, 3, K)),
    "...k,nk scale first": (lambda x: torch.einsum("...k,nk->...n", x, W.to(BF16) * S[:, None]), (2, 3, K)),
}


def _reference(x: torch.Tensor) -> torch.Tensor:
    return (x.double().reshape(-1, K) @ (W.double() * S.double()[:, None]).t()).reshape(*x.shape[:-1], N)


class EinsumGraph(TestCase):
    def test_rewritten_graph(self):
        f, shape = FORMS["bsk,nk"]
        gm = trace_for_inductor(f, torch.randn(*shape, dtype=BF16))
        assert einsum_to_mm(gm.graph) == 1
        self.assertExpectedInline(
            graph_summary(gm),
            """\
convert_element_type: bfloat16[48, 64] = prims.convert_element_type(arg0_1, bfloat16)
reshape_default: bfloat16[6, 64] = aten.reshape(arg1_1, [6, 64])
permute_default: bfloat16[64, 48] = aten.permute(convert_element_type, [1, 0])
mm_default: bfloat16[6, 48] = aten.mm(reshape_default, permute_default)
reshape_default_1: bfloat16[2, 3, 48] = aten.reshape(mm_default, [2, 3, 48])
mul: bfloat16[2, 3, 48] = aten.mul.Tensor(reshape_default_1, arg2_1)""",
        )

    def test_float_einsum_is_left_alone(self):
        w = torch.randn(N, K, dtype=BF16)
        gm = trace_for_inductor(
            lambda x, w: torch.einsum("mk,nk->mn", x, w), torch.randn(6, K, dtype=BF16), w
        )
        assert einsum_to_mm(gm.graph) == 0
        assert any(n.target is torch.ops.aten.bmm.default for n in gm.graph.nodes)

    def test_true_batched_einsum_is_left_alone(self):
        f = lambda x: torch.einsum("bmk,bnk->bmn", x, W.to(BF16).expand(2, N, K))  # noqa: E731
        gm = trace_for_inductor(f, torch.randn(2, 5, K, dtype=BF16))
        assert einsum_to_mm(gm.graph) == 0


@pytest.mark.parametrize("name", list(FORMS))
@pytest.mark.parametrize("dynamic", [False, True])
def test_woq_einsum_lowered_and_matches_float64(name, dynamic):
    f, shape = FORMS[name]
    x = torch.randn(*shape, dtype=BF16, generator=torch.Generator().manual_seed(1))
    report = apply_pass(trace_for_inductor(f, x, dynamic=dynamic))
    (d,) = report.entries
    assert d.family == "woq_int8" and d.lowered, report.table()
    torch._dynamo.reset()
    out = torch.compile(f, options=qlower.inductor_options(), dynamic=dynamic)(x).double()
    ref = _reference(x)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2


def test_mx_einsum_lowered_and_matches_float64():
    q, e = fmt.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * K**-0.5, "e4m3")

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("mk,nk->mn", x, fmt.dequantize(q, e, "e4m3", BF16))

    x = torch.randn(6, K, dtype=BF16, generator=torch.Generator().manual_seed(3))
    out = torch.compile(f, options=qlower.inductor_options())(x).double()
    (d,) = qlower.last_report().entries
    assert d.family == "mx" and d.lowered, qlower.last_report().table()
    ref = x.double() @ fmt.dequantize_f64(q, e, "e4m3").t()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2


def test_einsum_exported_with_a_dynamic_batch(tmp_path):
    """torch.export keeps chain sizes as `sym_size` reads of the chain's nodes: they move to the new `mm`, so the
    chain dies and the output scale joins the record (it stayed outside before)."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", W)
            self.register_buffer("s", S)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.einsum("bk,nk->bn", x, self.w.to(x.dtype)) * self.s

    model = Model()
    x = torch.randn(8, K, dtype=BF16)
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    path = torch._inductor.aoti_compile_and_package(
        ep, package_path=str(tmp_path / "einsum.pt2"), inductor_configs=qlower.inductor_options()
    )
    (d,) = qlower.last_report().entries
    assert d.lowered and d.form == "mm+output_scale", qlower.last_report().table()
    runner = torch._inductor.aoti_load_package(path)
    for m in (1, 13):
        x = torch.randn(m, K, dtype=BF16, generator=torch.Generator().manual_seed(m))
        ref = _reference(x)
        assert ((runner(x).double() - ref).norm() / ref.norm()).item() < 1e-2


# F.linear on a 3-D activation that is not viewable as [B*S, K]: Inductor multiplies bmm(x, w.expand(B, K, N)).
BATCHED_VIEWS = {
    "transposed": lambda g: torch.randn(5, 3, K, dtype=BF16, generator=g).transpose(0, 1),
    "expanded": lambda g: torch.randn(1, 3, K, dtype=BF16, generator=g).expand(4, 3, K),
    "permuted_sliced": lambda g: torch.randn(3, 8, K, dtype=BF16, generator=g).permute(1, 0, 2)[::2],
}


def _woq_linear(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, W.to(x.dtype)) * S


@pytest.mark.parametrize("view", list(BATCHED_VIEWS))
@pytest.mark.parametrize("dynamic", [False, True])
def test_woq_on_a_non_viewable_3d_activation_is_lowered(view, dynamic):
    x = BATCHED_VIEWS[view](torch.Generator().manual_seed(4))
    gm = trace_for_inductor(_woq_linear, x, dynamic=dynamic)
    assert any(n.target is torch.ops.aten.bmm.default for n in gm.graph.nodes)  # the form this is about
    report = apply_pass(gm)
    (d,) = report.entries
    assert d.family == "woq_int8" and d.lowered, report.table()
    assert not any(n.target is torch.ops.aten.bmm.default for n in gm.graph.nodes)
    torch._dynamo.reset()
    out = torch.compile(_woq_linear, options=qlower.inductor_options(), dynamic=dynamic)(x).double()
    ref = _reference(x)
    assert out.shape == ref.shape and ((out - ref).norm() / ref.norm()).item() < 1e-2


def test_mx_on_a_transposed_3d_activation_is_lowered():
    q, e = fmt.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(2)) * K**-0.5, "e4m3")

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, fmt.dequantize(q, e, "e4m3", BF16))

    x = BATCHED_VIEWS["transposed"](torch.Generator().manual_seed(5))
    out = torch.compile(f, options=qlower.inductor_options())(x).double()
    (d,) = qlower.last_report().entries
    assert d.family == "mx" and d.lowered, qlower.last_report().table()
    ref = (x.double().reshape(-1, K) @ fmt.dequantize_f64(q, e, "e4m3").t()).reshape(3, 5, N)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2


def test_float_linear_on_a_transposed_activation_is_left_alone():
    w = torch.randn(N, K, dtype=BF16)
    x = BATCHED_VIEWS["transposed"](torch.Generator().manual_seed(6))
    gm = trace_for_inductor(lambda x, w: torch.nn.functional.linear(x, w), x, w)
    assert shared_weight_bmm_to_mm(gm.graph) == 0


def test_truly_batched_weights_are_left_alone():
    w3 = torch.randint(-127, 128, (3, K, N), dtype=torch.int8)
    gm = trace_for_inductor(lambda x: torch.bmm(x, w3.to(BF16)), torch.randn(3, 5, K, dtype=BF16))
    assert shared_weight_bmm_to_mm(gm.graph) == 0


@pytest.mark.parametrize("name", ["bsk,nk", "...k,nk scale first"])
def test_einsum_in_a_training_graph_keeps_gradient_shapes(name):
    """The backward's batch-1 bmm ends in a chain without shape arguments (permutes, then squeeze): the rewrite
    replaces the bmm alone there, so the gradient keeps the input's shape and values."""
    f, shape = FORMS[name]
    x = torch.randn(*shape, dtype=BF16, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    with torch._inductor.config.patch(force_disable_caches=True):
        torch.compile(f, options=qlower.inductor_options())(x).float().square().sum().backward()
    f(x_ref).float().square().sum().backward()
    assert x.grad.shape == x_ref.grad.shape
    assert ((x.grad.float() - x_ref.grad.float()).norm() / x_ref.grad.float().norm()).item() < 2e-2
    assert any(d.lowered for r in qlower.all_reports() for d in r), qlower.last_report().table()


@pytest.mark.parametrize("m", [1, 2, 17])
def test_scale_converted_after_its_expand_is_lowered(m):
    """`s[:, None].expand(N, K).to(bf16)` traces as convert(expand(s)); the convert moves under the expand
    (converts_above_expands), so the recognizer strips the expand to the [N, 1] scale it proves."""

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, W.to(x.dtype) * S.float()[:, None].expand(N, K).to(x.dtype))

    x = torch.randn(m, K, dtype=BF16, generator=torch.Generator().manual_seed(m))
    report = apply_pass(trace_for_inductor(f, x))
    (d,) = report.entries
    assert d.family == "woq_int8" and d.lowered, report.table()
    torch._dynamo.reset()
    out = torch.compile(f, options=qlower.inductor_options())(x).double()
    ref = _reference(x)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2


def _run_on_cpu(gm: torch.fx.GraphModule, *args: torch.Tensor) -> torch.Tensor:
    """The traced graph's arithmetic on CPU tensors (its ops name no device)."""
    gm.recompile()
    return gm(*args)


@pytest.mark.parametrize("x_shape", [(1, K), (1, 1, K)], ids=["mk", "bsk"])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_decomposed_batch1_matvec_einsum_is_recognized(x_shape, dtype):
    """An einsum linear at M = 1 on a GPU reaches the pass as the `bmm` decomposition's 4-D matvec (the fuzz's
    `matvec=decomposed` einsum case had no report row). Canonicalized to the 2-D matvec, it is one record
    like the M = 2 einsum's, and the rewritten graph computes what the decomposed one did."""
    import copy

    from qlower.passes.canonicalize import batch1_matvec_to_matvec, canonicalize
    from qlower.patterns import woq_int8
    from qlower.patterns.graph_utils import tensor_val

    def f(x, w, s):
        return torch.einsum("...k,nk->...n", x, w.to(x.dtype)) * s

    s = S.to(dtype)
    gm = fake_cuda_trace(f, torch.empty(x_shape, dtype=dtype), W, s)
    assert "aten.sum" in graph_summary(gm) and "aten.bmm" not in graph_summary(gm)
    before = copy.deepcopy(gm)
    assert batch1_matvec_to_matvec(gm.graph) == 1
    canonicalize(gm.graph)  # idempotent: nothing left to rewrite
    (rec,) = woq_int8.find(gm.graph)
    assert rec.matmul == "matvec" and (rec.m, rec.k, rec.n) == (1, K, N), rec
    assert tensor_val(rec.x).dtype == dtype and rec.compute_dtype == dtype and rec.weight_layout == "NK"
    two = fake_cuda_trace(f, torch.empty((2, *x_shape[1:]), dtype=dtype), W, s)
    canonicalize(two.graph)
    (rec2,) = woq_int8.find(two.graph)
    assert rec2.matmul == "mm" and (rec2.scale_site, rec2.scale_cast) == (rec.scale_site, rec.scale_cast)

    x = torch.randn(x_shape, dtype=dtype)
    got, want = _run_on_cpu(gm, x, W, s), _run_on_cpu(before, x, W, s)
    assert got.shape == want.shape == (*x_shape[:-1], N) and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    exact = (x.double().reshape(-1, K) @ W.double().t()).reshape(got.shape) * s.double()
    torch.testing.assert_close(got.double(), exact, rtol=2e-2, atol=2e-2)  # one fp32 sum, two roundings


def test_decomposed_matvec_of_a_float_weight_input_is_left_alone():
    """A float einsum between graph inputs is no quantized linear: the decomposed matvec stays as Inductor
    left it (rewriting it would only change stock code)."""
    from qlower.passes.canonicalize import batch1_matvec_to_matvec

    gm = fake_cuda_trace(lambda x, w: torch.einsum("mk,nk->mn", x, w), torch.empty(1, K, dtype=BF16),
                               torch.empty(N, K, dtype=BF16))  # fmt: skip
    assert batch1_matvec_to_matvec(gm.graph) == 0


def test_stacked_expert_matvec_left_alone_has_a_report_row():
    """A decomposed M = 1 product of quantized data that no recognizer takes (a stacked-experts einsum, whose
    weight is 3-D) is reported, never skipped silently: one row naming the family, K and the form."""
    from qlower.passes.canonicalize import canonicalize
    from qlower.patterns.unclaimed import find_unclaimed

    def f(x, w, s):
        return torch.einsum("mk,enk->emn", x, w.to(x.dtype)) * s.unsqueeze(1)

    gm = fake_cuda_trace(f, torch.empty(1, K, dtype=BF16), torch.empty(3, N, K, dtype=torch.int8),
                               torch.empty(3, N, dtype=BF16))  # fmt: skip
    canonicalize(gm.graph)
    (row,) = find_unclaimed(gm.graph, [], ["woq_int8"])
    assert row.family == "woq_int8" and row.shape[1] == K and row.dtype == BF16, row
    assert "decomposed to sum(a * b)" in row.reason and "bmm" in row.reason, row.reason


_INDEXING_NEEDS_CUDA_BUILD = pytest.mark.skipif(
    not torch.backends.cuda.is_built(),
    reason="`s[:, None]` on a fake CUDA tensor needs a CUDA build of torch (the GPU suite runs it)",
)


@pytest.mark.parametrize("rank", [2, 3, 4])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "form",
    [pytest.param(f, marks=_INDEXING_NEEDS_CUDA_BUILD) if f == "scale_first" else f for f in FORMS_WOQ],
)
def test_every_woq_form_at_m1_decomposed_on_a_gpu_is_one_record(form, bias, rank):
    """The class behind the einsum case: every woq form users write (tests/forms/woq_int8.py), over an
    activation of 2 to 4 dims with one row, as a GPU's decompositions leave it under
    `coordinate_descent_tuning` (`mm`'s 2-D and `bmm`'s 4-D matvec, or a plain product), is one matvec / mm
    record after canonicalize, and the canonicalized graph computes exactly what the decomposed one did (run
    on CPU)."""
    import copy

    from qlower.passes.canonicalize import canonicalize
    from qlower.patterns import woq_int8

    dtype = torch.float16
    mod = woq_forms.WoqLinear(K, N, dtype, form=form, bias=bias)
    params = dict(mod.named_parameters())

    def f(x, *tensors):
        return torch.func.functional_call(mod, dict(zip(params, tensors, strict=True)), (x,))

    x = torch.randn((1,) * (rank - 1) + (K,), dtype=dtype)
    gm = fake_cuda_trace(f, x, *params.values())
    before = copy.deepcopy(gm)
    canonicalize(gm.graph)
    (rec,) = woq_int8.find(gm.graph)
    assert (rec.m, rec.k, rec.n) == (1, K, N) and rec.matmul in ("matvec", "mm", "addmm"), rec
    got, want = _run_on_cpu(gm, x, *params.values()), _run_on_cpu(before, x, *params.values())
    torch.testing.assert_close(got, want, rtol=0, atol=0)
