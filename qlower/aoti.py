"""`qlower.aoti`: the AOTInductor C-shim tooling under its public name (it lives in `lowerings/aoti/`)."""

from qlower.lowerings.aoti import shim_ops

from qlower.lowerings.aoti import abi_lock

from qlower.lowerings.aoti import build

from qlower.lowerings.aoti import cli

from qlower.lowerings.aoti import codegen

from qlower.lowerings.aoti import dtypes

from qlower.lowerings.aoti import runtime
from qlower.lowerings.aoti import *  # noqa: F403

__all__ = ["abi_lock", "build", "cli", "codegen", "dtypes", "runtime", "shim_ops"]
