"""Per-device lowerings and the registry that ranks them. Device knowledge lives here, not in patterns/."""

from __future__ import annotations

from qlower.lowerings.devices import cpu, cuda, xpu
from qlower.lowerings.errors import QLowerError, UnsupportedPlatformError
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import (
    Backend,
    Choice,
    Lowering,
    backends,
    choose,
    fingerprint,
    register_backend,
    unregister_backend,
)


def register_builtin_backends() -> None:
    """(Re)register the in-tree backends: cpu, cuda, xpu."""
    cpu.register()
    cuda.register()
    xpu.register()


register_builtin_backends()

__all__ = [
    "Backend",
    "Choice",
    "KernelPreference",
    "Lowering",
    "QLowerError",
    "UnsupportedPlatformError",
    "backends",
    "choose",
    "fingerprint",
    "register_backend",
    "register_builtin_backends",
    "unregister_backend",
]
