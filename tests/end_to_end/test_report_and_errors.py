"""Reports describe the compiles that ran qlower, errors reach the user as documented, bad options are refused.

- A lazily compiled backward keeps its forward's report (it used to open an empty "served from cache" one).
- A compile without qlower's options leaves `qlower.last_report()` alone; a real AOTAutograd cache hit of a
  qlower compile still says the pass did not run.
- `qlower.UnsupportedPlatformError` is catchable around a `torch.compile`d call (Dynamo used to wrap it in
  BackendCompilerFailed) and around `aoti_compile_and_package`.
- `qlower.inductor_options` names the argument, the value and the valid choices for bad input.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import qlower
from qlower.lowerings import registry
from qlower.testing import apply_pass
from tests.forms.dynamic_int8 import IntMMDivide
from tests.forms.woq_int8 import WoqLinear
from tests.helpers.fake_gpu_trace import fake_woq_graph

F32 = torch.float32


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


# --------------------------------------------------------------------------------------- reports: backward
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


# ---------------------------------------------------------------------------- reports: other compiles, caches
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


# -------------------------------------------------------------------------------------------------- errors
def _assert_names_everything(err: qlower.UnsupportedPlatformError, shape: str) -> None:
    msg = str(err)
    for part in (
        "platform unsupported",
        "device=cpu",
        "family=woq_int8",
        "kernel_preference=TRITON",
        f"shape (M, K, N)={shape}",
        "Preferences that work here: AUTO, ATEN, EMULATED",
    ):
        assert part in msg, msg


def test_unsupported_platform_error_is_catchable_from_torch_compile():
    model, x = WoqLinear(64, 48, torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
    fn = torch.compile(model, options=qlower.inductor_options(kernel_preference="triton"))
    caught = None
    try:
        with torch.no_grad():
            fn(x)
    except qlower.UnsupportedPlatformError as e:  # what docs/how-it-works.md tells users to write
        caught = e
    assert type(caught) is qlower.UnsupportedPlatformError
    assert isinstance(caught, qlower.QLowerError) and isinstance(caught, RuntimeError)
    _assert_names_everything(caught, "(4, 64, 48)")
    # Not a one-off: the next call compiles again and raises the same error, never a wrong number.
    with pytest.raises(qlower.UnsupportedPlatformError, match="kernel_preference=TRITON"), torch.no_grad():
        fn(x)


def test_unsupported_platform_error_is_catchable_from_aoti_compile_and_package(tmp_path):
    model, x = WoqLinear(64, 48, torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16)
    ep = torch.export.export(model, (x,))
    caught = None
    try:
        torch._inductor.aoti_compile_and_package(
            ep,
            package_path=str(tmp_path / "woq.pt2"),
            inductor_configs=qlower.inductor_options(kernel_preference=qlower.KernelPreference.TRITON),
        )
    except qlower.UnsupportedPlatformError as e:
        caught = e
    assert type(caught) is qlower.UnsupportedPlatformError
    _assert_names_everything(caught, "(4, 64, 48)")
    assert not (tmp_path / "woq.pt2").exists()


@pytest.mark.gpu
def test_unsupported_platform_error_is_catchable_from_torch_compile_on_cuda():
    """CUDA has no ATEN woq-int8 lowering (never the naive `_weight_int8pack_mm`): an explicit ATEN refuses."""
    model = WoqLinear(64, 48, torch.bfloat16).cuda()
    x = torch.randn(4, 64, dtype=torch.bfloat16, device="cuda")
    fn = torch.compile(model, options=qlower.inductor_options(kernel_preference="aten"))
    caught = None
    try:
        with torch.no_grad():
            fn(x)
    except qlower.UnsupportedPlatformError as e:
        caught = e
    assert type(caught) is qlower.UnsupportedPlatformError
    msg = str(caught)
    for part in ("device=cuda", "family=woq_int8", "kernel_preference=ATEN", "shape (M, K, N)=(4, 64, 48)"):
        assert part in msg, msg
    assert "Preferences that work here: AUTO" in msg and "EMULATED" in msg.split("work here:")[1], msg


def test_unregistered_device_error_names_shape_and_what_works():
    saved = registry.backends()["xpu"]
    qlower.unregister_backend("xpu")
    try:
        with pytest.raises(qlower.UnsupportedPlatformError) as err:
            apply_pass(fake_woq_graph("xpu", m=3), kernel_preference="emulated")
    finally:
        qlower.register_backend("xpu", saved.lowerings, describe=saved.describe, replace=True)
    msg = str(err.value)
    for part in ("device=xpu", "family=woq_int8", "kernel_preference=EMULATED", "shape (M, K, N)=(3, "):
        assert part in msg, msg
    assert "Preferences that work here: AUTO (leaves it unlowered)" in msg


def test_error_pickles_and_keeps_its_message():
    import pickle

    err = pickle.loads(pickle.dumps(qlower.UnsupportedPlatformError("qlower: platform unsupported: x")))
    assert type(err) is qlower.UnsupportedPlatformError and str(err) == "qlower: platform unsupported: x"


# ------------------------------------------------------------------------------------------------- options
VALID_FAMILIES = ", ".join(sorted(qlower.FAMILIES))


@pytest.mark.parametrize(
    ("kwargs", "error", "parts"),
    [
        (
            {"families": "woq_int8"},
            TypeError,
            ["families", "'woq_int8'", "families=['woq_int8']", VALID_FAMILIES],
        ),
        ({"families": ["woq_int8", "nope"]}, ValueError, ["families", "'nope'", VALID_FAMILIES]),
        ({"families": ["woq"]}, ValueError, ["unknown families ['woq']", VALID_FAMILIES]),
        ({"families": [1]}, TypeError, ["families", "[1]", VALID_FAMILIES]),
        ({"families": 3}, TypeError, ["families", "int 3", VALID_FAMILIES]),
        (
            {"kernel_preference": "fast"},
            ValueError,
            ["kernel_preference", "'fast'", "AUTO, ATEN, TRITON, EMULATED"],
        ),
        ({"kernel_preference": 2}, TypeError, ["kernel_preference", "int 2", "AUTO, ATEN, TRITON, EMULATED"]),
        (
            {"kernel_preference": None},
            TypeError,
            ["kernel_preference", "None", "AUTO, ATEN, TRITON, EMULATED"],
        ),
    ],
    ids=[
        "families-str",
        "families-unknown",
        "families-prefix",
        "families-int-item",
        "families-int",
        "preference-unknown",
        "preference-int",
        "preference-None",
    ],
)
def test_bad_options_name_argument_value_and_choices(kwargs, error, parts):
    with pytest.raises(error) as err:
        qlower.inductor_options(**kwargs)
    msg = str(err.value)
    for part in parts:
        assert part in msg, msg


def test_good_options_are_normalized():
    for value in ("emulated", "EMULATED", " Emulated", qlower.KernelPreference.EMULATED):
        qpass = qlower.inductor_options(kernel_preference=value)["joint_custom_pre_pass"]
        assert qpass.preference is qlower.KernelPreference.EMULATED
    qpass = qlower.inductor_options(families=("mx", "woq_int8", "mx"))["joint_custom_pre_pass"]
    assert qpass.families == ("woq_int8", "mx")  # `FAMILIES` order, whatever order given
    assert qlower.inductor_options(families=())["joint_custom_pre_pass"].families == ()
    assert set(qlower.inductor_options()["joint_custom_pre_pass"].families) == set(qlower.FAMILIES)
    gen = (f for f in ["dynamic_int8"])  # any iterable, a generator included
    assert qlower.inductor_options(families=gen)["joint_custom_pre_pass"].families == ("dynamic_int8",)
