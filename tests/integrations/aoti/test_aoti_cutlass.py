"""AOTInductor packages that call qlower's CUTLASS W8A16 GEMM (`qlower::woq_int8_cutlass`) and its MXFP4 GEMM
(`qlower::mxfp4_cutlass`) through C shims (one library for both, linked only into packages calling either).

On any machine: the C++ configuration choice (generated from the tuned tables) equals `configs.choose` at
every M of a grid, on every tuned GPU and another; the C++ kernel compiles against torch's headers; the shim is
declared for CUDA alone, locked, and built into a library of its own that a compile links only when it calls
the op (found inside `torch.cond` branches too). AOTInductor's choice: a static M in the
measured range and a symbolic M take the kernel when its objects exist, and say why not when they do not. On an
sm_90 GPU (gpu): packages exported with a static and a `Dim` batch call the shim, link no qlower file, and run in a fresh process where qlower cannot be imported,
within the float64 bound.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import fx

import qlower
from qlower.lowerings.aoti import abi_lock, build, codegen, runtime
from qlower.lowerings.aoti import shim_ops as ops
from qlower.lowerings.devices.crossovers import CUTLASS_W8A16_M_RANGE
from qlower.lowerings.devices.cuda import override_cuda_capability
from qlower.lowerings.kernels import cpp_build
from qlower.lowerings.kernels.cutlass import build as cutlass_build
from qlower.lowerings.kernels.cutlass import configs, cpp_sources
from qlower.testing import apply_pass
from tests.helpers import SUBPROCESS_TIMEOUT_S
from tests.helpers.aoti_cuda import needs_cuda_package_load
from tests.helpers.aoti_package import elf, export_and_move, run_fresh, run_script, wrapper_library
from tests.helpers.fake_gpu_trace import fake_woq_graph, symbolic_m_woq_graph

OP = "qlower::woq_int8_cutlass"
MXFP4_OP = "qlower::mxfp4_cutlass"
LOWERING = "cutlass.woq_int8_w8a16"
GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="no g++")

# Every tuned shape, shapes no table holds (default_choice: stream-K and wide tiles), and M on both sides of
# each table's range ends and of default_choice's thresholds.
SHAPES = sorted(
    {nk for table in configs.TUNED.values() for nk in table} | {(11008, 4096), (4096, 4096), (8, 16)}
)
MS = (1, 2, 16, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 1024, 2047, 2048, 4096, 8192, 8193, 65536)
DEVICES = (*sorted(configs.TUNED), "NVIDIA H800", "")


def _compile(tmp_path: Path, files: dict[str, str], main: str, *flags: str) -> subprocess.CompletedProcess:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "main.cpp").write_text(main)
    return subprocess.run(
        [GXX, "-std=c++17", "-O0", f"-I{tmp_path}", *flags, str(tmp_path / "main.cpp")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )


@needs_gxx
def test_cpp_choice_matches_configs_choose(tmp_path):
    calls = [(d, m, n, k) for d in DEVICES for (n, k) in SHAPES for m in MS]
    body = "\n".join(f'  show(qlower_cutlass::choose("{d}", {m}, {n}, {k}));' for d, m, n, k in calls)
    main = (
        f'#include <cstdio>\n#include "{cpp_sources.CHOICES_HEADER}"\n'
        "static void show(qlower_cutlass::Choice c) {\n"
        '  std::printf("%s %d\\n", qlower_cutlass::kConfigNames[c.config], c.splits);\n}\n'
        f"int main() {{\n{body}\n  return 0;\n}}\n"
    )
    proc = _compile(
        tmp_path, {cpp_sources.CHOICES_HEADER: cpp_sources.choices_header()}, main, "-o", "choose"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = subprocess.run(
        [str(tmp_path / "choose")], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    got = run.stdout.splitlines()
    want = [f"{c.config} {c.splits}" for c in (configs.choose(m, n, k, d) for d, m, n, k in calls)]
    assert len(got) == len(want)
    wrong = [(call, g, w) for call, g, w in zip(calls, got, want, strict=True) if g != w]
    assert not wrong, wrong[:10]
    # the grid reaches table choices with split-K and default choices of both kinds
    assert {w.split()[1] for w in want} >= {"0", "4"} and any("streamk" in w for w in want)


def test_entry_points_follow_the_configurations():
    entries = cpp_sources.entries_header()
    order = [
        line.strip().removeprefix("&qlower_w8a16_sm90_").rstrip(",")
        for line in entries.splitlines()
        if line.strip().startswith("&")
    ]
    assert order == [c.name for c in configs.W8A16_CONFIGS]


@needs_gxx
def test_cpp_mxfp4_choice_matches_mxfp4_choose(tmp_path):
    from qlower.lowerings.kernels.cutlass import mxfp4

    calls = [
        (m, n, k) for (n, k) in [*SHAPES, (14336, 4096), (4096, 14336), (28672, 4096), (8, 128)] for m in MS
    ]
    body = "\n".join(f"  show(qlower_cutlass_mxfp4::choose({m}, {n}, {k}));" for m, n, k in calls)
    main = (
        f'#include <cstdio>\n#include "{cpp_sources.MXFP4_HEADER}"\n'
        "static void show(qlower_cutlass_mxfp4::Choice c) {\n"
        '  std::printf("%s %d\\n", qlower_cutlass_mxfp4::kConfigNames[c.config], c.splits);\n}\n'
        f"int main() {{\n{body}\n  return 0;\n}}\n"
    )
    # `choose` alone: no entry point is linked (`entry` is an inline function left unused)
    files = {name: text for name, text in cpp_sources.generated_files().items() if name.endswith(".h")}
    proc = _compile(tmp_path, files, main, "-o", "choose")
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = subprocess.run(
        [str(tmp_path / "choose")], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    got = run.stdout.splitlines()
    want = [f"{c.config} {c.splits}" for c in (mxfp4.choose(m, n, k) for m, n, k in calls)]
    wrong = [(call, g, w) for call, g, w in zip(calls, got, want, strict=True) if g != w]
    assert len(got) == len(want) and not wrong, wrong[:10]
    # the grid reaches both tile widths, stream-K with each split and the data-parallel tiles
    assert {w.split()[1] for w in want} >= {"0", "2", "4"}
    chosen = {w.split()[0] for w in want}
    assert chosen >= {c.name for c in configs.MXFP4_CONFIGS if c.tile_tokens < 256 and c.cluster_rows == 1}


@needs_gxx
@pytest.mark.parametrize("kernel", cpp_build.CUTLASS_KERNEL_SOURCES)
def test_kernel_compiles_against_torch_headers(tmp_path, kernel):
    """Each C++ kernel a CUTLASS shim calls compiles with torch's headers alone (no CUDA header), as the shim
    library's build compiles it."""
    from torch.utils.cpp_extension import include_paths

    files = cpp_build.kernel_only_sources([kernel])
    (source,) = [name for name in files if name.endswith(".cpp")]
    main = f'#include "{source}"\n'
    incs = [f"-I{p}" for p in include_paths()]
    proc = _compile(tmp_path, files, main, "-fsyntax-only", *incs)
    assert proc.returncode == 0, proc.stderr[-6000:]


