"""`inductor_options()`: the one dict that turns qlower on, for torch.compile and AOTInductor alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from qlower.aoti import runtime as aoti_runtime
from qlower.lowerings import KernelPreference
from qlower.passes import QLowerPass, report
from qlower.patterns import FAMILIES


def inductor_options(
    *,
    families: Iterable[str] | None = None,
    kernel_preference: KernelPreference | str = KernelPreference.AUTO,
    **inductor_config: Any,
) -> dict[str, Any]:
    """Inductor options that install qlower's pass.

    Pass the dict to `torch.compile(model, options=...)` or to
    `torch._inductor.aoti_compile_and_package(ep, inductor_configs=...)`. `families=None` enables every
    family qlower has; extra keyword arguments are further Inductor config entries. Note: to freeze module
    weights set `torch._inductor.config.freezing = True` globally; Dynamo lifts parameters as graph inputs
    before per-compile options apply, so `freezing=True` here does not fold weights (qlower detects this).
    """
    report.watch_compiles()  # so a compile served from cache still gets an (honest, empty) report
    fams = tuple(FAMILIES) if families is None else tuple(families)
    if isinstance(kernel_preference, str) and not isinstance(kernel_preference, KernelPreference):
        kernel_preference = KernelPreference[kernel_preference.upper()]
    if "joint_custom_pre_pass" in inductor_config:
        raise ValueError(
            "qlower.inductor_options: joint_custom_pre_pass is qlower's hook; chain your pass elsewhere"
        )
    # AOTInductor: the pass fills these per compile with qlower's C shims (qlower/aoti/runtime.py).
    aoti = aoti_runtime.config_entries()
    return {"joint_custom_pre_pass": QLowerPass(fams, kernel_preference), **aoti, **inductor_config}
