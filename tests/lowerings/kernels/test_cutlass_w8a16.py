"""qlower's CUTLASS W8A16 GEMM (lowerings/kernels/cutlass/, csrc/cuda/w8a16_sm90.cu).

On any machine: which records the CUTLASS lowering takes, and why it declines the rest (traced graphs on fake
CUDA tensors, capability pinned); the toolchain-missing reason; nvcc compiling the source for sm_90a where the
`qlower[cuda]` extra is installed. On an sm_90 GPU (gpu): every configuration against float64, special values
included, and a compiled model whose report, generated code and numbers show the kernel.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import qlower
from qlower.lowerings.devices.cuda import override_cuda_capability
from qlower.lowerings.kernels.cutlass import build, configs
from qlower.testing import apply_pass, graph_summary
from tests.helpers.fake_gpu_trace import fake_woq_graph, symbolic_m_woq_graph

BF16 = torch.bfloat16
LOWERING = "cutlass.woq_int8_w8a16"


@pytest.fixture
def built(monkeypatch):
    """Pretend the library exists (decision tests never call it)."""
    build.library.cache_clear()
    monkeypatch.setattr(build, "library", lambda: Path("/nonexistent/libqlower_cutlass_sm90.so"))


def _decide(m: int, k: int = 4096, n: int = 1024, capability=(9, 0), **kw) -> qlower.Report:
    gm = fake_woq_graph("cuda", m=m, k=k, n=n, **kw)
    with override_cuda_capability(capability):
        report = apply_pass(gm)
    report.graph = graph_summary(gm)  # type: ignore[attr-defined]
    return report


def test_auto_takes_cutlass_for_static_m_in_its_range(built):
    lo, hi = qlower.lowerings.devices.crossovers.CUTLASS_W8A16_M_RANGE
    report = _decide(m=lo)
    assert report.entries[0].lowering == LOWERING, report.table()
    assert "= qlower.woq_int8_cutlass(x_1, w_1, " in report.graph, report.graph
    for m in (lo - 1, hi + 1):
        other = _decide(m=m)
        assert other.entries[0].lowering != LOWERING, other.table()
        assert "measured range" in dict(other.entries[0].passed_over)[LOWERING]


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"capability": (10, 0)}, "capability 9.0 only"),
        ({"capability": (8, 0)}, "capability 9.0 only"),
        ({"k": 24}, "K % 16 == 0"),
        ({"n": 20}, "N % 8 == 0"),
        ({"dtype": torch.float32}, "activation dtype torch.float32"),
    ],
)
def test_cutlass_declines_with_its_reason(built, kw, reason):
    report = _decide(m=512, **kw)
    assert report.entries[0].lowering != LOWERING, report.table()
    why = dict(report.entries[0].passed_over).get(LOWERING, "")
    assert reason in why, report.table()


def test_library_is_built_only_for_a_choice_that_takes_it(monkeypatch):
    """An M that AUTO leaves to Triton never starts the nvcc build (minutes on a first compile)."""
    build.library.cache_clear()

    def no_build():
        raise AssertionError("the CUTLASS library was built for a record it does not serve")

    monkeypatch.setattr(build, "library", no_build)
    lo, _ = qlower.lowerings.devices.crossovers.CUTLASS_W8A16_M_RANGE
    for m in (1, lo - 1):
        report = _decide(m=m)
        assert report.entries[0].lowering != LOWERING, report.table()


def test_missing_toolchain_is_the_reason_and_triton_serves(monkeypatch):
    build.library.cache_clear()
    monkeypatch.setenv("QLOWER_NVCC", "/nonexistent/nvcc")
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    try:
        report = _decide(m=512)
    finally:
        build.library.cache_clear()
    assert report.entries[0].lowering == "dequant_mm", report.table()
    why = dict(report.entries[0].passed_over)[LOWERING]
    assert "nvcc" in why and "qlower[cuda]" in why, why


def test_symbolic_m_takes_cutlass_under_cuda_graphs_only(built):
    from torch._inductor import config as inductor_config

    def decide(cudagraphs: bool) -> qlower.Report:
        gm = symbolic_m_woq_graph(k=4096, n=1024)
        with override_cuda_capability((9, 0)), inductor_config.patch({"triton.cudagraphs": cudagraphs}):
            return apply_pass(gm)

    assert decide(True).entries[0].lowering == LOWERING, decide(True).table()
    without = decide(False).entries[0]
    assert without.lowering != LOWERING and "without CUDA graphs" in dict(without.passed_over)[LOWERING]


def test_every_configuration_has_a_unique_entry_point_name():
    names = [c.name for c in configs.W8A16_CONFIGS]
    assert len(set(names)) == len(names)
    for c in configs.W8A16_CONFIGS:
        assert configs.BY_NAME[c.name] == c
    for device, table in configs.TUNED.items():
        for (n, k), ranges in table.items():
            assert all(choice.config in configs.BY_NAME for _, choice in ranges), (device, n, k)


def test_each_gpu_reads_its_own_table_and_others_the_fallback():
    """The H100's and the H200's tables differ where they measured different winners; an unmeasured sm_90 GPU
    reads the fallback device's; a shape no table holds gets `default_choice`."""
    assert {"NVIDIA H100 80GB HBM3", configs.FALLBACK_DEVICE} <= set(configs.TUNED)
    h100, h200 = configs.TUNED["NVIDIA H100 80GB HBM3"], configs.TUNED[configs.FALLBACK_DEVICE]
    differ = [
        (shape, m)
        for shape, ranges in h100.items()
        for m, choice in ranges
        if configs.choose(m, shape[0], shape[1], "NVIDIA H100 80GB HBM3")
        != configs.choose(m, shape[0], shape[1], configs.FALLBACK_DEVICE)
    ]
    assert differ, "the two tables hold the same choices: one file would do"
    (n, k), _ = next(iter(h200.items()))
    assert configs.choose(512, n, k, "NVIDIA H800") == configs.choose(512, n, k, configs.FALLBACK_DEVICE)
    assert configs.choose(512, 24, 48, "NVIDIA H100 80GB HBM3") == configs.default_choice(512, 24, 48)


