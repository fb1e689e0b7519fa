"""Build qlower's native libraries on demand with torch.utils.cpp_extension, cached by content.

- the shim library of one device: the generated C shims, as `libqlower_aoti_shims_<device>.so` and as the
  static archive `libqlower_aoti_shims_<device>.a`. AOTInductor links the archive into each package's own
  wrapper (`aot_inductor.custom_op_libs`, symbols hidden), so a package depends on no qlower file and loads
  wherever it is copied (tests/integrations/aoti/test_aoti_portable.py). The shims call the dispatcher: they work in any
  process where qlower's ops are registered, by qlower's Python (`qlower.load_ops()`) or by the ops library
  below; except those of the ops with a C++ kernel of qlower's own (cpp_build.DIRECT_KERNELS), which call the
  kernel compiled into the library, so the package needs no registration (and no build) for them.
- the ops library `libqlower_ops.so`: qlower's ops in C++ for processes without qlower's Python (C++
  deployments; `python -m qlower ops-library --out DIR` copies it out). Its schemas are generated from the
  Python registrations (the one source of truth), its kernels are `lowerings/kernels/csrc/*.cpp`; loading it
  checks each kernel against its schema.

The builder itself, and the in-process native library `libqlower_native.so` (the C++ kernels qlower's own
Python ops call, under the private namespace `qlower_native`), live in lowerings/kernels/cpp_build.py.
"""

from __future__ import annotations

from qlower.lowerings.aoti import codegen
from qlower.lowerings.aoti import shim_ops as ops
from qlower.lowerings.kernels.cpp_build import (  # noqa: F401  (re-exported: build.BuildError, build.Library)
    CSRC,
    BuildError,
    Library,
    build,
    cache_root,
    kernel_only_sources,
    native_library,
)


def shim_library(device: str) -> Library:
    """libqlower_aoti_shims_<device>.{so,a} with the C shims of every op qlower may emit on `device`, except
    those with a library of their own (`separate_shim_library`)."""
    shim_plan = codegen.plan(device, ops.ops_for_device(device, separate=False), direct_kernels=True)
    files = {
        codegen.header_include(device, "custom-ops"): codegen.render_header(shim_plan),
        f"qlower_c_shim_{device}.cpp": codegen.render_source(shim_plan, "custom-ops"),
        **kernel_only_sources(shim_plan.kernel_sources),
    }
    return build(f"qlower_aoti_shims_{device}", files)


def separate_shim_library(device: str) -> Library:
    """The shim library of `device`'s `shim_ops.SEPARATE_LIBRARY_OPS`: their C shims, their C++ kernels and
    the objects the kernels call (the CUTLASS ops: the CUTLASS library's, built by nvcc at first use). Linked
    only into packages that call one of them. Raises BuildError when the objects cannot be had (no nvcc or
    CUTLASS here)."""
    from qlower.lowerings.kernels.cutlass import build as cutlass_build

    separate = ops.separate_library_ops(device)
    shim_plan = codegen.plan(device, separate, direct_kernels=True)
    objects = cutlass_build.objects()
    cudart = cutlass_build.cudart_link_flags()
    for why in (objects, cudart):
        if isinstance(why, str):
            names = ", ".join(o.qualified for o in separate)
            raise BuildError(f"qlower: no C shim for {names}: {why}")
    files = {
        codegen.header_include(device, "custom-ops"): codegen.render_header(shim_plan),
        f"qlower_c_shim_{device}_cutlass.cpp": codegen.render_source(shim_plan, "custom-ops"),
        **kernel_only_sources(shim_plan.kernel_sources),
    }
    return build(
        f"qlower_aoti_shims_{device}_cutlass", files, extra_objects=tuple(objects), link_flags=tuple(cudart)
    )


def render_op_definitions() -> str:
    """TORCH_LIBRARY(qlower) with every qlower op's schema, read back from the Python registrations."""
    defs = "\n".join(
        f'  m.def("{schema}");'
        for schema in (str(op.op_overload._schema).split("::", 1)[1] for op in ops.qlower_ops())
    )
    return (
        "// qlower's op schemas, generated from the Python registrations (qlower/lowerings/kernels/custom_ops.py).\n"
        "#include <torch/library.h>\n\n"
        f"TORCH_LIBRARY(qlower, m) {{\n{defs}\n}}\n"
    )


def ops_library() -> Library:
    """libqlower_ops.so: qlower's ops defined and implemented in C++ (for processes without qlower's Python)."""
    files = {"qlower_op_schemas.cpp": render_op_definitions()}
    return build("qlower_ops", files, extra_sources=tuple(sorted(CSRC.glob("*.cpp"))))
