"""Make AOTInductor call qlower's C shims instead of the proxy executor.

Inductor calls a custom op through a C shim only when `aot_inductor.custom_ops_to_c_shims` declares it and
`aot_inductor.custom_op_libs` links a library that defines it; otherwise it serializes the call for the proxy
executor. `qlower.inductor_options()` carries its own copies of both entries, and QLowerPass calls
`prepare_compile` after lowering: in a C++-wrapper compile (AOTInductor, cpp_wrapper) that emitted qlower ops,
it builds the device's shim library once (cached on disk) and adds it to those copies, never to Inductor's
global config. The wrapper links the library's static archive: the shims live inside the package, which
loads wherever it is copied, on any process where qlower's ops are registered (tests/test_aoti_portable.py).
`QLOWER_AOTI_SHIMS=0` turns this off (proxy executor).
"""

from __future__ import annotations

import logging
import os
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


class CompileShims(dict):
    """`aot_inductor.custom_ops_to_c_shims` as `inductor_options()` sets it: the pass may add to it in place."""


class CompileLibs(list):
    """`aot_inductor.custom_op_libs` as `inductor_options()` sets it: the pass may add to it in place."""


def config_entries() -> dict[str, Any]:
    """Fresh copies of the two entries, for `inductor_options()`.

    Inductor re-applies the compile's config patches around its inner compile, so the pass cannot assign new
    values: it adds to these objects in place. They are per-options copies (and AOTInductor deep-copies them
    again), so additions never reach Inductor's global config; the marker types say they are qlower's.
    """
    cfg = torch._inductor.config.aot_inductor
    return {
        "aot_inductor.custom_ops_to_c_shims": CompileShims(cfg.custom_ops_to_c_shims),
        "aot_inductor.custom_op_libs": CompileLibs(cfg.custom_op_libs or []),
    }


def _emitted_devices(graph: fx.Graph) -> set[str]:
    """Device types on which `graph` calls one of qlower's own ops."""
    devices = set()
    for node in graph.nodes:
        target = node.target
        if (
            node.op == "call_function"
            and isinstance(target, torch._ops.OpOverload)
            and target.namespace == "qlower"
        ):
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                devices.add(val.device.type)
    return devices


def prepare_compile(graph: fx.Graph) -> None:
    """In a C++-wrapper compile, declare and link the C shims of the qlower ops `graph` calls."""
    if not torch._inductor.config.cpp_wrapper or os.environ.get("QLOWER_AOTI_SHIMS", "1") == "0":
        return
    devices = _emitted_devices(graph)
    if not devices:
        return
    cfg = torch._inductor.config.aot_inductor
    shims, libs = cfg.custom_ops_to_c_shims, cfg.custom_op_libs
    if not (isinstance(shims, CompileShims) and isinstance(libs, CompileLibs)):
        log.info(
            "qlower: AOTInductor config not from qlower.inductor_options(): qlower ops use the proxy executor"
        )
        return
    for device in sorted(devices):
        try:
            entries = shim_options(device)
        except (build.BuildError, codegen.ShimError) as e:
            log.warning("qlower: no C shims for %s, AOTInductor will use the proxy executor: %s", device, e)
            continue
        shims.update(entries["aot_inductor.custom_ops_to_c_shims"])
        libs.extend(e for e in entries["aot_inductor.custom_op_libs"] if e not in libs)