def test_default_choice_uses_stream_k_where_tiles_cannot_fill_the_gpu():
    assert configs.BY_NAME[configs.default_choice(256, 4096, 14336).config].stream_k
    assert not configs.BY_NAME[configs.default_choice(4096, 14336, 4096).config].stream_k


@pytest.mark.skipif(
    isinstance(build.toolchain(), str), reason="no nvcc / CUTLASS (pip install 'qlower[cuda]')"
)
def test_nvcc_compiles_the_source_for_sm90a(tmp_path):
    """The W8A16 source compiles for sm_90a without a GPU (one configuration, both dtypes: the cooperative
    stream-K one; every configuration is built on the GPU machine) and exports that configuration's entry point."""
    tc = build.toolchain()
    (cfg,) = [c for c in configs.W8A16_CONFIGS if c.stream_k][:1]
    (obj,) = build._compile_all(tc, (cfg,), tmp_path, jobs=1)
    assert f"qlower_w8a16_sm90_{cfg.name}".encode() in obj.read_bytes()


# --------------------------------------------------------------------------------------------- GPU
def _sm90() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA"
    if torch.cuda.get_device_capability() != (9, 0):
        return "not sm_90"
    lib = build.library()
    return lib if isinstance(lib, str) else None


@pytest.fixture
def sm90() -> None:
    """Skip unless on an sm_90 GPU with the library (built here at first use)."""
    why = _sm90()
    if why:
        pytest.skip(why)


def _bound(x, w, s, dtype) -> torch.Tensor:
    """|out - ref| allowed per element: one rounding to `dtype` plus fp32 accumulation over K."""
    eps = torch.finfo(dtype).eps
    mag = (x.double().abs() @ w.double().abs().t()) * s.double().abs()
    return mag * (eps + x.shape[1] * 2.0**-23) + 1e-30