def test_shims_are_declared_for_cuda_alone_and_built_apart():
    names = lambda device, **kw: {o.qualified for o in ops.ops_for_device(device, **kw)}  # noqa: E731
    for op in (OP, MXFP4_OP):
        assert op in names("cuda")
        assert op not in names("cuda", separate=False)  # the shared CUDA shim library leaves it out
        assert op not in names("cpu") and op not in names("xpu")
    plan = codegen.plan("cuda", ops.separate_library_ops("cuda"), direct_kernels=True)
    assert sorted(shim.symbol for shim in plan.shims) == [
        "aoti_torch_cuda_mxfp4_cutlass",
        "aoti_torch_cuda_woq_int8_cutlass",
    ]
    assert sorted(plan.kernel_sources) == sorted(cpp_build.CUTLASS_KERNEL_SOURCES)
    source = codegen.render_source(plan, "custom-ops")
    assert "return ::qlower::woq_int8_cutlass(x, w, scale, bias);" in source
    assert "return ::qlower::mxfp4_cutlass(x, w, scales, bias);" in source
    for shim in plan.shims:
        assert abi_lock.read()[shim.key] == shim.declaration  # locked: packages call it by this symbol


def test_library_build_says_why_without_objects(monkeypatch):
    monkeypatch.setattr(cutlass_build, "objects", lambda: "nvcc not found: `pip install 'qlower[cuda]'`")
    with pytest.raises(build.BuildError, match="no C shim for .*woq_int8_cutlass.*: nvcc not found"):
        build.separate_shim_library("cuda")


