"""qlower's C++ kernels in qlower's own process: `libqlower_native.so`, built at first use and cached.

Why a library of its own: `libqlower_ops.so` defines the `qlower` namespace, which qlower's Python also
defines, so the two must never meet in one process (lowerings/aoti/build.py). The native library registers
the same kernels (lowerings/kernels/csrc/woq_gemm.cpp) under the private namespace `qlower_native` instead,
and in `qlower` only the CPU kernel of `qlower::woq_int8_gemm`, whose schema qlower's Python defines
(lowerings/kernels/custom_ops.py). It is built in a child process (lowerings/kernels/cpp_build.py,
`native_library`), cached on disk by content, and loaded once per process.
"""

from __future__ import annotations

import functools
import shutil
import threading

import torch

_LOCK = threading.Lock()
_LOADED: list[str] = []  # the path loaded into this process, once


def ops() -> torch._ops._OpNamespace:
    """`torch.ops.qlower_native`, building and loading the library on the first call (raises BuildError)."""
    with _LOCK:
        if not _LOADED:
            from qlower.lowerings.kernels import cpp_build

            lib = cpp_build.native_library()
            if not hasattr(torch.ops.qlower_native, "woq_int8_gemm"):  # loaded by someone else already
                torch.ops.load_library(str(lib.path))
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
    """The ISA paths of qlower::woq_int8_gemm this CPU can run ("scalar", "avx2", "avx512", "avx512_bf16")."""
    return tuple(ops().woq_int8_gemm_isas().split(","))
