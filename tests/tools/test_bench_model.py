"""scripts/bench_model.py: a CPU smoke run of the whole-decoder benchmark at tiny shapes, and its TP sharding
checked against the unsharded linears."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from scripts import bench_model as bm
from scripts.decoder import model as dm
from scripts.decoder import tables, variants

TINY = ["--dim", "128", "--heads", "4", "--kv-heads", "2", "--hidden", "448", "--layers", "1"]


def test_smoke_cpu_tiny_decoder(tmp_path: Path) -> None:
    """Every requested row is in the JSON with a finite time and ratio, each compiled step matches eager, and
    each qlower row reports its 4 linears (qkv, o, gate/up, down of the one layer) lowered. `--tp 1` runs the
    sharding and the all_reduce in a world of 1 (gloo)."""
    variants = ["bf16", "woq:qlower"]  # each variant is one CPU compile (~5 s): two keep it light
    argv = [*TINY, *"--device cpu --batches 1 --cache 32 --prefill 0 --shapes static".split()]
    argv += ["--variants", ",".join(variants), *"--reps 2 --warmup 1 --budget 0 --threads 1".split()]
    threads = torch.get_num_threads()
    assert bm.main([*argv, "--tp", "1", "--out", str(tmp_path)]) == 0
    assert torch.get_num_threads() == threads  # the run leaves the process as it found it
    assert torch._dynamo.config.recompile_limit == 8 and not torch.distributed.is_initialized()
    data = json.loads((tmp_path / "model_cpu.json").read_text())
    rows = {(r["variant"], r["workload"], r["mode"], r["cudagraphs"]): r for r in data["rows"]}
    assert set(rows) == {(v, "decode b1", "static", False) for v in variants}
    for r in rows.values():
        assert r["seconds"] > 0 and math.isfinite(r["vs_bf16"]) and r["vs_bf16"] > 0, r
        assert r["tokens_per_s"] == pytest.approx(1 / r["seconds"])
        assert r["rel_err"] <= bm.REL_TOL, r
        assert r["note"] == "", r
        assert r["spread"] is not None and r["spread"] >= 0, r  # IQR / median of the timed steps
        assert r["graphs_compiled"] >= 1 and r["compile_s"] > 0, r  # each variant's first row compiled
    assert rows[("bf16", "decode b1", "static", False)]["vs_bf16"] == 1.0
    r = rows[("woq:qlower", "decode b1", "static", False)]
    assert (r["lowered"], r["linears"]) == (4, 4), r
    assert r["kernels"] and not r["reasons"], r
    assert data["meta"]["tp"] == 1 and data["meta"]["config"]["dim"] == 128
    table = (tmp_path / "model_cpu.md").read_text()
    assert "| workload | bf16 | woq:qlower |" in table
    assert "interquartile range / median" in data["meta"]["timing"] and " ±" in table
    assert "4/4 lowered" in table and "| compile s |" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "model_cpu.png").stat().st_size > 0


@pytest.mark.parametrize("quant", ["woq", "mxfp4"])
def test_tp_shards_match_the_unsharded_linears(quant: str) -> None:
    """gpt-fast layout at TP=2: column-parallel shards (qkv, gate/up) give their slices of each of q, k, v /
    gate, up; row-parallel shards (o, down) sum to the full output with the full per-channel scales."""
    cfg = dm.Config(dim=128, heads=4, kv_heads=2, hidden=448, layers=1)
    model = dm.Decoder(cfg, dm.TP())
    torch.manual_seed(0)
    for p in model.parameters():
        p.data.normal_(0.0, p.shape[-1] ** -0.5)
    variants.QUANTS[quant][0](model)
    full = model.layers[0]
    shards = []
    for rank in range(2):
        m = copy.deepcopy(model)
        variants.shard(m, dm.TP(rank, 2))
        shards.append(m.layers[0])
        assert (m.layers[0].heads, m.layers[0].kv_heads) == (2, 1)
    hd = cfg.head_dim
    with torch.no_grad():
        for name, k, pieces in (
            ("qkv", cfg.dim, [cfg.heads * hd, cfg.kv_heads * hd, cfg.kv_heads * hd]),
            ("gate_up", cfg.dim, [cfg.hidden, cfg.hidden]),
        ):
            x = torch.randn(3, k)
            want = getattr(full, name)(x).split(pieces, dim=-1)
            for rank, blk in enumerate(shards):
                got = getattr(blk, name)(x)
                expect = torch.cat([w.chunk(2, dim=-1)[rank] for w in want], dim=-1)
                torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
        for name, k in (("o", cfg.heads * hd), ("down", cfg.hidden)):
            x = torch.randn(3, k)
            got = sum(getattr(blk, name)(xs) for blk, xs in zip(shards, x.chunk(2, dim=-1), strict=True))
            torch.testing.assert_close(got, getattr(full, name)(x), rtol=1e-4, atol=1e-4)
            if quant == "woq":  # row-parallel: the full per-channel scale on every rank
                assert all(torch.equal(b.o.scales, full.o.scales) for b in shards)


def test_variant_names() -> None:
    assert variants.parse_variants("woq:qlower")[0] == "bf16"  # the baseline of every ratio is always run
    assert set(variants.DEFAULT_VARIANTS) <= set(variants.parse_variants("all"))
    with pytest.raises(SystemExit, match="unknown variants"):
        variants.parse_variants("int4:qlower")


def test_weight_bytes_of_llama3_8b_layers() -> None:
    """The HBM bound's bytes: one Llama-3-8B layer is 436 MB in bf16 (qkv 6144, o 4096, gate/up 28672 rows of
    4096; down 4096 rows of 14336); int8 halves it plus a bf16 scale per row; TP=2 halves the elements."""
    elems = 6144 * 4096 + 4096 * 4096 + 28672 * 4096 + 4096 * 14336
    assert variants.weight_bytes(dm.FULL, "bf16", 1) == 4 * 2 * elems
    assert variants.weight_bytes(dm.FULL, "woq", 1) == 4 * (elems + 2 * (6144 + 4096 + 28672 + 4096))
    assert variants.weight_bytes(dm.FULL, "mxfp4", 1) == 4 * (elems // 2 + elems // 32)
    assert variants.weight_bytes(dm.FULL, "bf16", 2) == 2 * 2 * elems


def test_kernel_split_names_matmuls() -> None:
    """`--kernel-split` counts qlower's Triton kernels and cuBLAS's as matmuls (names as the H200 profiler
    gives them), Inductor's fused pointwise / reduction kernels and attention as the rest."""
    pytest.importorskip("triton")
    names = bm.qlower_kernel_names()
    assert {"woq_decode_kernel", "qlinear_mm_kernel", "mx_hfma_gemv_kernel", "mx_bf16_mm_kernel"} <= names
    for name in ("woq_decode_kernel", "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT", "triton_tem_fused_mm_0"):
        assert bm.is_matmul_kernel(name), name
    assert bm.is_matmul_kernel("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>")
    for name in (
        "triton_poi_fused_mul_silu_split_view_5",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_view_4",
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128",
    ):
        assert not bm.is_matmul_kernel(name), name
    with pytest.raises(SystemExit):
        bm.parse_args(["--device", "cpu", "--kernel-split"])


