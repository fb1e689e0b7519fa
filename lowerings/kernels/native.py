"""qlower's C++ kernels in qlower's own process: `libqlower_native.so`, built at first use and cached.

Why a library of its own: `libqlower_ops.so` defines the `qlower` namespace, which qlower's Python also
defines, so the two must never meet in one process (lowerings/aoti/build.py). The native library registers
the same kernels (lowerings/kernels/csrc/woq_gemm.cpp, int8_gemm.cpp) under the private namespace
`qlower_native` instead, and in `qlower` only the CPU kernels of `qlower::woq_int8_gemm` and `qlower::int8_gemm`,
whose schemas qlower's Python defines (lowerings/kernels/custom_ops.py). It is built in a child process
(lowerings/kernels/cpp_build.py, `native_library`), cached on disk by content, and loaded once per process.

Every library qlower builds registers through a gate (cpp_build.py, `_GATE_HEADER`): loaded where its operators
are already registered, it registers nothing and keeps the reason, where an ungated library would abort the
process. `load_library` turns that reason into `LibraryConflictError`; registering qlower's ops makes
`torch.ops.load_library` do the same (`check_library_loads`), so `qlower.load_ops()` and then
`torch.ops.load_library("libqlower_ops.so")` raises instead of running on silently
(tests/lowerings/kernels/test_native_library.py).
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import threading
from collections.abc import Callable

import torch

from qlower.lowerings.errors import QLowerError

_LOCK = threading.Lock()
_LOADED: list[str] = []  # the path loaded into this process, once


class LibraryConflictError(QLowerError):
    """A library qlower built found its operators already registered in this process and registered none."""


def registration_error(path: str) -> str | None:
    """Why the loaded library at `path` registered nothing; None where it registered or is no qlower library.

    dlopen of a loaded path returns the loaded copy, so this reads that copy's gate and runs nothing again.
    """
    try:
        reason = ctypes.CDLL(path).qlower_registration_error
    except (OSError, AttributeError):
        return None
    reason.restype = ctypes.c_char_p
    text = reason()
    return text.decode(errors="replace") if text else None


def _checked(torch_load: Callable[[str], None]) -> Callable[[str], None]:
    def load_library(path: str) -> None:
        """torch.ops.load_library, raising LibraryConflictError where a qlower library registered nothing."""
        torch_load(path)
        reason = registration_error(torch._utils_internal.resolve_library_path(path))
        if reason is not None:
            raise LibraryConflictError(reason)

    load_library.qlower_checked = True  # type: ignore[attr-defined]
    return load_library


def load_library(path: str) -> None:
    """Load `path` with torch.ops.load_library; LibraryConflictError where it registered nothing."""
    load = torch.ops.load_library
    (load if getattr(load, "qlower_checked", False) else _checked(load))(path)


def check_library_loads() -> None:
    """Make `torch.ops.load_library` raise LibraryConflictError for a qlower library that registered nothing.

    Called once qlower's Python has registered its operators (lowerings/kernels/custom_ops.py): from then on
    libqlower_ops.so, or a second copy of any qlower library, always meets them. Other libraries load as before.
    """
    if not getattr(torch.ops.load_library, "qlower_checked", False):
        torch.ops.load_library = _checked(torch.ops.load_library)


def ops() -> torch._ops._OpNamespace:
    """`torch.ops.qlower_native`, building and loading the library on the first call.

    Raises BuildError (no compiler, a failed build) or LibraryConflictError (the library registered nothing).
    """
    with _LOCK:
        if not _LOADED:
            from qlower.lowerings.kernels import cpp_build

            lib = cpp_build.native_library()
            if not hasattr(torch.ops.qlower_native, "woq_int8_gemm"):  # loaded by someone else already
                load_library(str(lib.path))
            _LOADED.append(str(lib.path))
    return torch.ops.qlower_native


@functools.cache
def compiler_available() -> bool:
    """Whether a C++ compiler is on PATH (the lowerings that call native kernels need one to build them)."""
    from torch.utils.cpp_extension import get_cxx_compiler

    try:
        return shutil.which(get_cxx_compiler()) is not None
    except (RuntimeError, OSError):
        return False


def supported_isas() -> tuple[str, ...]:
    """The ISA paths of qlower::woq_int8_gemm this CPU can run ("scalar", "avx2", "avx512", "avx512_bf16"), and
    "amx_bf16" where its AMX path can run (the CPU has AMX-BF16 and the OS granted the tile state)."""
    return tuple(ops().woq_int8_gemm_isas().split(","))


def woq_gemm_plan(m: int, dtype: torch.dtype, nk: bool = True, k: int = 0) -> str:
    """The path and ISA level qlower::woq_int8_gemm takes for M rows of `dtype` activations (nk: a [N, K]
    weight; k: K, 0 when not known) on this CPU ("amx_bf16", "chunked-avx512_bf16", "direct-avx512", ...): the
    kernel's own decision
    (`plan_call` in csrc/woq_gemm.cpp), honouring QLOWER_CPU_WOQ_GEMM_PATH and QLOWER_CPU_WOQ_ISA."""
    return ops().woq_int8_gemm_plan(m, dtype, nk, k)


def int8_gemm_isa() -> str:
    """The ISA level qlower::int8_gemm's own kernels run at on this CPU ("avx512_vnni", "avx512", "avx2",
    "scalar"), honouring QLOWER_CPU_INT8_GEMM_ISA (csrc/int8_gemm.cpp)."""
    return ops().int8_gemm_isa()
