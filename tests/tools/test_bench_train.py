"""scripts/bench_train.py on CPU: the MX model is the bf16 model with torchao's MXFP8Linear in every linear, and
an eager run writes its row (the compiled variants are timed on the GPU; their CPU smoke is a few minutes)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torchao") is None, reason="torchao is not installed"
)


def _load():
    from scripts import bench_train  # after the skip: it needs torchao

    return bench_train


def test_mx_model_is_the_bf16_model_with_mx_linears():
    bt = _load()
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear

    bf16, mx = (bt.build(bt.SMALL, 16, "cpu", mx=flag) for flag in (False, True))
    swapped = [m for m in mx.modules() if isinstance(m, MXFP8Linear)]
    assert len(swapped) == 4 * bt.SMALL.layers
    for (name, p), (name_mx, p_mx) in zip(bf16.named_parameters(), mx.named_parameters(), strict=True):
        assert name == name_mx and p.dtype == p_mx.dtype == torch.bfloat16 and torch.equal(p, p_mx), name


def test_eager_mx_run_writes_its_row(tmp_path: Path):
    bt = _load()
    argv = ["--device", "cpu", "--variants", "mx:eager", "--steps", "4", "--out", str(tmp_path)]
    assert bt.main(argv) == 0
    data = json.loads((tmp_path / "train_cpu.json").read_text())
    (row,) = data["rows"]
    assert row["variant"] == "mx:eager" and row["step_s"] > 0 and math.isfinite(row["loss"]), row
    assert row["compile_s"] is None and row["note"] == "", row
    assert data["meta"]["steps"] == 4 and data["meta"]["config"]["dim"] == bt.SMALL.dim
    assert "| mx:eager |" in (tmp_path / "train_cpu.md").read_text()
