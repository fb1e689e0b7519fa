"""Kernel preference: one device-agnostic knob for which kind of kernel a lowering may use.

Modelled on torchao's `KernelPreference` (AUTO | TORCH | EMULATED ...): the user says what kind of kernel
they want, each backend says which of its lowerings are of that kind. `parse_preference` is the one place a
user's value becomes a `KernelPreference` (the pass and `qlower.inductor_options` both call it).
"""

from __future__ import annotations

import enum


class KernelPreference(str, enum.Enum):
    """Which kind of lowering the registry may pick for a matched quantized linear."""

    AUTO = "auto"  # the backend's ranked list; first lowering that supports the candidate wins
    ATEN = "aten"  # an ATen kernel with native quantized support (_weight_int8pack_mm, _int_mm, _scaled_mm)
    TRITON = "triton"  # one of qlower's own Triton kernels
    EMULATED = "emulated"  # dequantize, then a high-precision matmul that Inductor fuses; works anywhere
    CUTLASS = "cutlass"  # one of qlower's own CUDA C++ kernels on CUTLASS (lowerings/kernels/cutlass/)

    def __str__(self) -> str:
        return self.name


# torchao's `KernelPreference` (torchao/quantization/quantize_/common/kernel_preference.py, torchao 0.18:
# AUTO, TORCH, MSLK, EMULATED, TRITON) member name -> qlower's member of the same meaning.
TORCHAO_EQUIVALENTS: dict[str, KernelPreference] = {
    "AUTO": KernelPreference.AUTO,  # the best kernel the hardware and libraries allow
    "TORCH": KernelPreference.ATEN,  # torch's own quantized ops: _weight_int8pack_mm, _int_mm, _scaled_mm
    "TRITON": KernelPreference.TRITON,  # kernels written in Triton (torchao's own or qlower's)
    "EMULATED": KernelPreference.EMULATED,  # dequantize, then a high-precision matmul
}


def _is_torchao_preference(value: object) -> bool:
    """A member of torchao's KernelPreference, recognized without importing torchao."""
    cls = type(value)
    return (
        isinstance(value, enum.Enum)
        and cls.__name__ == "KernelPreference"
        and cls.__module__.split(".")[0] == "torchao"
    )


def _no_counterpart(name: str, argument: str, given: str) -> ValueError:
    mapping = ", ".join(f"{k}->{v.name}" for k, v in TORCHAO_EQUIVALENTS.items())
    choices = ", ".join(p.name for p in KernelPreference)
    return ValueError(
        f"qlower: {argument} {given} is torchao's KernelPreference.{name}, which qlower has no kernels "
        f"for; torchao's members map as {mapping}; qlower's choices: {choices}"
    )


def parse_preference(value: object, argument: str = "kernel_preference") -> KernelPreference:
    """`value` as a KernelPreference. Accepted:

    - a `qlower.KernelPreference` member, or its name or value as a string in any case (`"triton"`, `"ATEN"`);
    - a member of torchao's `KernelPreference`, or its name as a string in any case, where it means the same
      kind of kernel (`TORCHAO_EQUIVALENTS`):

      ========================  =========================  ==============================================
      torchao                   qlower                     meaning
      ========================  =========================  ==============================================
      AUTO                      AUTO                       the best kernel this device has
      TORCH                     ATEN                       torch's own quantized ops (_weight_int8pack_mm,
                                                           _int_mm, _scaled_mm)
      TRITON                    TRITON                     a kernel written in Triton (qlower's own)
      EMULATED                  EMULATED                   dequantize, then a high-precision matmul
      MSLK (FBGEMM in older     -- (ValueError naming the  a third-party kernel library qlower does not
      torchao), any other       mapping and the choices)   call
      ========================  =========================  ==============================================

    Anything else is a clear error naming `argument`, what was given and the valid choices (a bare
    `KernelPreference[...]` lookup gave a KeyError without them): TypeError for a non-string, ValueError for an
    unknown string. tests/tools/test_first_use.py::test_preference_* holds every row of the table.
    """
    if isinstance(value, KernelPreference):
        return value
    choices = ", ".join(p.name for p in KernelPreference)
    if _is_torchao_preference(value):
        found = TORCHAO_EQUIVALENTS.get(value.name)  # type: ignore[attr-defined]
        if found is None:
            raise _no_counterpart(value.name, argument, repr(value))  # type: ignore[attr-defined]
        return found
    if not isinstance(value, str):
        raise TypeError(
            f"qlower: {argument} must be a qlower.KernelPreference, torchao's KernelPreference or one of the "
            f"strings {choices} (any case), got {type(value).__name__} {value!r}"
        )
    text = value.strip().lower()
    by_text = {p.name.lower(): p for p in KernelPreference} | {p.value.lower(): p for p in KernelPreference}
    by_text |= {k.lower(): v for k, v in TORCHAO_EQUIVALENTS.items()}
    found = by_text.get(text)
    if found is not None:
        return found
    if text in ("mslk", "fbgemm"):
        raise _no_counterpart(text.upper(), argument, repr(value))
    raise ValueError(
        f"qlower: unknown {argument} {value!r}; valid choices: {choices} (any case; torchao's TORCH means ATEN)"
    )
