"""Make AOTInductor call qlower's C shims instead of the proxy executor.

Inductor calls a custom op through a C shim only when `aot_inductor.custom_ops_to_c_shims` declares it and
`aot_inductor.custom_op_libs` links a library that defines it; otherwise it serializes the call for the proxy
executor. `qlower.inductor_options()` sets both entries to qlower's own objects (`CompileShims`,
`CompileLibs`), and QLowerPass calls `prepare_compile` after lowering: in a C++-wrapper compile (AOTInductor,
cpp_wrapper) that emitted qlower ops, it builds the device's shim library once (cached on disk) and notes its
entries for that compile alone. The two objects show what they were made with plus the notes of the compile
being run, so Inductor declares and links the shims while it generates and builds that compile's code; nothing
is added in place, neither to the options (reused, compared and hashed across compiles) nor to Inductor's
global config, and the notes go with the compile (tests/integrations/aoti/test_aoti_shims.py). The wrapper links the library's
static archive: the shims live inside the package, which loads wherever it is copied, on any process where
qlower's ops are registered (tests/integrations/aoti/test_aoti_portable.py). The ops of `shim_ops.SEPARATE_LIBRARY_OPS` (the
CUTLASS ops) have a shim library of their own, linked only into the packages that call one of them.
`QLOWER_AOTI_SHIMS=0` turns this off (proxy executor).
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from qlower.lowerings.aoti import build, codegen
from qlower.lowerings.aoti import shim_ops as ops

log = logging.getLogger("qlower")


def shim_table(device: str) -> dict[torch._ops.OpOverload, list[str]]:
    """{qlower op: [declaration]} for `device`: the `aot_inductor.custom_ops_to_c_shims` entries."""
    shim_plan = codegen.plan(device, ops.ops_for_device(device))
    return {
        ops.op_from_name(name).op_overload: decls
        for name, decls in codegen.custom_ops_to_c_shims(shim_plan).items()
    }


def shim_options(device: str) -> dict[str, Any]:
    """Inductor config entries that link and declare qlower's C shims for `device` (builds them once)."""
    lib = build.shim_library(device)
    return {
        "aot_inductor.custom_ops_to_c_shims": shim_table(device),
        "aot_inductor.custom_op_libs": [lib.custom_op_libs_entry()],
    }


@dataclass
class _CompileNotes:
    """The C shim entries `prepare_compile` noted for one compile."""

    shims: dict[torch._ops.OpOverload, list[str]] = field(default_factory=dict)
    libs: list[str] = field(default_factory=list)


_lock = threading.Lock()
# By the compile's TracingContext: torch.compile's (a lazily compiled backward runs under its forward's context
# again) and compile_fx's. Weak: the notes go with the compile.
_by_context: weakref.WeakKeyDictionary[object, _CompileNotes] = weakref.WeakKeyDictionary()


def _notes(create: bool = False) -> _CompileNotes | None:
    """The notes of the compile being run: by its TracingContext, else (AOTInductor's compile_fx_aot runs
    without one) on the compile's own `CompileShims`, which compile_fx_aot deep-copies from the options for
    each compile. None outside a compile that carries qlower's options."""
    context = torch._guards.TracingContext.try_get()
    with _lock:
        if context is not None:
            notes = _by_context.get(context)
            if notes is None and create:
                notes = _by_context[context] = _CompileNotes()
            return notes
        shims = torch._inductor.config.aot_inductor.custom_ops_to_c_shims
        if not isinstance(shims, CompileShims):
            return None
        if shims.compile_notes is None and create:
            shims.compile_notes = _CompileNotes()
        return shims.compile_notes


