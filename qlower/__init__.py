"""qlower: quantized linears lowered to the best kernel of each device under torch.compile and AOTInductor.

model = torch.compile(model, options=qlower.inductor_options())
print(qlower.last_report())

Importing qlower loads none of its sub-packages: each public name loads its module at first use (PEP 562),
so `import qlower.patterns` loads the device-free patterns package alone (tests/tools/test_layout.py). qlower's built-in backends, and
with them its torch ops (`torch.ops.qlower.*`), load at the registry's first use: a compile with
`inductor_options()`, `register_backend`, or `load_ops()` for a process that only runs what qlower compiled.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Imported from a source checkout's root (pytest puts the root on sys.path, since tests/ and scripts/ are
# packages of it), this folder is `qlower` and the sub-packages are the root's passes/, patterns/ and
# lowerings/ folders (pyproject.toml's package-dir): a finder maps those three names onto them so that they
# import whether qlower is installed editable, installed from a copy, or not at all (tests/tools/test_layout.py).
_CHECKOUT = Path(__file__).resolve().parent.parent
_SUB_PACKAGES = ("passes", "patterns", "lowerings")


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """`qlower.<pkg>` -> the checkout's <pkg>/ folder, for the three sub-packages alone."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name not in _SUB_PACKAGES:
            return None
        folder = _CHECKOUT / name
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


if (_CHECKOUT / "pyproject.toml").is_file() and all(
    (_CHECKOUT / p / "__init__.py").is_file() for p in _SUB_PACKAGES
):
    sys.meta_path.append(_CheckoutFinder())  # after the path finders: an editable install's own finder wins

__version__ = "0.1.0"

__all__ = [
    "FAMILIES",
    "Decision",
    "KernelPreference",
    "Lowering",
    "QLowerError",
    "QLowerPass",
    "QuantLinear",
    "Rejection",
    "Report",
    "UnsupportedPlatformError",
    "all_reports",
    "clear_reports",
    "inductor_options",
    "keep_freed_cpu_memory",
    "last_report",
    "load_ops",
    "register_backend",
    "unregister_backend",
]

# Where each public name lives (loaded on first access), and the submodules `import qlower` used to bind.
_HOMES = {
    "FAMILIES": "qlower.patterns",
    "QuantLinear": "qlower.patterns",
    "Rejection": "qlower.patterns",
    "KernelPreference": "qlower.lowerings",
    "Lowering": "qlower.lowerings",
    "QLowerError": "qlower.lowerings",
    "UnsupportedPlatformError": "qlower.lowerings",
    "register_backend": "qlower.lowerings",
    "unregister_backend": "qlower.lowerings",
    "Decision": "qlower.passes",
    "QLowerPass": "qlower.passes",
    "Report": "qlower.passes",
    "all_reports": "qlower.passes",
    "clear_reports": "qlower.passes",
    "last_report": "qlower.passes",
    "inductor_options": "qlower.options",
    "keep_freed_cpu_memory": "qlower.cpu_memory",
}
_SUBMODULES = ("cpu_memory", "lowerings", "options", "passes", "patterns")


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})


def load_ops() -> None:
    """Register qlower's torch ops (`torch.ops.qlower.*`) and its built-in backends in this process (once).

    A compile with `inductor_options()` does this by itself. A process that only runs what qlower compiled
    calls it first: one that loads an AOTInductor package whose C shims call qlower's ops (docs/aoti.md), or
    code that calls `torch.ops.qlower.*` directly."""
    from qlower.lowerings import ensure_builtin_backends

    ensure_builtin_backends()


if TYPE_CHECKING:  # what static type checkers see; at run time `__getattr__` loads each name on first use
    from qlower.cpu_memory import keep_freed_cpu_memory
    from qlower.lowerings import (
        KernelPreference,
        Lowering,
        QLowerError,
        UnsupportedPlatformError,
        register_backend,
        unregister_backend,
    )
    from qlower.options import inductor_options
    from qlower.passes import Decision, QLowerPass, Report, all_reports, clear_reports, last_report
    from qlower.patterns import FAMILIES, QuantLinear, Rejection