def test_shim_library_links_an_object_for_every_entry_the_shims_call(monkeypatch, tmp_path):
    """Both shims' kernels call their configurations' entry points through the generated headers (W8A16's and
    MXFP4's); the shim library links `objects()`, so it must name an object for each of them (without the MXFP4
    ones, the library failed to load on an sm_90 machine: an undefined `qlower_mxfp4_sm90_*`)."""
    import re

    called = set()
    for text in cpp_sources.generated_files().values():
        called |= set(re.findall(r'extern "C" int (qlower_\w+_sm90_\w+)\(', text))
    assert any(s.startswith("qlower_mxfp4_") for s in called) and any(
        s.startswith("qlower_w8a16_") for s in called
    )

    def entry_of(
        obj: Path,
    ) -> str:  # the symbol the object defines: csrc/cuda/*.cu with QLOWER_NAME = its config
        stem = obj.stem
        if stem.startswith(cutlass_build.MXFP4_OBJECT_PREFIX):
            return "qlower_mxfp4_sm90_" + stem[len(cutlass_build.MXFP4_OBJECT_PREFIX) :]
        return "qlower_w8a16_sm90_" + stem

    lib = tmp_path / cutlass_build.LIBRARY_NAME
    lib.write_bytes(b"")
    for obj in cutlass_build.object_paths(tmp_path):
        obj.write_bytes(b"")
    monkeypatch.setattr(cutlass_build, "library", lambda: lib)
    monkeypatch.setattr(cutlass_build, "cudart_link_flags", lambda tc=None: ["-l:libcudart.so.13"])
    objs = cutlass_build.objects()
    assert not isinstance(objs, str), objs
    assert {entry_of(o) for o in objs} == called


def test_library_links_the_cuda_runtime_by_soname(monkeypatch):
    """The objects call the CUDA runtime: the shim library and every wrapper linking its archive need
    `libcudart.so.<major>`, bound at load time to the runtime torch loaded (no path of this machine kept)."""
    objs = [Path("/cache/cutlass/cfg.o")]
    flags = ["-L/toolkit/lib64", "-l:libcudart.so.13"]
    monkeypatch.setattr(cutlass_build, "objects", lambda: objs)
    monkeypatch.setattr(cutlass_build, "cudart_link_flags", lambda: flags)
    calls = []

    def fake_build(name, files, extra_objects=(), link_flags=()):
        calls.append((name, sorted(files), extra_objects, link_flags))
        return cpp_build.Library(Path(f"/cache/lib{name}.so"), link_flags)

    monkeypatch.setattr(build, "build", fake_build)
    lib = build.separate_shim_library("cuda")
    ((name, files, extra_objects, link_flags),) = calls
    assert name == "qlower_aoti_shims_cuda_cutlass" and extra_objects == tuple(objs)
    assert link_flags == tuple(flags)
    assert {"qlower_kernel_woq_int8_cutlass.cpp", "qlower_kernel_mxfp4_cutlass.cpp"} <= set(files)
    assert lib.custom_op_libs_entry().endswith(" -L/toolkit/lib64 -l:libcudart.so.13")


def test_cudart_is_the_major_version_torch_runs(monkeypatch, tmp_path):
    tc = cutlass_build.toolchain()
    if isinstance(tc, str):
        pytest.skip(tc)
    lib = tmp_path / "lib64"
    lib.mkdir()
    (lib / "libcudart.so.13").write_bytes(b"")
    monkeypatch.setattr(cutlass_build, "_package_dirs", lambda name: [])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert cutlass_build.cudart_link_flags(tc)[-1] == "-l:libcudart.so.13"
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    why = cutlass_build.cudart_link_flags(tc)
    assert isinstance(why, str) and "libcudart.so.12 not found" in why


def _graph_calling_the_op_in_a_branch() -> fx.GraphModule:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qlower.lowerings.kernels.cutlass import w8a16  # noqa: F401  (registers the op)

    branch = fx.Graph()
    x, w, s = (branch.placeholder(n) for n in ("x", "w", "s"))
    call = branch.call_function(torch.ops.qlower.woq_int8_cutlass.default, (x, w, s, None))
    with FakeTensorMode():
        call.meta["val"] = torch.empty(4, 8, dtype=torch.bfloat16, device="cuda")
    branch.output(call)
    root = torch.nn.Module()
    root.branch = fx.GraphModule(torch.nn.Module(), branch)
    outer = fx.Graph()
    sub = outer.get_attr("branch")
    outer.output(sub)
    return fx.GraphModule(root, outer)


def test_emitted_ops_are_found_inside_subgraphs():
    gm = _graph_calling_the_op_in_a_branch()
    assert runtime._emitted(gm.graph) == {OP: {"cuda"}}


