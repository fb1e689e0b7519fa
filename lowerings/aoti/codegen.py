"""C shim declarations and definitions for qlower's ops, written by torchgen from the installed torch.

torchgen (`torchgen/gen_aoti_c_shim.py`) decides the declaration format: argument and return mapping,
optional/list conventions, `_vN` versions. qlower only chooses the call each definition makes, always
through the dispatcher so a source compiles against any torch build's headers (no `at::xpu::` dispatch
headers, which the CPU wheel does not ship):
- aten ops: torchgen's generic call `at::<op>` (which is `at::_ops::<op>::call`);
- qlower's own ops: a typed `c10::Dispatcher` call, whose C++ type torchgen's `DispatcherSignature` gives;
  in the shim library qlower links into packages, the ops with a C++ kernel of qlower's own
  (cpp_build.DIRECT_KERNELS) call that function instead, compiled into the library.

Symbols are checked for clashes before anything is written (see `plan`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torchgen import gen_aoti_c_shim
from torchgen.api.types import DispatcherSignature
from torchgen.gen_aoti_c_shim import gen_static_dispatch_backend_call, get_header_for_aoti

from qlower.lowerings.aoti.shim_ops import (
    ShimOp,
    aten_op,
    aten_shim_names,
    parsed_native_yaml,
    torch_shim_symbols,
)
from qlower.lowerings.kernels.cpp_build import direct_kernel

_VERSIONED = re.compile(r"(.+)_v(\d+)")
_DECLARED = re.compile(r"AOTITorchError\s+(aoti_torch_\w+)\s*\(")

FORMS = ("custom-ops", "extend")

# torchgen version metadata of the aten ops qlower shims itself (torch's own are in torchgen/aoti/fallback_ops.py).
# qlower's own ops are versioned by name instead: Inductor calls a custom op's shim by the op's name.
SHIM_VERSIONS: dict[str, dict] = {}


class ShimError(RuntimeError):
    """An op qlower cannot shim, or a shim symbol that would clash with another one."""


@dataclass(frozen=True)
class Shim:
    """One C shim function: the symbol AOTInductor calls for one version of one op on one device."""

    device: str
    op: str  # qualified op name, e.g. "qlower::woq_int8_mm_by_m" or "aten::_scaled_mm_v2.out"
    version: int
    symbol: str
    declaration: str  # "AOTITorchError aoti_torch_<device>_<name>(...)": the ABI, what the lock records
    definition: str
    include: str | None = None  # an ATen per-operator header the definition needs

    @property
    def key(self) -> str:
        return f"{self.device} {self.op} v{self.version}"


@dataclass
class ShimPlan:
    """What to generate for a device: the shims, and the ops that were remapped or left out (and why)."""

    device: str
    shims: list[Shim] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    helpers: list[str] = field(default_factory=list)  # C++ dispatcher calls for non-aten ops
    kernel_declarations: list[str] = field(default_factory=list)  # C++ kernels the direct calls need
    kernel_sources: list[str] = field(default_factory=list)  # their csrc files, each once (DIRECT_KERNELS)


def shim_name(op: ShimOp, version: int = 1) -> str:
    """torchgen's naming: the op's unambiguous name, plus `_vN` from version 2 on."""
    base = op.schema.name.unambiguous_name()
    return base if version == 1 else f"{base}_v{version}"


def ambiguous_with(op: ShimOp) -> str | None:
    """The aten op whose `_vN` shim would get the same name as `op`'s unversioned shim, if any.

    torchgen names version N of op `X` `X_vN`; an op that is itself called `X_vN` (aten's `_scaled_mm_v2`)
    would take the symbol reserved for `X`'s next version (`aoti_torch_<dev>__scaled_mm_v2`).
    """
    match = _VERSIONED.fullmatch(op.schema.name.unambiguous_name())
    if match is None:
        return None
    stem = match.group(1)
    return stem if stem in aten_shim_names() else None


def _resolve(op: ShimOp, notes: list[str]) -> ShimOp:
    """The overload to shim for `op`: an ambiguous functional aten op is shimmed as its `.out` overload."""
    other = ambiguous_with(op)
    if other is None:
        return op
    if op.namespace == "aten" and not op.schema.is_out_fn():
        try:
            out = aten_op(op.name, "out")
        except KeyError:
            out = None
        if out is not None and ambiguous_with(out) is None:
            notes.append(
                f"{op.qualified}: shimmed as {out.qualified} only; its own symbol would be "
                f"aoti_torch_<device>_{shim_name(op)}, the name of aten::{other}'s versioned shim"
            )
            return out
    raise ShimError(
        f"{op.qualified}: its C shim name '{shim_name(op)}' is the name of aten::{other}'s versioned shim; "
        "rename the op (qlower ops: never end a name in _vN unless it is the next version of a qlower op)"
    )


# What a shim that calls the dispatcher says where its op is not registered (a C++ string literal).
_UNREGISTERED = (
    "this AOTInductor package calls {op}, which no library in this process registers: run "
    "qlower.load_ops() before loading the package, or load the library `python -m qlower ops-library` writes "
    "with torch.ops.load_library (docs/aoti.md, Serving)"
)


def _dispatcher_helper(op: ShimOp) -> tuple[str, str]:
    """(C++ function name, C++ definition) of a typed dispatcher call to a non-aten op."""
    if op.schema.is_out_fn() or op.schema.kind().name != "functional":
        raise NotImplementedError(f"{op.qualified}: only functional ops get dispatcher-call shims")
    fn = f"qlower_dispatch_{op.namespace}_{op.name}" + (f"_{op.overload}" if op.overload else "")
    sig = DispatcherSignature.from_schema(op.schema)
    args = ", ".join(a.name for a in sig.arguments())
    body = (
        f"{sig.decl(name=fn)} {{\n"
        f"  static auto op = [] {{\n"
        f'    auto handle = c10::Dispatcher::singleton().findSchema({{"{op.namespace}::{op.name}", '
        f'"{op.overload}"}});\n'
        f'    TORCH_CHECK(handle.has_value(), "{_UNREGISTERED.format(op=op.qualified)}");\n'
        f"    return handle->typed<{sig.type()}>();\n"
        f"  }}();\n"
        f"  return op.call({args});\n"
        f"}}"
    )
    return fn, body


def _direct_helper(op: ShimOp) -> tuple[str, str, str]:
    """(C++ function name, its definition, the kernel's declaration) of a shim's direct call to the C++
    kernel `<namespace>::<name>` (cpp_build.DIRECT_KERNELS), whose parameters are the dispatcher's with
    plain integers (`int64_t`, not `c10::SymInt`: a package calls with concrete sizes)."""
    fn = f"qlower_call_{op.namespace}_{op.name}"
    sig = DispatcherSignature.from_schema(op.schema, symint=False)
    args = ", ".join(a.name for a in sig.arguments())
    declaration = f"namespace {op.namespace} {{\n{sig.decl(name=op.name)};\n}}"
    body = f"{sig.decl(name=fn)} {{\n  return ::{op.namespace}::{op.name}({args});\n}}"
    return fn, body, declaration


def _one_shim(
    device: str, op: ShimOp, plan: ShimPlan, versions: dict[str, dict], direct: bool = False
) -> list[Shim]:
    """torchgen's shims of `op`, newest version first (one per `vN` in its version metadata, plus v1)."""
    source = direct_kernel(op.qualified, device) if direct else None
    if op.native is not None:
        call = gen_static_dispatch_backend_call(op.native, None)
        include = get_header_for_aoti(op.native, {}, None, parsed_native_yaml().backend_indices, False)
    elif source is not None and not op.overload:
        call, helper, declaration = _direct_helper(op)
        plan.helpers.append(helper)
        plan.kernel_declarations.append(declaration)
        if source not in plan.kernel_sources:
            plan.kernel_sources.append(source)
        include = None
    else:
        call, helper = _dispatcher_helper(op)
        plan.helpers.append(helper)
        include = None
    metadata = versions.get(op.qualified, {})
    # torchgen caches by (name, device, call), not by version metadata.
    gen_aoti_c_shim.declaration_definition_cache.pop((op.schema.name.unambiguous_name(), device, call), None)
    declarations, definitions = gen_aoti_c_shim.gen_declaration_and_definition(
        op.schema, device, call, metadata
    )
    decls = [d.removeprefix("AOTI_TORCH_EXPORT ").rstrip(";") for d in declarations.splitlines()]
    defs = [
        d.strip() for d in re.split(r"^(?=AOTITorchError )", definitions.strip(), flags=re.M) if d.strip()
    ]
    numbers = sorted((int(k[1:]) for k in metadata if k.startswith("v")), reverse=True) + [1]
    if not (len(decls) == len(defs) == len(numbers)) or any("#if" in d for d in decls):
        raise ShimError(f"{op.qualified}: unexpected torchgen output for versions {numbers}: {decls}")
    return [
        Shim(device, op.qualified, n, _DECLARED.search(d).group(1), d, body, include)
        for n, d, body in zip(numbers, decls, defs, strict=True)
    ]


def plan(
    device: str, ops: list[ShimOp], versions: dict[str, dict] | None = None, direct_kernels: bool = False
) -> ShimPlan:
    """Shims for `ops` on `device`, after the clash checks.

    `direct_kernels`: the shims of the ops in cpp_build.DIRECT_KERNELS call their C++ kernel itself (the
    shim library compiles `plan.kernel_sources` in), not the dispatcher. Declarations are the same either way.

    `versions` maps an op ("aten::_scaled_mm_v2.out") to torchgen's version metadata
    (`{"v2": {"new_args": [...]}}`), default `SHIM_VERSIONS`: how a signature change gets a `_vN`.

    Fails (ShimError) when a symbol would be generated twice, is already declared by the installed torch's
    `c_shim_<device>.h` (the extend header would redeclare it), names a qlower op like an aten op (Inductor
    drops the namespace of custom ops: `qlower::mm` would call `aoti_torch_<dev>_mm`), or is a symbol
    torchgen reserves for another op's next version.
    """
    result = ShimPlan(device)
    torch_symbols = torch_shim_symbols(device)
    seen: dict[str, str] = {}
    for requested in ops:
        op = _resolve(requested, result.notes)
        if op.namespace != "aten" and op.schema.name.unambiguous_name() in aten_shim_names():
            raise ShimError(
                f"{op.qualified}: AOTInductor calls custom ops by name without namespace, and "
                f"'{op.schema.name.unambiguous_name()}' is an aten op's name: rename the op"
            )
        try:
            shims = _one_shim(
                device, op, result, SHIM_VERSIONS if versions is None else versions, direct_kernels
            )
        except NotImplementedError as e:
            result.notes.append(f"{op.qualified}: no C shim possible ({e}); it stays on the proxy executor")
            continue
        for shim in shims:
            if shim.symbol in torch_symbols:
                raise ShimError(f"{shim.op}: {shim.symbol} is already declared by torch's c_shim_{device}.h")
            if shim.symbol in seen:
                raise ShimError(f"{shim.op} and {seen[shim.symbol]} would both define {shim.symbol}")
            seen[shim.symbol] = shim.op
            result.shims.append(shim)
    return result


_BANNER = """\
// AOTInductor C shims of qlower's ops for device '{device}'.
// Generated by `python -m qlower shims` with torchgen from torch {torch}; do not edit.
// ABI: a declaration here never changes; a new signature is a new `_vN` (see lowerings/aoti/abi.lock)."""


def header_include(device: str, form: str) -> str:
    """Path of the header as other files include it."""
    if form == "extend":
        return f"torch/csrc/inductor/aoti_torch/generated/extend/c_shim_{device}.h"
    return f"qlower_c_shim_{device}.h"


def render_header(shim_plan: ShimPlan) -> str:
    body = "\n".join(f"AOTI_TORCH_EXPORT {s.declaration};" for s in shim_plan.shims)
    return "\n".join(
        [
            _BANNER.format(device=shim_plan.device, torch=torch.__version__),
            "#pragma once",
            "",
            "#include <torch/csrc/inductor/aoti_torch/c/shim.h>",
            "",
            "#ifdef __cplusplus",
            'extern "C" {',
            "#endif",
            "",
            body,
            "",
            "#ifdef __cplusplus",
            '} // extern "C"',
            "#endif",
            "",
        ]
    )


def render_source(shim_plan: ShimPlan, form: str) -> str:
    include = header_include(shim_plan.device, form)
    own = f"#include <{include}>" if form == "extend" else f'#include "{include}"'
    aten_includes = sorted({s.include for s in shim_plan.shims if s.include})
    lines = [
        _BANNER.format(device=shim_plan.device, torch=torch.__version__),
        own,
        "#include <torch/csrc/inductor/aoti_torch/utils.h>",
        "#include <ATen/core/dispatch/Dispatcher.h>",
        *aten_includes,
        "",
        "using namespace torch::aot_inductor;",
        "",
    ]
    if shim_plan.kernel_declarations:
        lines += ["\n\n".join(shim_plan.kernel_declarations), ""]
    if shim_plan.helpers:
        lines += ["namespace {", "", "\n\n".join(shim_plan.helpers), "", "} // namespace", ""]
    lines += ["\n\n".join(s.definition for s in shim_plan.shims), ""]
    return "\n".join(lines)


def custom_ops_to_c_shims(shim_plan: ShimPlan) -> dict[str, list[str]]:
    """{qualified op: [declarations]}: the value `aot_inductor.custom_ops_to_c_shims` wants (with OpOverload keys)."""
    table: dict[str, list[str]] = {}
    for shim in shim_plan.shims:
        if not shim.op.startswith("aten::"):
            table.setdefault(shim.op, []).append(shim.declaration)
    return table
