"""Errors reach the user as documented, bad options are refused (the report's tests:
tests/end_to_end/test_report.py).

- `qlower.UnsupportedPlatformError` is catchable around a `torch.compile`d call (Dynamo used to wrap it in
  BackendCompilerFailed) and around `aoti_compile_and_package`.
- `qlower.inductor_options` names the argument, the value and the valid choices for bad input.
"""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower.lowerings import registry
from qlower.testing import apply_pass
from tests.forms.woq_int8 import WoqLinear
from tests.helpers.fake_gpu_trace import fake_woq_graph


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
