"""`inductor_options()`: the one dict that turns qlower on, for torch.compile and AOTInductor alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from qlower.lowerings import KernelPreference
from qlower.lowerings.aoti import runtime as aoti_runtime
from qlower.lowerings.preference import parse_preference
from qlower.passes import QLowerPass
from qlower.patterns import FAMILIES


def parse_families(families: Iterable[str] | None) -> tuple[str, ...]:
    """The family names `families` stands for (None: all), checked, without repeats, in `FAMILIES`' order
    whatever order they were given in: options built from any order of one set are equal, and the pass
    decides every subgraph the same way (tests/patterns/test_family_order.py::test_family_order_*).

    A bare string is refused: iterating it would give one "family" per character.
    """
    valid = ", ".join(sorted(FAMILIES))
    if families is None:
        return tuple(FAMILIES)
    if isinstance(families, (str, bytes)):
        raise TypeError(
            f"qlower: families must be an iterable of family names, not a single string: got {families!r}; "
            f"write families=[{families!r}] (valid names: {valid})"
        )
    if not isinstance(families, Iterable):
        raise TypeError(
            f"qlower: families must be None or an iterable of family names ({valid}), "
            f"got {type(families).__name__} {families!r}"
        )
    names = tuple(families)
    wrong_type = [f for f in names if not isinstance(f, str)]
    if wrong_type:
        raise TypeError(f"qlower: families must hold family names (str) from {valid}; got {wrong_type!r}")
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise ValueError(
            f"qlower: unknown families {unknown} in families={list(names)!r}; valid names: {valid}"
        )
    return tuple(f for f in FAMILIES if f in names)


def inductor_options(
    *,
    families: Iterable[str] | None = None,
    kernel_preference: KernelPreference | str = KernelPreference.AUTO,
    mode: str | None = None,
    **inductor_config: Any,
) -> dict[str, Any]:
    """Inductor options that install qlower's pass.

    Pass the dict to `torch.compile(model, options=...)` or to
    `torch._inductor.aoti_compile_and_package(ep, inductor_configs=...)`. `families=None` enables every
    family qlower has; extra keyword arguments are further Inductor config entries. Note: to freeze module
    weights set `torch._inductor.config.freezing = True` globally; Dynamo lifts parameters as graph inputs
    before per-compile options apply, so `freezing=True` here does not fold weights (qlower detects this).
    Bad `families` or `kernel_preference` values raise TypeError / ValueError naming the valid choices.

    `mode` is `torch.compile`'s mode (`"reduce-overhead"`: CUDA graphs, `"max-autotune"`, ...), which
    torch.compile refuses next to `options=`: its Inductor settings (`torch._inductor.list_mode_options`)
    are merged into the dict instead; explicit keywords win over them.
    """
    fams = parse_families(families)
    preference = parse_preference(kernel_preference)
    if "joint_custom_pre_pass" in inductor_config:
        raise ValueError(
            "qlower.inductor_options: joint_custom_pre_pass is qlower's hook; chain your pass elsewhere"
        )
    # AOTInductor: the pass fills these per compile with qlower's C shims (lowerings/aoti/runtime.py).
    aoti = aoti_runtime.config_entries()
    return {
        "joint_custom_pre_pass": QLowerPass(fams, preference),
        **aoti,
        **_mode_options(mode),
        **inductor_config,
    }


def _mode_options(mode: str | None) -> dict[str, Any]:
    if mode is None or mode == "default":
        return {}
    modes = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    if mode not in modes:
        raise ValueError(f"qlower: unknown mode {mode!r}; torch.compile's modes: {', '.join(modes)}")
    return dict(torch._inductor.list_mode_options(mode))