def _reference(x, w, s, b=None) -> torch.Tensor:
    ref = (x.double() @ w.double().t()) * s.double().reshape(1, -1)
    return ref if b is None else ref + b.double()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", [c.name for c in configs.W8A16_CONFIGS])
def test_every_configuration_matches_float64(sm90, name, dtype):
    from qlower.lowerings.kernels.cutlass import w8a16

    splits = (0, 3) if configs.BY_NAME[name].stream_k else (0,)
    torch.manual_seed(0)
    for m, n, k in ((1, 8, 16), (3, 136, 80), (257, 264, 1024), (300, 1024, 4096)):
        x = torch.randn(m, k, dtype=dtype, device="cuda")
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
        for s in (
            torch.rand(n, dtype=dtype, device="cuda") / 32,
            torch.full((1,), 0.03, dtype=dtype, device="cuda"),
        ):
            for b in (None, torch.randn(n, dtype=dtype, device="cuda")):
                for sp in splits:
                    out = torch.empty(m, n, dtype=dtype, device="cuda")
                    w8a16.launch(x, w, s, b, out, configs.Choice(name, sp))
                    ref = _reference(x, w, s, b)
                    err = (out.double() - ref).abs()
                    bound = _bound(x, w, s.expand(n), dtype) + (
                        0 if b is None else b.double().abs() * torch.finfo(dtype).eps
                    )
                    assert bool((err <= bound).all()), (name, m, n, k, sp, err.max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("name", [c.name for c in configs.W8A16_CONFIGS])
def test_special_values_propagate_like_float64(sm90, name):
    """inf and NaN in x: NaN and inf land where the float64 reference has them (inf * 0 = NaN, inf - inf)."""
    from qlower.lowerings.kernels.cutlass import w8a16

    m, n, k = 64, 128, 256
    torch.manual_seed(1)
    x = torch.randn(m, k, dtype=BF16, device="cuda")
    x[3, 5], x[7, 9], x[9, 0], x[9, 1], x[11, 2] = (
        float("inf"),
        float("nan"),
        float("inf"),
        float("-inf"),
        float("-inf"),
    )
    w = torch.randint(-3, 4, (n, k), dtype=torch.int8, device="cuda")
    s = torch.rand(n, dtype=BF16, device="cuda")
    out = torch.empty(m, n, dtype=BF16, device="cuda")
    w8a16.launch(x, w, s, None, out, configs.Choice(name, 0))
    ref = _reference(x, w, s)
    assert torch.equal(out.isnan().cpu(), ref.isnan().cpu())
    assert torch.equal(out.isinf().cpu(), ref.isinf().cpu())
    assert torch.equal(out[out.isinf()].sign().cpu(), ref[ref.isinf()].sign().float().cpu().to(BF16))
    finite = ref.isfinite()
    assert bool(
        ((out.double() - ref).abs()[finite] <= _bound(x.nan_to_num(0, 0, 0), w, s, BF16)[finite] * 2).all()
    )


@pytest.mark.gpu
def test_op_takes_strided_x(sm90):
    m, n, k = 300, 256, 512
    base = torch.randn(m, k + 64, dtype=BF16, device="cuda")
    x = base[:, 32 : 32 + k]  # row stride k + 64, 64-byte offset
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    s = torch.rand(n, dtype=BF16, device="cuda") / 16
    out = torch.ops.qlower.woq_int8_cutlass(x, w, s, None)
    err = (out.double() - _reference(x, w, s)).abs()
    assert bool((err <= _bound(x, w, s, BF16)).all())


@pytest.mark.gpu
def test_compiled_model_runs_cutlass_for_prefill(sm90):
    """torch.compile with qlower's options at a static M = 512: the report names the CUTLASS lowering, the
    generated code calls the op, and the output is within the float64 bound."""
    torch.manual_seed(0)
    m, n, k = 512, 1024, 2048
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    s = torch.rand(n, dtype=BF16, device="cuda") / 64
    b = torch.randn(n, dtype=BF16, device="cuda")

    def f(x):
        return torch.nn.functional.linear(x, w.to(x.dtype)) * s + b

    x = torch.randn(m, k, dtype=BF16, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(f, options=qlower.inductor_options())
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    with inductor_config.patch(force_disable_caches=True):
        out, code = run_and_get_code(compiled, x)
    report = qlower.last_report()
    assert [e.lowering for e in report.lowered] == [LOWERING], report.table()
    assert "qlower.woq_int8_cutlass" in "\n".join(code)
    ref = _reference(x, w, s, b)
    bound = _bound(x, w, s, BF16) * 2 + ref.abs() * 2**-8
    assert bool(((out.double() - ref).abs() <= bound).all())


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["reduce-overhead"])
def test_symbolic_m_runs_triton_below_and_cutlass_above(sm90, mode):
    """A symbolic M under CUDA graphs (AUTO): qlower's Triton op with the CUTLASS GEMM as its branch above
    M = 127 (launches gated by M; the GEMM runs inside `qlower::woq_int8_dense_gated`, its last argument
    `cutlass` True); every M within the float64 bound."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    n, k = 1024, 2048
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda")
    s = torch.rand(n, dtype=BF16, device="cuda") / 64

    def f(x):
        return torch.nn.functional.linear(x, w.to(x.dtype)) * s

    torch._dynamo.reset()
    compiled = torch.compile(f, options=qlower.inductor_options(mode=mode))
    with inductor_config.patch(force_disable_caches=True):
        for i, m in enumerate((3, 100, 300, 600, 129, 128)):
            x = torch.randn(m, k, dtype=BF16, device="cuda")
            if i == 0:
                torch._dynamo.mark_dynamic(x, 0)
                out, code = run_and_get_code(compiled, x)
                gated = re.findall(r"woq_int8_dense_gated\.default\((.*)\)", "\n".join(code))
                assert gated and all(call.rstrip().endswith("True") for call in gated), gated
                assert [e.lowering for e in qlower.last_report().lowered] == [LOWERING], (
                    qlower.last_report().table()
                )
            else:
                out = compiled(x).clone()
            ref = _reference(x, w, s)
            assert bool(
                ((out.double() - ref).abs() <= _bound(x, w, s, BF16) * 2 + ref.abs() * 2**-8).all()
            ), m


def _fake_toolchain(tmp_path: Path) -> build.Toolchain:
    return build.Toolchain(Path("/bin/true"), (tmp_path / "include",))


def test_build_folder_ignores_the_aoti_shim_source(tmp_path):
    """The nvcc objects depend on the .cu and .h files alone: the C++ of the AOTInductor shims beside them
    (csrc/cuda/woq_int8_cutlass.cpp, mxfp4_cutlass.cpp, their cutlass_host.h) is not part of their digest, so a copy that lacks it or edits it
    finds the same build."""
    tc = _fake_toolchain(tmp_path)
    names = {p.name for p in build.CUDA_SRC.iterdir()}
    assert "woq_int8_cutlass.cpp" in names and "w8a16_sm90.cu" in names
    digest = build._digest(tc, configs.W8A16_CONFIGS)
    real_read = Path.read_bytes

    def edited(path: Path) -> bytes:
        data = real_read(path)
        return data + b"// edited" if path.suffix == ".cpp" or path.name in build.SHIM_ONLY_HEADERS else data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "read_bytes", edited)
        assert build._digest(tc, configs.W8A16_CONFIGS) == digest
        mp.setattr(Path, "read_bytes", lambda p: real_read(p) + (b"// edited" if p.suffix == ".cu" else b""))
        assert build._digest(tc, configs.W8A16_CONFIGS) != digest


def test_concurrent_first_uses_build_once(tmp_path, monkeypatch):
    """Processes (here threads, each with its own lock file handle) that find no build wait for the one
    building, then load its library: one set of nvcc jobs, not one per process."""
    import threading
    import time

    monkeypatch.setenv("QLOWER_CACHE_DIR", str(tmp_path / "cache"))
    tc = _fake_toolchain(tmp_path)
    built = []

    def fake_build(tc, cfgs, mxfp4_cfgs, folder, jobs, log):
        built.append(folder)
        time.sleep(0.5)
        folder.mkdir(parents=True)
        (folder / build.LIBRARY_NAME).write_bytes(b"")
        return folder / build.LIBRARY_NAME

    monkeypatch.setattr(build, "_build_locked", fake_build)
    results = []
    threads = [threading.Thread(target=lambda: results.append(build.build(tc))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 1 and len(results) == 3 and len(set(results)) == 1 and results[0].exists()


@pytest.mark.parametrize("m", [128, 512, 4096])
def test_report_names_the_configuration_a_static_m_runs(built, m):
    """The report's why ends with the tuned table's choice for this M and shape (a fake trace: the fallback
    GPU's table)."""
    report = _decide(m=m, k=4096, n=14336)
    row = report.entries[0]
    assert row.lowering == LOWERING, report.table()
    choice = configs.choose(m, 14336, 4096, configs.FALLBACK_DEVICE)
    split = f", split-K {choice.splits}" if choice.splits else ""
    assert row.why.endswith(f"[configuration {choice.config}{split} ({configs.FALLBACK_DEVICE}'s table)]"), (
        row.why
    )


def test_report_says_a_symbolic_m_chooses_per_call(built):
    from torch._inductor import config as inductor_config

    gm = symbolic_m_woq_graph(k=4096, n=1024)
    with override_cuda_capability((9, 0)), inductor_config.patch({"triton.cudagraphs": True}):
        row = apply_pass(gm).entries[0]
    assert row.lowering == LOWERING and "configuration chosen per call by M" in row.why, row.why


def test_gated_op_outside_its_range_is_the_bias_alone():
    """`woq_int8_dense_gated` at gate 0 (M outside the range) returns the bias (or zeros) for the Triton launches
    to overwrite, without calling a GEMM (no GPU needed)."""
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401  (registers the op)

    x = torch.randn(5, 64, dtype=BF16)
    w = torch.randint(-128, 128, (24, 64), dtype=torch.int8)
    s = torch.rand(24, dtype=BF16)
    b = torch.randn(24, dtype=BF16)
    out = torch.ops.qlower.woq_int8_dense_gated(x, w, s, b, 0, 0, True)
    assert torch.equal(out, b.expand(5, 24))
    assert torch.equal(
        torch.ops.qlower.woq_int8_dense_gated(x, w, s, None, 0, 0, False), torch.zeros(5, 24, dtype=BF16)
    )


def test_symbolic_m_under_cuda_graphs_hands_the_gate_to_the_op(built):
    """A symbolic M under CUDA graphs in Python's wrapper: the GEMM's range runs through the gated op, which takes
    x and the weight whole (no view of them sized by the gate, which Inductor copies with kernels configured at
    the compile's hint, where the gate is 0)."""
    from torch._inductor import config as inductor_config

    gm = symbolic_m_woq_graph(k=4096, n=14336)
    with override_cuda_capability((9, 0)), inductor_config.patch({"triton.cudagraphs": True}):
        report = apply_pass(gm)
    assert report.entries[0].lowering == LOWERING, report.table()
    (gated,) = [n for n in gm.graph.nodes if n.target is torch.ops.qlower.woq_int8_dense_gated.default]
    x, w = gated.args[0], gated.args[1]
    assert [n.target for n in (x, w) if n.op == "call_function"] == [], (x.target, w.target)
    assert not [n for n in gm.graph.nodes if n.target is torch.ops.qlower.woq_int8_cutlass.default]
