"""scripts/tune_cutlass.py's tuned table (no GPU: the table is built from timing rows): the fastest configuration
per measured (N, K, M), and `--merge`, which adds new M rows to a GPU's table without losing its other rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from scripts import tune_cutlass


def _row(m: int, n: int, k: int, best: str) -> dict:
    return {"m": m, "n": n, "k": k, "best": best}


@pytest.fixture
def gpu_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(sys, "argv", ["tune_cutlass", "--ms", "64", "--raw", "/tmp/raw.json", "--merge"])


def test_merge_adds_rows_in_m_order_and_keeps_the_rest(tmp_path: Path, gpu_name) -> None:
    out = tmp_path / "h100.json"
    first = tune_cutlass.tuned_table(
        [_row(128, 14336, 4096, "t128x128_c2x1_coop/0"), _row(256, 14336, 4096, "t128x256_c1x1_coop/0")], out
    )
    out.write_text(json.dumps(first))
    merged = tune_cutlass.tuned_table(
        [
            _row(64, 14336, 4096, "t128x64_c1x1_coop/0"),
            _row(256, 14336, 4096, "t128x128_c1x1_coop_streamk/2"),
        ],
        out,
        merge=True,
    )
    (shape,) = merged["shapes"]
    assert [(r["max_m"], r["config"], r["splits"]) for r in shape["ranges"]] == [
        (64, "t128x64_c1x1_coop", 0),
        (128, "t128x128_c2x1_coop", 0),  # kept from the table
        (256, "t128x128_c1x1_coop_streamk", 2),  # re-measured: replaced
    ]
    # the command regenerates the table: the first run's, then this one's (where the raw timings went left out)
    assert merged["command"].endswith("&& python -m scripts.tune_cutlass --ms 64 --merge")
    assert merged["device"] == "NVIDIA H100 80GB HBM3"


def test_without_merge_the_table_is_the_rows_alone(tmp_path: Path, gpu_name) -> None:
    out = tmp_path / "h100.json"
    out.write_text(
        json.dumps(tune_cutlass.tuned_table([_row(128, 4096, 14336, "t128x128_c1x1_coop/0")], out))
    )
    table = tune_cutlass.tuned_table([_row(64, 4096, 4096, "t128x64_c1x1_coop_streamk/4")], out)
    assert [(s["n"], s["k"]) for s in table["shapes"]] == [(4096, 4096)]
    assert table["shapes"][0]["ranges"] == [{"max_m": 64, "config": "t128x64_c1x1_coop_streamk", "splits": 4}]
