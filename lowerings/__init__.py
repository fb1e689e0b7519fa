"""Per-device lowerings and the registry that ranks them. Device knowledge lives here, not in patterns/.

Importing this package registers no backend and loads no device, emitter or kernel module: the built-in
backends (and with them qlower's torch ops) load at the registry's first use (`registry.py`).
"""

from __future__ import annotations

from qlower.lowerings import registry
from qlower.lowerings.errors import QLowerError, UnsupportedPlatformError
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import (
    Backend,
    Choice,
    Lowering,
    backends,
    choose,
    ensure_builtin_backends,
    fingerprint,
    register_backend,
    unregister_backend,
)


def register_builtin_backends() -> None:
    """(Re)register the in-tree backends: cpu, cuda, xpu (their lowerings ahead of any registered since)."""
    from qlower.lowerings.devices import cpu, cuda, xpu

    cpu.register()
    cuda.register()
    xpu.register()


registry.builtins_on_first_use(register_builtin_backends)

__all__ = [
    "Backend",
    "Choice",
    "KernelPreference",
    "Lowering",
    "QLowerError",
    "UnsupportedPlatformError",
    "backends",
    "choose",
    "ensure_builtin_backends",
    "fingerprint",
    "register_backend",
    "register_builtin_backends",
    "unregister_backend",
]