@pytest.mark.parametrize("op", [OP, MXFP4_OP])
def test_the_cutlass_library_is_linked_only_for_a_compile_that_calls_it(monkeypatch, op):
    built = []

    def fake_build(device: str) -> cpp_build.Library:
        built.append(device)
        return cpp_build.Library(Path("/cache/libqlower_aoti_shims_cuda_cutlass.so"))

    monkeypatch.setattr(build, "separate_shim_library", fake_build)
    overloads = [o.op_overload for o in ops.separate_library_ops("cuda")]
    shims = {o: ["decl"] for o in overloads}
    assert runtime._separate_libraries({"qlower::woq_int8_gemm": {"cuda"}}, shims) == []
    assert built == [] and all(o in shims for o in overloads)
    (entry,) = runtime._separate_libraries({op: {"cuda"}}, shims)
    assert entry.startswith(":libqlower_aoti_shims_cuda_cutlass.a ") and built == ["cuda"]
    # both ops called: one library
    (entry,) = runtime._separate_libraries({OP: {"cuda"}, MXFP4_OP: {"cuda"}}, shims)

    def failing(device: str) -> cpp_build.Library:
        raise build.BuildError("nvcc failed")

    monkeypatch.setattr(build, "separate_shim_library", failing)
    assert runtime._separate_libraries({op: {"cuda"}}, shims) == []
    called = ops.op_from_name(op).op_overload
    assert called not in shims  # the op goes to the proxy executor, never to an unlinked shim


# ------------------------------------------------------------------------- the choice under AOTInductor
@pytest.fixture
def objects(monkeypatch) -> list[Path]:
    """Pretend the library and its objects exist (decision tests never call them); no switch set."""
    monkeypatch.delenv("QLOWER_AOTI_CUTLASS", raising=False)
    objs = [Path("/nonexistent/w8a16_sm90_cfg.o")]
    monkeypatch.setattr(cutlass_build, "library", lambda: Path("/nonexistent/libqlower_cutlass_sm90.so"))
    monkeypatch.setattr(cutlass_build, "objects", lambda: objs)
    return objs


def _decide_cpp_wrapper(gm: fx.GraphModule) -> qlower.Report:
    from torch._inductor import config as inductor_config

    with (
        override_cuda_capability((9, 0)),
        inductor_config.patch({"cpp_wrapper": True, "triton.cudagraphs": False}),
    ):
        return apply_pass(gm)


def test_static_m_in_range_takes_cutlass_in_a_cpp_wrapper_compile(objects):
    report = _decide_cpp_wrapper(fake_woq_graph("cuda", m=CUTLASS_W8A16_M_RANGE[0], k=4096, n=1024))
    assert report.entries[0].lowering == LOWERING, report.table()


def test_without_objects_the_package_keeps_another_kernel_and_says_why(objects, monkeypatch):
    monkeypatch.setattr(cutlass_build, "objects", lambda: "nvcc not found")
    report = _decide_cpp_wrapper(fake_woq_graph("cuda", m=CUTLASS_W8A16_M_RANGE[0], k=4096, n=1024))
    entry = report.entries[0]
    assert entry.lowering != LOWERING, report.table()
    why = dict(entry.passed_over)[LOWERING]
    assert "AOTInductor" in why and "nvcc not found" in why, why


def test_the_switch_off_keeps_packages_on_the_triton_kernels(objects, monkeypatch):
    monkeypatch.setenv("QLOWER_AOTI_CUTLASS", "0")
    report = _decide_cpp_wrapper(fake_woq_graph("cuda", m=CUTLASS_W8A16_M_RANGE[0], k=4096, n=1024))
    entry = report.entries[0]
    assert entry.lowering != LOWERING, report.table()
    assert "QLOWER_AOTI_CUTLASS=0" in dict(entry.passed_over)[LOWERING]


def test_symbolic_m_takes_cutlass_in_a_cpp_wrapper_compile_without_cuda_graphs(objects):
    """The branch on M is a C++ `if` in the wrapper: no Python host branch to avoid."""
    report = _decide_cpp_wrapper(symbolic_m_woq_graph(k=4096, n=1024))
    assert report.entries[0].lowering == LOWERING, report.table()


# --------------------------------------------------------------------------------------------- GPU
K_GPU, N_GPU = 2048, 1024


def _sm90_objects() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA"
    if torch.cuda.get_device_capability() != (9, 0):
        return "not sm_90"
    objs = cutlass_build.objects()
    return objs if isinstance(objs, str) else None


