"""scripts/bench_hf.py end to end on a one-layer toy Llama: three flows, the table, tokens equal to eager's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

pytest.importorskip("transformers")
pytest.importorskip("torchao")


@pytest.mark.slow
def test_tiny_generate_rows_for_every_flow(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench_hf", "--tiny", "--new-tokens", "3", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "hf_cpu.json").read_text())
    rows = {r["flow"]: r for r in data["rows"]}
    assert set(rows) == {"bf16", "stock", "qlower"}
    for row in rows.values():
        assert row["tokens_equal"] == 3, row  # every greedy token equals eager's from the same model
        assert row["first_call_s"] > 0 and row["decode_ms"] == row["decode_ms"]  # measured (not NaN)
    done, total = (int(v) for v in rows["qlower"]["lowered"].split("/"))
    assert total > 0 and done == total, rows["qlower"]  # every linear of the prefill and decode graphs
    table = (tmp_path / "hf_cpu.md").read_text()
    assert "| llama | woq_int8 | dynamic | qlower |" in table, table


@pytest.mark.parametrize("flow", ["bf16", "qlower"])
def test_guard_filter_reaches_every_flows_compile(flow: str) -> None:
    """`--guards skip-nn-modules` hands torch's filter to the flow's compile, bf16's included (the static cache's
    CompileConfig keeps its CUDA graphs setting on CUDA); the default leaves the options as they were."""
    import torch

    from scripts import bench_hf

    model = bench_hf.build("llama", bench_hf.TINY, "cpu")
    filtered = bench_hf.prepare(model, flow, "static", "cpu", guards="skip-nn-modules")
    options = filtered.generation_config.compile_config.options
    assert options["guard_filter_fn"] is torch.compiler.skip_guard_on_all_nn_modules_unsafe
    if flow == "qlower":
        assert options["joint_custom_pre_pass"] is not None  # qlower's options kept
    default = bench_hf.prepare(model, flow, "static", "cpu")
    assert "guard_filter_fn" not in (default.generation_config.compile_config.options or {})


def test_layers_override_the_configs_depth_only() -> None:
    """`--layers 32` builds Llama-3-8B's depth from the GPU config; every other dimension stays the config's."""
    from scripts import bench_hf

    full = bench_hf.model_dims(bench_hf.parse_args(["--device", "cuda", "--layers", "32"]))
    assert full == {**bench_hf.FULL, "num_hidden_layers": 32}
    assert bench_hf.model_dims(bench_hf.parse_args(["--tiny"])) == bench_hf.TINY
    model = bench_hf.build(
        "llama", bench_hf.model_dims(bench_hf.parse_args(["--tiny", "--layers", "2"])), "cpu"
    )
    assert len(model.model.layers) == 2