def test_small_run_defaults_measure_every_variant_into_bench_out() -> None:
    """`--small` (automatic on CPU) shortens the run (SMALL_RUN: layers, batches, shapes, budget), never the
    variant list; the files go to ./bench-out like scripts/bench.py's. An explicit flag wins over the
    preset."""
    args = bm.parse_args(["--device", "cpu"])
    assert args.out == "bench-out"
    assert args.variants == variants.parse_variants("default")
    assert args.cfg.layers == bm.SMALL_RUN["layers"] < bm.FULL_RUN["layers"]
    assert (args.batches, args.shapes, args.budget) == tuple(
        bm.SMALL_RUN[k] for k in ("batches", "shapes", "budget")
    )
    args = bm.parse_args(
        [*"--device cpu --layers 4 --batches 1,4 --shapes static,changing --prefill 256".split()]
    )
    assert (args.cfg.layers, args.batches, args.shapes, args.prefill) == (
        4,
        [1, 4],
        ["static", "changing"],
        256,
    )


def test_unstable_rows_give_one_warning_line(tmp_path: Path) -> None:
    rows = [
        tables.Row(v, "decode b1", "static", False, 1, 1, 1, seconds=1e-3, spread=0.03)
        for v in ("bf16", "woq:qlower")
    ]
    assert tables.timing_warning(rows, None) is None
    rows[1].spread = 0.6
    warning = tables.timing_warning(rows, None)
    assert warning is not None and "woq:qlower decode b1 static ±60%" in warning
    assert "1.00 ms ±60%" in tables.table(rows)
    meta = {"device": "cpu", "device_kind": "cpu", "tp": 1, "torch": "x", "date": "d", "cache": 8}
    meta["config"] = dataclasses.asdict(dm.SMALL)
    text = tables.write(tmp_path, {**meta, "warning": warning}, rows, with_plot=False)
    assert text.splitlines()[2] == warning