def _bound(x: torch.Tensor, model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 result and the error allowed per element: one rounding of the output plus fp32
    accumulation over K."""
    w, s, b = model.weight.double(), model.scales.double(), model.bias.double()
    ref = (x.double() @ w.t()) * s + b
    mag = (x.double().abs() @ w.abs().t()) * s.abs() + b.abs()
    eps = torch.finfo(x.dtype).eps
    return ref, mag * (eps + x.shape[1] * 2.0**-23) + 1e-30


def _run_without_qlower(
    moved, lowering: str, shim: str, tmp_path: Path
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The package's one linear took `lowering` and calls `shim` (never the proxy executor, no qlower file
    linked): its inputs and outputs, run in a fresh process where qlower cannot be imported."""
    (row,) = moved.report.lowered
    assert row.lowering == lowering, moved.report.table()
    assert f"{shim}(" in moved.wrapper
    assert "aoti_torch_proxy_executor_call_function" not in moved.wrapper
    assert "qlower" not in elf(["readelf", "-d"], wrapper_library(moved, tmp_path))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    outs = run_fresh(moved, run_script("qlower_blocked"), run_dir)
    xs = torch.load(moved.folder / "io.pt")["x"]
    return list(zip(xs, outs, strict=True))


@pytest.mark.gpu
@needs_cuda_package_load
@pytest.mark.parametrize("dynamic", [False, True], ids=["static_m", "dim_batch"])
def test_package_calls_the_cutlass_shim_and_runs_without_qlower(dynamic, tmp_path, monkeypatch):
    monkeypatch.delenv("QLOWER_AOTI_CUTLASS", raising=False)
    why = _sm90_objects()
    if why:
        pytest.skip(why)
    from qlower.quantize import WeightOnlyInt8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(K_GPU, N_GPU).to(torch.bfloat16)
    model = WeightOnlyInt8Linear.from_linear(linear).cuda().eval()
    m = 512 if not dynamic else 300
    root = tmp_path / "export_root"
    root.mkdir()
    moved = export_and_move(
        model, torch.randn(m, K_GPU, dtype=torch.bfloat16, device="cuda"), root, dynamic=dynamic
    )
    for x, got in _run_without_qlower(moved, LOWERING, "aoti_torch_cuda_woq_int8_cutlass", tmp_path):
        ref, bound = _bound(x, model)
        err = (got.double() - ref).abs()
        assert got.shape == ref.shape and bool((err <= bound).all()), (x.shape[0], float((err - bound).max()))


class _Mxfp4Linear(torch.nn.Module):
    """MXFP4 weight-only linear as users write it: the spec decode, then F.linear (bf16 x)."""

    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        from qlower.patterns import mx_format as fmt

        g = torch.Generator().manual_seed(0)
        q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, "e2m1")
        self.register_buffer("q", q)
        self.register_buffer("e", e)
        self.register_buffer("bias", torch.randn(n, generator=g).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from qlower.patterns import mx_format as fmt

        return torch.nn.functional.linear(x, fmt.dequantize(self.q, self.e, "e2m1", x.dtype), self.bias)


@pytest.mark.gpu
@needs_cuda_package_load
@pytest.mark.parametrize("dynamic", [False, True], ids=["static_m", "dim_batch"])
def test_package_calls_the_mxfp4_shim_and_runs_without_qlower(dynamic, tmp_path, monkeypatch):
    """The MXFP4 GEMM from a package: a static M in its range, and a `Dim` batch run below, inside and above the
    range (host-branch leaves: Triton, the shim, dequantize + cuBLAS), each within one bf16 rounding of the
    weight and one of the output plus fp32 accumulation, against float64."""
    from qlower.lowerings.devices.crossovers import CUTLASS_MXFP4_M_RANGE
    from qlower.patterns import mx_format as fmt

    monkeypatch.delenv("QLOWER_AOTI_CUTLASS", raising=False)
    why = _sm90_objects()
    if why:
        pytest.skip(why)
    model = _Mxfp4Linear(N_GPU, K_GPU).cuda().eval()
    lo, hi = CUTLASS_MXFP4_M_RANGE
    root = tmp_path / "export_root"
    root.mkdir()
    x = torch.randn(lo if not dynamic else 300, K_GPU, dtype=torch.bfloat16, device="cuda")
    moved = export_and_move(model, x, root, dynamic=dynamic, sizes=(1, lo, hi, hi + 1))
    wd = fmt.dequantize_f64(model.q, model.e, "e2m1").to(torch.bfloat16).double()
    for x, got in _run_without_qlower(
        moved, "cutlass.mxfp4_weight_only", "aoti_torch_cuda_mxfp4_cutlass", tmp_path
    ):
        ref = x.double() @ wd.t() + model.bias.double()
        mag = x.double().abs() @ wd.abs().t() + model.bias.double().abs()
        bound = mag * (2.0**-7 + K_GPU * 2.0**-23) + 1e-30
        err = (got.double() - ref).abs()
        assert got.shape == ref.shape and bool((err <= bound).all()), (x.shape[0], float((err - bound).max()))
