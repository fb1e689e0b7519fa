"""Kernel preference: one device-agnostic knob for which kind of kernel a lowering may use.

Modelled on torchao's `KernelPreference` (AUTO | TORCH | EMULATED ...): the user says what kind of kernel
they want, each backend says which of its lowerings are of that kind.
"""

from __future__ import annotations

import enum


class KernelPreference(str, enum.Enum):
    """Which kind of lowering the registry may pick for a matched quantized linear."""

    AUTO = "auto"  # the backend's ranked list; first lowering that supports the candidate wins
    ATEN = "aten"  # an ATen kernel with native quantized support (_weight_int8pack_mm, _int_mm, _scaled_mm)
    TRITON = "triton"  # one of qlower's own Triton kernels
    EMULATED = "emulated"  # dequantize, then a high-precision matmul that Inductor fuses; works anywhere

    def __str__(self) -> str:
        return self.name


def parse_preference(value: object, argument: str = "kernel_preference") -> KernelPreference:
    """`value` as a KernelPreference: the enum itself, or its name or value as a string in any case.

    Anything else is a clear error naming `argument`, what was given and the valid choices (a bare
    `KernelPreference[...]` lookup gave a KeyError without them).
    """
    if isinstance(value, KernelPreference):
        return value
    choices = ", ".join(p.name for p in KernelPreference)
    if not isinstance(value, str):
        raise TypeError(
            f"qlower: {argument} must be a qlower.KernelPreference or one of the strings {choices} "
            f"(any case), got {type(value).__name__} {value!r}"
        )
    by_text = {p.name.lower(): p for p in KernelPreference} | {p.value.lower(): p for p in KernelPreference}
    found = by_text.get(value.strip().lower())
    if found is None:
        raise ValueError(f"qlower: unknown {argument} {value!r}; valid choices: {choices} (any case)")
    return found
