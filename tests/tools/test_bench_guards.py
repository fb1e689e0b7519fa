"""scripts/bench_guards.py: what a torchao weight adds to a compiled call's guards, and the script's table."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

import qlower
from scripts import bench_guards

pytest.importorskip("torchao")


def _guard_types(model: torch.nn.Module) -> collections.Counter:
    seen: collections.Counter = collections.Counter()

    def record(entries: list) -> list[bool]:
        seen.update(e.guard_type for e in entries)
        return [True] * len(entries)

    torch._dynamo.reset()
    compiled = torch.compile(
        copy.deepcopy(model), options={**qlower.inductor_options(), "guard_filter_fn": record}
    )
    with torch.no_grad():
        compiled(torch.randn(1, 64, dtype=torch.bfloat16))
    return seen


def test_each_torchao_weight_adds_two_python_structure_guards():
    """Per torchao woq linear: one subclass-metadata guard and one equality guard on its inner tensors' names
    (both call `__tensor_flatten__` on every call), which bf16 weights do not have; the filters drop exactly
    those."""
    linears = 3
    bf16 = _guard_types(bench_guards.model_for("bf16", linears))
    woq = _guard_types(bench_guards.model_for("woq_int8", linears))
    assert bf16["TENSOR_SUBCLASS_METADATA_MATCH"] == 0
    assert woq["TENSOR_SUBCLASS_METADATA_MATCH"] == linears
    assert woq["EQUALS_MATCH"] - bf16["EQUALS_MATCH"] == linears
    entries = [
        type("Entry", (), {"guard_type": t})()
        for t in ("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH", "EQUALS_MATCH", "TYPE_MATCH")
    ]
    assert bench_guards.all_guards(entries) == [True] * 4
    assert bench_guards.no_subclass_metadata(entries) == [True, False, True, True]
    assert bench_guards.no_subclass_structure(entries) == [True, False, False, True]


def test_table_has_every_filter_and_family(capsys):
    bench_guards.main(["--linears", "2", "--families", "woq_int8", "--calls", "5", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "| guards | bf16 | woq_int8 |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| guards |")]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == list(bench_guards.FILTERS)
    for r in rows:
        assert all(float(v) > 0 for v in r.strip("| ").split(" | ")[1:]), r
