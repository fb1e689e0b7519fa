"""torchao's quantized linears under `torch.export` with `Dim`s, as AOTInductor compiles them: lowered as under
`torch.compile`, the numbers those of eager.

`torch.export` keeps an `aten._assert_tensor_metadata` node after each `.to(...)`; torchao's dynamic int8 has
them on its int matmul and rescale, where they were extra users that stopped the recognizer's epilogue walk
(0 of 1 lowered, "no per-token activation scale"; `passes/canonicalize.py: drop_metadata_asserts`).

Light: the graph is the one `aoti_compile_and_package` hands qlower's pass, taken there and run by the FX
interpreter at several M (no C++ compile). A full package of the same model (bf16, Dim("batch")) gave
relative errors 0.0056 / 0.0074 / 0.0067 against eager at M = 1 / 5 / 70 (torch 2.13 CPU).
"""

from __future__ import annotations

import pytest
import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.export import Dim

import qlower

ao = pytest.importorskip("torchao.quantization")
intmm = pytest.importorskip("torchao.kernel.intmm")

K, N = 256, 256
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-5}  # as test_torchao_dynamic_int8.py


class _Stop(Exception):
    """Raised by the capturing pass once qlower's pass has run: the C++ compile is not needed here."""


_CAPTURED: list[torch.fx.GraphModule] = []  # module-level: Inductor copies the options dict and its passes


class _RunQlowerThenStop(CustomGraphPass):
    def __call__(self, graph: torch.fx.Graph) -> None:
        qlower.inductor_options()["joint_custom_pre_pass"](graph)
        graph.owning_module.recompile()
        _CAPTURED.append(graph.owning_module)
        raise _Stop

    def uuid(self) -> None:  # never cached: the pass must run
        return None


def aoti_graph(model: torch.nn.Module, x: torch.Tensor, dims: dict[int, Dim]) -> torch.fx.GraphModule:
    """The graph AOTInductor's compile of `model` exported with `dims` hands qlower's pass, after the pass."""
    ep = torch.export.export(model, (x,), dynamic_shapes=(dims,))
    options = dict(qlower.inductor_options(), joint_custom_pre_pass=_RunQlowerThenStop())
    _CAPTURED.clear()
    with pytest.raises(_Stop):
        torch._inductor.aoti_compile_and_package(ep, inductor_configs=options)
    (gm,) = _CAPTURED
    return gm


def _run(gm: torch.fx.GraphModule, x: torch.Tensor) -> torch.Tensor:
    out = torch.fx.Interpreter(gm).run(x)
    return out[0] if isinstance(out, (tuple, list)) else out


def _exact_eager(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Eager, its int8 matmul exact in float64 (the reference must not depend on this CPU's `_int_mm`)."""

    def exact_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.to(torch.float64) @ b.to(torch.float64)).to(torch.int32)  # |sum| < 2^53: exact

    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(torch, "_int_mm", exact_int_mm)
        return model(x)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _quantized(config: object, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, N)).to(dtype)
    ao.quantize_(model, config)
    return model


SHAPES = {  # example input, its Dims, the inputs the exported graph then runs
    "2d_batch": ((8, K), {0: Dim("batch", min=1, max=4096)}, [(1, K), (5, K), (70, K)]),
    "3d_batch_seq": (
        (2, 8, K),
        {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=1024)},
        [(1, 1, K), (3, 5, K), (2, 35, K)],
    ),
}


def _check(model: torch.nn.Module, dtype: torch.dtype, shape: str, family: str) -> None:
    example, dims, runs = SHAPES[shape]
    gm = aoti_graph(model, torch.randn(*example, dtype=dtype), dims)
    report = qlower.last_report()
    assert [d.family for d in report.lowered] == [family] and len(report) == 1, report.table(full=True)
    assert not isinstance(report.entries[0].shape[0], int), report.table()  # M stays symbolic
    for run in runs:
        x = torch.randn(*run, dtype=dtype)
        with torch.no_grad():
            out, ref = _run(gm, x), _exact_eager(model, x)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert _rel(out, ref) < TOL[dtype], (run, _rel(out, ref), report.table())


@pytest.mark.parametrize("shape, branch", [("2d_batch", "s8s8"), ("3d_batch_seq", "u8s8")])
def test_torchao_dynamic_int8_export_dims_lowered(monkeypatch, shape, branch):
    """Both of torchao's CPU graph forms (s8s8; u8s8 on VNNI CPUs without AMX), forced either way."""
    monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: branch == "u8s8")
    monkeypatch.setattr(intmm, "_cpu_is_amx_tile_supported", lambda: False)
    model = _quantized(ao.Int8DynamicActivationInt8WeightConfig(), torch.bfloat16)
    _check(model, torch.bfloat16, shape, "dynamic_int8")


def test_torchao_dynamic_int8_export_fp16():
    model = _quantized(ao.Int8DynamicActivationInt8WeightConfig(), torch.float16)
    _check(model, torch.float16, "2d_batch", "dynamic_int8")


def test_torchao_woq_int8_export_dims_lowered():
    model = _quantized(ao.Int8WeightOnlyConfig(), torch.bfloat16)
    _check(model, torch.bfloat16, "3d_batch_seq", "woq_int8")


def test_torchao_mx_export_dims_lowered():
    """torchao's MXFP8 (EMULATED kernel preference: what exports on a CPU) under a Dim batch."""
    pytest.importorskip("torchao.prototype.mx_formats")
    from tests.forms.mx import torchao_mx_model

    model = torchao_mx_model("e4m3", bias=True, mode="RCEIL", k=64, n=48)
    gm = aoti_graph(model, torch.randn(8, 64, dtype=torch.bfloat16), {0: Dim("batch", min=1, max=4096)})
    report = qlower.last_report()
    assert [d.family for d in report.lowered] == ["mx"], report.table(full=True)
    for m in (1, 5, 70):
        x = torch.randn(m, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            out, ref = _run(gm, x), model(x)
        assert _rel(out, ref) < 1e-2, (m, _rel(out, ref))
