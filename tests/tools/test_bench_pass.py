"""scripts/bench_pass.py: the pass lowers every linear of the fake-sm_90 decoder, and the table says so."""

from __future__ import annotations

import importlib.util

import pytest

from scripts import bench_pass

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.mark.parametrize("mode", ["default", "cudagraphs"])
def test_one_layer_lowers_its_four_linears(mode, capsys):
    bench_pass.main(["--layers", "1", "--families", "woq_int8", "--modes", mode])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| woq_int8 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[:3] == ["woq_int8", mode, "4/4"], rows
    assert float(cells[4]) > 0


def test_device_facts_are_restored():
    """The fake sm_90 leaves no trace: CUDA's facts and the CUTLASS library are the machine's again after."""
    import torch

    from qlower.lowerings.kernels.cutlass import build

    before = (torch.cuda.is_available(), build.library)
    with bench_pass.fake_sm90():
        assert torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    assert (torch.cuda.is_available(), build.library) == before