class CompileShims(dict):
    """`aot_inductor.custom_ops_to_c_shims` as `inductor_options()` sets it: the entries it was made with, and
    while a compile runs, the shims `prepare_compile` noted for it. Never added to in place; copies and pickles
    (Inductor's cache keys) hold what it shows."""

    compile_notes: _CompileNotes | None = None  # AOTInductor: the notes of the compile this copy belongs to

    def _shown(self) -> dict[Any, list[str]]:
        own = dict(dict.items(self))
        notes = _notes()
        return {**own, **notes.shims} if notes is not None else own

    def __contains__(self, op: object) -> bool:
        return op in self._shown()

    def __getitem__(self, op: Any) -> list[str]:
        return self._shown()[op]

    def get(self, op: Any, default: Any = None) -> Any:
        return self._shown().get(op, default)

    def __iter__(self):
        return iter(self._shown())

    def __len__(self) -> int:
        return len(self._shown())

    def keys(self):
        return self._shown().keys()

    def values(self):
        return self._shown().values()

    def items(self):
        return self._shown().items()

    def copy(self) -> dict[Any, list[str]]:
        return self._shown()

    def __eq__(self, other: object) -> bool:
        return self._shown() == (other._shown() if isinstance(other, CompileShims) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CompileShims({self._shown()!r})"

    def __reduce__(self):
        return (dict, (self._shown(),))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()

    def __copy__(self) -> CompileShims:
        return CompileShims(dict.items(self))

    def __deepcopy__(self, memo: dict) -> CompileShims:
        return CompileShims(copy.deepcopy(dict(dict.items(self)), memo))


class CompileLibs(list):
    """`aot_inductor.custom_op_libs` as `inductor_options()` sets it: the libraries it was made with, and while
    a compile runs, the shim libraries `prepare_compile` noted for it. Never added to in place."""

    def _shown(self) -> list[str]:
        own = list(list.__iter__(self))
        notes = _notes()
        return own + [lib for lib in notes.libs if lib not in own] if notes is not None else own

    def __iter__(self):
        return iter(self._shown())

    def __len__(self) -> int:
        return len(self._shown())

    def __getitem__(self, i: Any) -> Any:
        return self._shown()[i]

    def __contains__(self, lib: object) -> bool:
        return lib in self._shown()

    def __add__(self, other: Any) -> list[str]:
        return self._shown() + list(other)

    def __radd__(self, other: Any) -> list[str]:
        return list(other) + self._shown()

    def copy(self) -> list[str]:
        return self._shown()

    def __eq__(self, other: object) -> bool:
        return self._shown() == (other._shown() if isinstance(other, CompileLibs) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CompileLibs({self._shown()!r})"

    def __reduce__(self):
        return (list, (self._shown(),))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()

    def __copy__(self) -> CompileLibs:
        return CompileLibs(list.__iter__(self))

    def __deepcopy__(self, memo: dict) -> CompileLibs:
        return CompileLibs(copy.deepcopy(list(list.__iter__(self)), memo))


def config_entries() -> dict[str, Any]:
    """Fresh copies of the two entries, for `inductor_options()` (the config's values when it is called)."""
    cfg = torch._inductor.config.aot_inductor
    return {
        "aot_inductor.custom_ops_to_c_shims": CompileShims(cfg.custom_ops_to_c_shims),
        "aot_inductor.custom_op_libs": CompileLibs(cfg.custom_op_libs or []),
    }


def _emitted(graph: fx.Graph, found: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """{qlower op `ns::name`: device types it runs on} for the ops `graph` calls, in the graphs of its
    subgraph modules too (a `torch.cond` branch holds the CUTLASS op of a symbolic M)."""
    found = {} if found is None else found
    for node in graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target.namespace == "qlower"
        ):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                found.setdefault(f"qlower::{target._opname}", set()).add(val.device.type)
        elif node.op == "get_attr" and graph.owning_module is not None:
            sub = getattr(graph.owning_module, str(node.target), None)
            if isinstance(sub, fx.GraphModule):
                _emitted(sub.graph, found)
    return found


def _separate_libraries(
    emitted: dict[str, set[str]], shims: dict[torch._ops.OpOverload, list[str]]
) -> list[str]:
    """The `custom_op_libs` entries of the devices whose emitted ops have their shims in a library of its own
    (`build.separate_shim_library`); where that library cannot be built here, its ops lose their shim entries
    (the proxy executor calls them)."""
    libs = []
    for device in sorted({device for device, _ in ops.SEPARATE_LIBRARY_OPS.values()}):
        overloads = [
            ops.op_from_name(name).op_overload
            for name, (op_device, _) in sorted(ops.SEPARATE_LIBRARY_OPS.items())
            if op_device == device and device in emitted.get(name, ())
        ]
        if not any(o in shims for o in overloads):
            continue
        try:
            libs.append(build.separate_shim_library(device).custom_op_libs_entry())
        except (build.BuildError, codegen.ShimError) as e:
            log.warning(
                "qlower: no C shims of %s's CUTLASS ops, AOTInductor will use the proxy executor: %s",
                device,
                e,
            )
            for o in overloads:
                shims.pop(o, None)
    return libs


def prepare_compile(graph: fx.Graph) -> None:
    """In a C++-wrapper compile, declare and link the C shims of the qlower ops `graph` calls, for this compile
    only (`_notes`): the options and Inductor's config stay as they were."""
    if not torch._inductor.config.cpp_wrapper or os.environ.get("QLOWER_AOTI_SHIMS", "1") == "0":
        return
    emitted = _emitted(graph)
    devices = set().union(*emitted.values()) if emitted else set()
    if not devices:
        return
    cfg = torch._inductor.config.aot_inductor
    if not (
        isinstance(cfg.custom_ops_to_c_shims, CompileShims) and isinstance(cfg.custom_op_libs, CompileLibs)
    ):
        log.info(
            "qlower: AOTInductor config not from qlower.inductor_options(): qlower ops use the proxy executor"
        )
        return
    shims: dict[torch._ops.OpOverload, list[str]] = {}
    libs: list[str] = []
    for device in sorted(devices):
        try:
            entries = shim_options(device)
        except (build.BuildError, codegen.ShimError) as e:
            log.warning("qlower: no C shims for %s, AOTInductor will use the proxy executor: %s", device, e)
            continue
        shims.update(entries["aot_inductor.custom_ops_to_c_shims"])
        libs.extend(e for e in entries["aot_inductor.custom_op_libs"] if e not in libs)
    libs.extend(e for e in _separate_libraries(emitted, shims) if e not in libs)
    notes = _notes(create=True)
    assert notes is not None  # the config holds a CompileShims
    with _lock:
        notes.shims.update(shims)
        notes.libs.extend(e for e in libs if e not in notes.libs)
