"""C shim generation without XPU hardware: expect-tests of the XPU declarations, the `_scaled_mm_v2` symbol
trap, clash checks, the ABI lock, the CLI's two file layouts, and the XPU source compiling against the CPU
wheel's headers (which have no XPU dispatch headers)."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from pathlib import Path

import expecttest
import pytest
import torch
import torch.utils.cpp_extension as cpp_extension
from torch import fx

import qlower
from qlower.lowerings.aoti import abi_lock, build, cli, codegen, runtime
from qlower.lowerings.aoti import shim_ops as ops
from qlower.lowerings.kernels import cpp_build
from tests.helpers import ROOT


def declarations(device: str, extra: tuple[str, ...] = ()) -> str:
    shim_plan = codegen.plan(device, ops.ops_for_device(device, extra))
    return "\n".join(s.declaration for s in shim_plan.shims)


class TestXpuDeclarations(expecttest.TestCase):
    def test_in_tree_xpu_shims(self):
        # qlower's own ops (device-generic); the aten ops xpu's lowerings emit are all shimmed by torch.
        self.assertExpectedInline(
            declarations("xpu"),
            """\
AOTITorchError aoti_torch_xpu_int8_gemm(AtenTensorHandle x, AtenTensorHandle w_nk, int64_t max_m, AtenTensorHandle* ret0)
AOTITorchError aoti_torch_xpu_int8_mm_min_m(AtenTensorHandle x, AtenTensorHandle w_nk, int64_t min_m, AtenTensorHandle* ret0)
AOTITorchError aoti_torch_xpu_mx_bytes(AtenTensorHandle t, AtenTensorHandle* ret0)
AOTITorchError aoti_torch_xpu_woq_int8_gemm(AtenTensorHandle x, AtenTensorHandle w_nk, AtenTensorHandle* scale, AtenTensorHandle* bias, int32_t scale_on_weight, int32_t out_dtype, AtenTensorHandle* ret0)
AOTITorchError aoti_torch_xpu_woq_int8_mm_by_m(AtenTensorHandle x, AtenTensorHandle w_nk, AtenTensorHandle scale, int64_t max_m_packed, AtenTensorHandle* ret0)""",
        )

    def test_scaled_mm_v2_is_shimmed_as_its_out_overload(self):
        # `aoti_torch_xpu__scaled_mm_v2` is what versioning `_scaled_mm` to v2 yields: never generated.
        text = declarations("xpu", ("aten::_scaled_mm_v2",))
        self.assertNotIn("aoti_torch_xpu__scaled_mm_v2(", text)
        self.assertExpectedInline(
            text.splitlines()[0],
            """AOTITorchError aoti_torch_xpu__scaled_mm_v2_out(AtenTensorHandle out, AtenTensorHandle self, AtenTensorHandle mat2, const AtenTensorHandle* scale_a, int64_t scale_a_len_, const int64_t* recipe_a, int64_t recipe_a_len_, const int64_t* swizzle_a, int64_t swizzle_a_len_, const AtenTensorHandle* scale_b, int64_t scale_b_len_, const int64_t* recipe_b, int64_t recipe_b_len_, const int64_t* swizzle_b, int64_t swizzle_b_len_, AtenTensorHandle* bias, int32_t* out_dtype, const int64_t* contraction_dim, int64_t contraction_dim_len_, int32_t use_fast_accum)""",
        )


def test_ambiguous_names():
    assert codegen.ambiguous_with(ops.aten_op("_scaled_mm_v2")) == "_scaled_mm"
    assert codegen.ambiguous_with(ops.aten_op("_scaled_mm_v2", "out")) is None
    assert codegen.ambiguous_with(ops.aten_op("_scaled_mm")) is None


def test_torch_shimmed_aten_ops_are_not_shimmed_again():
    assert ops.torch_shims("xpu", ops.aten_op("_weight_int8pack_mm"))
    assert not ops.torch_shims("xpu", ops.aten_op("_scaled_mm_v2", "out"))
    names = [op.qualified for op in ops.ops_for_device("xpu", ("aten::_weight_int8pack_mm",))]
    assert "aten::_weight_int8pack_mm" not in names
    with pytest.raises(codegen.ShimError, match="already declared by torch's c_shim_xpu.h"):
        codegen.plan("xpu", [ops.aten_op("_weight_int8pack_mm")])


@torch.library.custom_op("qlower_test_a::mm", mutates_args=())
def _named_like_aten(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("qlower_test_a::twice", mutates_args=())
def _twice_a(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("qlower_test_b::twice", mutates_args=())
def _twice_b(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


def test_custom_op_named_like_an_aten_op_is_refused():
    # Inductor calls custom ops' shims without their namespace: this one would call aoti_torch_xpu_mm.
    with pytest.raises(codegen.ShimError, match="aten op's name"):
        codegen.plan("xpu", [ops.op_from_name("qlower_test_a::mm")])


def test_two_ops_with_one_symbol_are_refused():
    with pytest.raises(codegen.ShimError, match="would both define aoti_torch_xpu_twice"):
        codegen.plan(
            "xpu", [ops.op_from_name("qlower_test_a::twice"), ops.op_from_name("qlower_test_b::twice")]
        )


def test_abi_lock_is_intact():
    problems = abi_lock.check(abi_lock.generate(), abi_lock.read())
    assert not problems, "\n".join(problems)


def test_abi_lock_catches_a_changed_declaration_and_accepts_a_new_version(tmp_path):
    lock = tmp_path / "abi.lock"
    current = {
        "xpu qlower::op v1": "AOTITorchError aoti_torch_xpu_op(AtenTensorHandle x, AtenTensorHandle* ret0)",
    }
    assert abi_lock.update(current, lock) == ["xpu qlower::op v1"]
    assert abi_lock.check(current, abi_lock.read(lock)) == []

    changed = {
        "xpu qlower::op v1": "AOTITorchError aoti_torch_xpu_op(AtenTensorHandle x, int64_t k, AtenTensorHandle* ret0)"
    }
    (problem,) = abi_lock.check(changed, abi_lock.read(lock))
    assert problem.startswith("changed: xpu qlower::op v1") and "_vN" in problem
    with pytest.raises(ValueError, match="cannot take these changes"):
        abi_lock.update(changed, lock)
    (problem,) = abi_lock.check({}, abi_lock.read(lock), ["xpu"])
    assert problem.startswith("removed: xpu qlower::op v1")

    # The new signature as a new op `op_v2`, the old one kept: the lock grows by one line.
    versioned = {
        **current,
        "xpu qlower::op_v2 v1": "AOTITorchError aoti_torch_xpu_op_v2(AtenTensorHandle x, int64_t k, AtenTensorHandle* ret0)",
    }
    assert abi_lock.check(versioned, abi_lock.read(lock))[0].startswith("not locked: xpu qlower::op_v2 v1")
    assert abi_lock.update(versioned, lock) == ["xpu qlower::op_v2 v1"]
    assert abi_lock.read(lock) == versioned


def test_a_new_aten_argument_needs_a_torchgen_version(tmp_path):
    """An aten op qlower shims gains an argument (here: pretend `use_fast_accum` is new in `_scaled_mm_v2.out`)."""
    op = [ops.aten_op("_scaled_mm_v2", "out")]
    versioned = {"aten::_scaled_mm_v2.out": {"v2": {"new_args": ["use_fast_accum"]}}}
    old = {s.key: s.declaration for s in codegen.plan("xpu", op, versioned).shims if s.version == 1}
    lock = tmp_path / "abi.lock"
    abi_lock.update(old, lock)  # what shipped before the argument existed
    assert "use_fast_accum" not in old["xpu aten::_scaled_mm_v2.out v1"]

    unversioned = {s.key: s.declaration for s in codegen.plan("xpu", op, {}).shims}
    (problem,) = abi_lock.check(unversioned, abi_lock.read(lock))
    assert problem.startswith("changed: xpu aten::_scaled_mm_v2.out v1")

    shims = codegen.plan("xpu", op, versioned).shims
    assert [(s.version, s.symbol) for s in shims] == [
        (2, "aoti_torch_xpu__scaled_mm_v2_out_v2"),
        (1, "aoti_torch_xpu__scaled_mm_v2_out"),
    ]
    assert "contraction_dim_len_), false\n" in shims[1].definition  # v1 passes the new argument's default
    assert abi_lock.update({s.key: s.declaration for s in shims}, lock) == ["xpu aten::_scaled_mm_v2.out v2"]


def test_abi_lock_catches_a_symbol_clash():
    locked = {"xpu aten::_scaled_mm v2": "AOTITorchError aoti_torch_xpu__scaled_mm_v2(AtenTensorHandle self)"}
    clashing = {
        "xpu aten::_scaled_mm_v2 v1": "AOTITorchError aoti_torch_xpu__scaled_mm_v2(AtenTensorHandle a)"
    }
    problems = abi_lock.check({**locked, **clashing}, locked)
    assert any(p.startswith("clash:") and "aoti_torch_xpu__scaled_mm_v2" in p for p in problems), problems


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """The shims of xpu in both layouts: `python -m qlower shims` (custom-ops, with `_scaled_mm_v2`), and the
    same command in-process (extend)."""
    outs = {form: tmp_path_factory.mktemp(form) for form in codegen.FORMS}
    cmd = [sys.executable, "-m", "qlower", "shims", "--device", "xpu", "--out", str(outs["custom-ops"])]
    proc = subprocess.run([*cmd, "--op", "aten::_scaled_mm_v2"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "xpu: aoti_torch_xpu__scaled_mm_v2_out  (aten::_scaled_mm_v2.out)" in proc.stdout
    assert cli.main(["shims", "--device", "xpu", "--out", str(outs["extend"]), "--form", "extend"]) == 0
    return outs


def test_cli_custom_ops_layout(written):
    out = written["custom-ops"]
    assert sorted(p.name for p in out.iterdir()) == [
        "custom_ops_to_c_shims_xpu.json",
        "qlower_c_shim_xpu.cpp",
        "qlower_c_shim_xpu.h",
        "qlower_kernel_qlower_ops.cpp",  # the kernels its shims call directly (cpp_build.DIRECT_KERNELS)
    ]
    table = json.loads((out / "custom_ops_to_c_shims_xpu.json").read_text())
    header = (out / "qlower_c_shim_xpu.h").read_text()
    assert set(table) == {op.qualified for op in ops.qlower_ops()}  # aten ops are not custom ops
    for (decl,) in table.values():
        assert f"AOTI_TORCH_EXPORT {decl};" in header
    assert "AOTI_TORCH_EXPORT AOTITorchError aoti_torch_xpu__scaled_mm_v2_out(" in header


def test_cli_extend_layout(written):
    out = written["extend"]
    header = out / "torch/csrc/inductor/aoti_torch/generated/extend/c_shim_xpu.h"
    source = (out / "c_shim_xpu.cpp").read_text()
    assert header.exists()
    assert "#include <torch/csrc/inductor/aoti_torch/generated/extend/c_shim_xpu.h>" in source


def test_xpu_sources_compile_against_the_cpu_wheel(written):
    include = Path(torch.__file__).parent / "include" / "ATen" / "ops"
    assert not list(include.glob("*_xpu_dispatch.h")), "the wheel ships XPU dispatch headers after all"
    flags = [f"-isystem{p}" for p in cpp_extension.include_paths()]
    for form, out in written.items():
        source = next(p for p in out.glob("*.cpp") if "c_shim" in p.name)
        assert "xpu_dispatch" not in source.read_text() and "at::xpu::" not in source.read_text()
        cmd = ["c++", "-std=c++20", "-fsyntax-only", *flags, f"-I{out}", str(source)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"{form}: {proc.stderr[-3000:]}"


def test_cpu_library_is_built_from_the_cli_output(tmp_path):
    """The library AOTInductor links on cpu (tests/integrations/aoti/test_aoti_export.py) is compiled from
    exactly these files."""
    assert cli.main(["shims", "--device", "cpu", "--out", str(tmp_path)]) == 0
    lib = build.shim_library("cpu")
    written = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".h", ".cpp"))
    assert written == [
        "qlower_c_shim_cpu.cpp",
        "qlower_c_shim_cpu.h",
        "qlower_kernel_int8_gemm.cpp",
        "qlower_kernel_qlower_ops.cpp",
        "qlower_kernel_woq_gemm.cpp",
    ]
    for name in written:
        assert (lib.path.parent / name).read_text() == (tmp_path / name).read_text()
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib.path)], capture_output=True, text=True)
    table = json.loads((tmp_path / "custom_ops_to_c_shims_cpu.json").read_text())
    for (decl,) in table.values():
        assert f" T {decl.split('(')[0].split()[-1]}\n" in exported.stdout


def _graph_calling_mx_bytes() -> fx.Graph:
    qlower.load_ops()  # qlower::mx_bytes
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.zeros(4, dtype=torch.uint8)
    y = graph.call_function(torch.ops.qlower.mx_bytes.default, (x,))
    y.meta["val"] = torch.zeros(4, dtype=torch.uint8)
    graph.output(y)
    return graph


def test_pass_declares_and_links_shims_only_in_cpp_wrapper_compiles_with_qlower_options():
    config = torch._inductor.config
    graph = _graph_calling_mx_bytes()
    global_shims = dict(config.aot_inductor.custom_ops_to_c_shims)
    opts = runtime.config_entries()
    with torch._guards.tracing(torch._guards.TracingContext(None)):  # one compile
        with config.patch(
            cpp_wrapper=True
        ):  # options not from qlower.inductor_options(): leave Inductor's config
            runtime.prepare_compile(graph)
            assert config.aot_inductor.custom_ops_to_c_shims == global_shims
        with config.patch(opts):  # a Python-wrapper compile: nothing to link
            runtime.prepare_compile(graph)
            assert not config.aot_inductor.custom_ops_to_c_shims and not config.aot_inductor.custom_op_libs
        with config.patch({**opts, "cpp_wrapper": True}):
            runtime.prepare_compile(graph)
            shims, libs = config.aot_inductor.custom_ops_to_c_shims, config.aot_inductor.custom_op_libs
            (decls,) = [d for op, d in shims.items() if op.name() == "qlower::mx_bytes"]
            assert decls == [
                "AOTITorchError aoti_torch_cpu_mx_bytes(AtenTensorHandle t, AtenTensorHandle* ret0)"
            ]
            (lib,) = libs
            # linked statically, its symbols hidden: the package needs no qlower file
            # (tests/integrations/aoti/test_aoti_portable.py)
            assert lib.startswith(":libqlower_aoti_shims_cpu.a -L") and "-Wl,--exclude-libs," in lib
            # what Inductor reads, copies and hashes for its cache key: the compile's shims
            assert pickle.loads(pickle.dumps(libs)) == [lib] and copy.copy(libs) == [lib] and [*libs] == [lib]
            assert shims.__reduce_ex__(pickle.DEFAULT_PROTOCOL) == (dict, (dict(shims.items()),))
            assert op_named(copy.copy(shims), "qlower::mx_bytes") and [decls] == [
                d for d in shims.values() if d == decls
            ]
            assert ["-lfoo", *libs] == ["-lfoo", lib]
    # the options hold what they were made with: the shims went with the compile, Inductor's config is unchanged
    assert (
        dict(opts["aot_inductor.custom_ops_to_c_shims"]) == {}
        and list(opts["aot_inductor.custom_op_libs"]) == []
    )
    assert opts == runtime.config_entries()
    with config.patch({**opts, "cpp_wrapper": True}):
        assert not config.aot_inductor.custom_ops_to_c_shims and not config.aot_inductor.custom_op_libs
    assert config.aot_inductor.custom_ops_to_c_shims == global_shims


def test_aot_compile_notes_go_with_the_compiles_own_copy_of_the_options():
    """AOTInductor's compile runs without a TracingContext and deep-copies the options first: the notes live on
    that copy, never on the options."""
    config = torch._inductor.config
    opts = runtime.config_entries()
    compile_copy = copy.deepcopy(opts)  # what compile_fx_aot does
    assert type(compile_copy["aot_inductor.custom_ops_to_c_shims"]) is runtime.CompileShims
    assert torch._guards.TracingContext.try_get() is None
    with config.patch({**compile_copy, "cpp_wrapper": True}):
        runtime.prepare_compile(_graph_calling_mx_bytes())
        assert op_named(config.aot_inductor.custom_ops_to_c_shims, "qlower::mx_bytes")
        assert len(config.aot_inductor.custom_op_libs) == 1
    assert compile_copy["aot_inductor.custom_ops_to_c_shims"].compile_notes is not None
    assert opts["aot_inductor.custom_ops_to_c_shims"].compile_notes is None
    with config.patch({**opts, "cpp_wrapper": True}):  # the options themselves, in another compile
        assert not config.aot_inductor.custom_ops_to_c_shims and not config.aot_inductor.custom_op_libs


def op_named(shims: dict, name: str) -> bool:
    return any(op.name() == name for op in shims)


@pytest.mark.parametrize("device", ["cpu", "cuda", "xpu"])
def test_every_shimmed_qlower_op_calls_its_kernel_directly(device):
    """A package calls no qlower op through the dispatcher: it runs where no qlower op is registered
    (tests/integrations/aoti/test_aoti_portable.py runs packages so). The one exception is a shim kept for the
    ABI of an op qlower emits on another device only (woq_int8_gemm, a CPU kernel, has cuda and xpu shims)."""
    shim_plan = codegen.plan(device, ops.ops_for_device(device), direct_kernels=True)
    qlower_shims = [s for s in shim_plan.shims if s.op.startswith("qlower::")]
    assert qlower_shims
    for shim in qlower_shims:
        kernel_device, _ = cpp_build.DIRECT_KERNELS[shim.op]  # every qlower op has a C++ kernel
        if kernel_device in (device, cpp_build.ANY_DEVICE):
            assert f"qlower_call_qlower_{shim.op.split('::')[1]}(" in shim.definition, shim.definition
        else:
            assert "qlower_dispatch_" in shim.definition, shim.definition
    assert "qlower_ops.cpp" in shim_plan.kernel_sources
    assert ("woq_gemm.cpp" in shim_plan.kernel_sources) == (device == "cpu")


def test_a_dispatcher_shim_names_the_op_and_the_fix():
    """Without direct kernels (an op that had none), the shim's error says what to load."""
    source = codegen.render_source(codegen.plan("cpu", ops.ops_for_device("cpu")), "custom-ops")
    assert "qlower::woq_int8_mm_by_m, which no library in this process registers" in source
    assert "qlower.load_ops()" in source and "python -m qlower ops-library" in source
