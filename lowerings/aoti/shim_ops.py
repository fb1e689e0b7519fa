"""Which operators need a qlower-made C shim on a device, and their schemas (torchgen's model of them).

Two sources: qlower's own operators (namespace `qlower`: device-generic, so every device gets their shims)
and the aten operators qlower's lowerings for the device declare in `Lowering.emits` that the installed torch
has no shim for on that device. An aten op torch already shims is never shimmed again (same symbol twice).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torchgen.model import FunctionSchema, NativeFunction

_SHIM_SYMBOL = re.compile(r"AOTITorchError\s+(aoti_torch_\w+)\s*\(")


@dataclass(frozen=True)
class ShimOp:
    """One operator overload to shim: `ns::name.overload` plus its torchgen schema."""

    namespace: str
    name: str
    overload: str  # "" for the default overload
    schema: FunctionSchema
    native: NativeFunction | None = None  # aten ops: the native_functions.yaml entry

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}" + (f".{self.overload}" if self.overload else "")

    @property
    def op_overload(self) -> torch._ops.OpOverload:
        packet = getattr(getattr(torch.ops, self.namespace), self.name)
        return getattr(packet, self.overload or "default")


def split_op_name(qualified: str) -> tuple[str, str, str]:
    """'aten::_scaled_mm_v2.out' -> ('aten', '_scaled_mm_v2', 'out'); a missing overload is ''."""
    if "::" not in qualified:
        raise ValueError(f"qlower shims: op names are 'namespace::name[.overload]', got {qualified!r}")
    ns, rest = qualified.split("::", 1)
    name, _, overload = rest.partition(".")
    return ns, name, "" if overload == "default" else overload


@functools.cache
def parsed_native_yaml():
    """aten's native_functions.yaml as shipped with the installed torch (torchgen/packaged), parsed once."""
    import torchgen
    from torchgen.gen import parse_native_yaml

    root = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native"
    return parse_native_yaml(str(root / "native_functions.yaml"), str(root / "tags.yaml"))


@functools.cache
def _native_functions() -> dict[str, NativeFunction]:
    """aten native functions by 'name.overload' (torchgen's OperatorName text)."""
    return {str(f.func.name): f for f in parsed_native_yaml().native_functions}


@functools.cache
def aten_shim_names() -> frozenset[str]:
    """Every aten op's shim base name (`OperatorName.unambiguous_name()`): names torch may shim one day."""
    return frozenset(f.func.name.unambiguous_name() for f in parsed_native_yaml().native_functions)


def aten_op(name: str, overload: str = "") -> ShimOp:
    key = f"{name}.{overload}" if overload else name
    native = _native_functions().get(key)
    if native is None:
        raise KeyError(f"qlower shims: aten::{key} is not in the installed native_functions.yaml")
    return ShimOp("aten", name, overload, native.func, native)


def registered_op(namespace: str, name: str, overload: str = "") -> ShimOp:
    """An operator registered with the dispatcher (torch.library), schema read back from the registry."""
    op = getattr(getattr(torch.ops, namespace), name)
    schema = str(getattr(op, overload or "default")._schema)
    return ShimOp(namespace, name, overload, FunctionSchema.parse(schema.split("::", 1)[1]))


def op_from_name(qualified: str) -> ShimOp:
    ns, name, overload = split_op_name(qualified)
    return aten_op(name, overload) if ns == "aten" else registered_op(ns, name, overload)


# qlower ops of one device whose kernels need more than the C++ compiler (the CUTLASS ops: nvcc and the CUTLASS
# headers, minutes of build): op -> (device, the module that registers it). Their shims are declared for that
# device alone and built into one library of their own per device, linked only into the packages that call
# one of them (lowerings/aoti/build.py `separate_shim_library`, runtime.prepare_compile).
SEPARATE_LIBRARY_OPS: dict[str, tuple[str, str]] = {
    "qlower::woq_int8_cutlass": ("cuda", "qlower.lowerings.kernels.cutlass.w8a16"),
    "qlower::mxfp4_cutlass": ("cuda", "qlower.lowerings.kernels.cutlass.mxfp4"),
}


def separate_library_ops(device: str) -> list[ShimOp]:
    """The SEPARATE_LIBRARY_OPS of `device`, registered now if they were not yet."""
    import importlib

    found = []
    for name, (op_device, module) in sorted(SEPARATE_LIBRARY_OPS.items()):
        if op_device == device:
            importlib.import_module(module)
            found.append(op_from_name(name))
    return found


def qlower_ops() -> list[ShimOp]:
    """qlower's own operators currently registered (the built-in backends register them at the registry's
    first use), except triton_ops (qlower emits those already decomposed into Triton kernel calls, which
    Inductor compiles into the package) and the ops whose lowerings refuse AOTInductor compiles
    (`custom_ops.PYTHON_RUNTIME_ONLY`)."""
    from torch._library.triton import triton_ops_to_kernels

    from qlower.lowerings.kernels.custom_ops import PYTHON_RUNTIME_ONLY
    from qlower.lowerings.registry import ensure_builtin_backends

    ensure_builtin_backends()  # the backends, their lowerings and custom ops

    names = sorted(
        n
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("qlower::")
        and n.split(".")[0] not in triton_ops_to_kernels
        and n.split(".")[0] not in PYTHON_RUNTIME_ONLY
        and n.split(".")[0] not in SEPARATE_LIBRARY_OPS
    )
    return [op_from_name(n) for n in names]


def torch_shim_header(device: str) -> Path:
    """The installed torch's generated C shim header for `device` (may not exist for out-of-tree devices)."""
    include = Path(torch.__file__).parent / "include"
    return include / "torch" / "csrc" / "inductor" / "aoti_torch" / "generated" / f"c_shim_{device}.h"


@functools.cache
def torch_shim_symbols(device: str) -> frozenset[str]:
    """Every `aoti_torch_<device>_*` function the installed torch declares in its generated C shim header."""
    path = torch_shim_header(device)
    if not path.exists():
        return frozenset()
    return frozenset(_SHIM_SYMBOL.findall(path.read_text()))


def torch_shims(device: str, op: ShimOp) -> bool:
    """Does the installed torch already have a C shim for this aten op (any version) on `device`?"""
    base = f"aoti_torch_{device}_{op.schema.name.unambiguous_name()}"
    symbols = torch_shim_symbols(device)
    return base in symbols or any(re.fullmatch(re.escape(base) + r"_v\d+", s) for s in symbols)


def lowering_emits(device: str) -> list[str]:
    """The extern ops the lowerings registered for `device` declare they emit (`Lowering.emits`)."""
    from qlower.lowerings import backends

    backend = backends().get(device)
    if backend is None:
        return []
    seen: dict[str, None] = {}
    for lowering in backend.lowerings:
        for name in lowering.emits:
            seen.setdefault(name, None)
    return list(seen)


def ops_for_device(
    device: str, extra: list[str] | tuple[str, ...] = (), separate: bool = True
) -> list[ShimOp]:
    """The ops qlower must shim for `device`: its own ops, plus emitted aten ops the installed torch lacks;
    `separate=False` leaves out the ops whose shims have a library of their own (SEPARATE_LIBRARY_OPS)."""
    chosen: dict[str, ShimOp] = {op.qualified: op for op in qlower_ops()}
    if separate:
        chosen.update((op.qualified, op) for op in separate_library_ops(device))
    for name in [*lowering_emits(device), *extra]:
        op = op_from_name(name)
        if op.namespace == "aten" and torch_shims(device, op):
            continue
        chosen.setdefault(op.qualified, op)
    return [chosen[k] for k in sorted(chosen)]
