"""`qlower.aoti`: the AOTInductor C-shim tooling under its public name (it lives in `lowerings/aoti/`)."""

from qlower.lowerings.aoti import abi_lock, build, cli, codegen, dtypes, runtime, shim_ops

__all__ = ["abi_lock", "build", "cli", "codegen", "dtypes", "runtime", "shim_ops"]
