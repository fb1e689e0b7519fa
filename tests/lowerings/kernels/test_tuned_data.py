"""The tuned config tables are data (lowerings/kernels/triton/tuned/*.json): every file parses and validates,
the loaded tables hold the measured winners, and the tuner's writer reproduces a committed file."""

from __future__ import annotations

import copy
import json
import re

import pytest

from qlower.lowerings.kernels.triton import configs, tuned
from qlower.lowerings.kernels.triton.configs import decode_fma, mm, tma
from tests.helpers import ROOT

INT8_FAMILIES = ("woq_int8", "dynamic_int8")


def test_every_data_file_parses_and_validates():
    files = tuned.data_files()
    assert files, "no tuned data files"
    docs = tuned.documents()
    assert len(docs) == len(files)
    assert sum(bool(d.get("stand_in")) for d in docs) == 1
    for path, doc in zip(files, docs, strict=True):
        assert tuned.validate(json.loads(path.read_text()), path.name) == doc
        assert getattr(tuned, path.stem.upper()) == doc["device"]
        for family, table in doc["tables"].items():
            assert table["entries"], (path.name, family)
            if family in INT8_FAMILIES:
                for e in table["entries"]:
                    assert len(e["key"]) == 3, e
                    configs.config_from_fields(e["config"])


def test_regenerate_commands_name_the_tuner_and_its_options():
    script = (ROOT / "scripts" / "tune_cuda_kernels.py").read_text()
    for doc in tuned.documents():
        for family, table in doc["tables"].items():
            cmd = table["regenerate"]
            if family not in INT8_FAMILIES:
                continue
            assert cmd.startswith("python scripts/tune_cuda_kernels.py --sweep"), cmd
            assert f"--sweep-families {family}" in cmd
            for flag in re.findall(r"--[a-z-]+", cmd):
                assert f'"{flag}"' in script, flag
            ms = {int(m) for m in re.search(r"--sweep-m (\S+)", cmd).group(1).split(",")}
            kns = {
                tuple(map(int, kn.split("x")))
                for kn in re.search(r"--sweep-kn (\S+)", cmd).group(1).split(",")
            }
            keys = {tuple(e["key"]) for e in table["entries"]}
            assert keys <= {(m, k, n) for m in ms for k, n in kns}, (
                "the command must sweep every entry's point"
            )


def test_loaded_tables_hold_the_measured_winners():
    """A few entries as the sweeps chose them (before the tables moved out of configs.py), and the counts."""
    woq, dyn = configs.WOQ_INT8_TABLE, configs.DYNAMIC_INT8_TABLE
    assert len(woq) == 34 and len(dyn) == 16
    assert woq[(1, 4096, 4096)] == decode_fma(1, 4, 1024, warps=2, acc3=True) == configs.DECODE_FMA_LONG_K
    assert woq[(1, 4096, 14336)] == configs.DECODE_FMA_WIDE
    assert woq[(2, 14336, 4096)] == decode_fma(2, 8, 1024, warps=2)
    assert woq[(16, 14336, 4096)] == mm(16, 32, 256, 4, 4, split_k=2, fast=2)
    assert woq[(128, 4096, 14336)] == mm(128, 64, 128, 4, 3, swap=True, fast=3)
    assert woq[(4096, 4096, 14336)] == tma(128, 128, 64, 4, 4, progs_per_sm=2, fast=2) == configs.WOQ_TMA
    assert woq[(64, 4096, 28672)] == mm(64, 128, 64, 4, 4, fast=2)
    assert dyn[(1, 4096, 4096)] == mm(16, 64, 512, 4, 4, swap=True)
    assert dyn[(256, 4096, 14336)] == mm(128, 128, 128, 8, 3)
    assert dyn[(4096, 4096, 4096)] == tma(128, 128, 128, 4, 3, progs_per_sm=2) == configs.TMA_LARGE_M
    # the old names are the stand-in's dicts the tables answer from (tests install entries through them)
    assert configs.WOQ_INT8_TABLE is configs.WOQ_INT8_TUNED.entries(tuned.STAND_IN)
    assert configs.DYNAMIC_INT8_TABLE is configs.DYNAMIC_INT8_TUNED.entries(tuned.STAND_IN)
    assert configs.woq_int8_config(100, 4096, 4096, tuned.STAND_IN) == woq[(128, 4096, 4096)]
    assert configs.woq_int8_config(100, 4096, 4096, "no such GPU") == configs._woq_rule(128, 4096, 4096)


def test_the_tuners_writer_reproduces_the_committed_files():
    """`scripts/tune_cuda_kernels.py --sweep` writes its data file with `tuned.document` + `tuned.dumps`: with no
    new timings it gives the committed file back, byte for byte."""
    import dataclasses

    tables = {"woq_int8": configs.WOQ_INT8_TUNED, "dynamic_int8": configs.DYNAMIC_INT8_TUNED}
    for path, doc in zip(tuned.data_files(), tuned.documents(), strict=True):
        if not set(tables) <= set(doc["tables"]):
            continue  # other tables (the "mx" one) are kept as the file has them
        env = {k: doc[k] for k in ("torch", "triton", "date")}
        out = tuned.document(doc["device"], tables, dataclasses.asdict, env, {})
        assert tuned.dumps(out) == path.read_text(), path.name
    key = (1, 4096, 4096)
    out = tuned.document(tuned.STAND_IN, tables, dataclasses.asdict, env, {("woq_int8", key): 6.5})
    (entry,) = [e for e in out["tables"]["woq_int8"]["entries"] if tuple(e["key"]) == key]
    assert entry["us"] == 6.5


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(extra=1), "unknown fields"),
        (lambda d: d.pop("torch"), "'torch'"),
        (lambda d: d.update(schema=2), "schema"),
        (lambda d: d["tables"]["woq_int8"].pop("regenerate"), "regenerate"),
        (lambda d: d["tables"]["woq_int8"]["entries"].append(d["tables"]["woq_int8"]["entries"][0]), "twice"),
        (lambda d: d["tables"]["woq_int8"]["entries"][0].update(key=[1, "4096", 4096]), "key"),
        (lambda d: d["tables"]["woq_int8"]["entries"][0].update(us=-1), "us of"),
    ],
)
def test_validate_names_the_problem(edit, message):
    doc = copy.deepcopy(next(d for d in tuned.documents() if "woq_int8" in d["tables"]))
    edit(doc)
    with pytest.raises(ValueError, match=message):
        tuned.validate(doc, "edited")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kernel": "mm", "block_m": 16, "block_n": 32, "block_k": 256, "tile": 4}, "unknown fields"),
        ({"kernel": "fft", "block_m": 16, "block_n": 32, "block_k": 256}, "kernel must be"),
        ({"kernel": "mm", "block_m": 16, "block_n": 32, "block_k": 256.0}, "block_k"),
        ({"kernel": "mm", "block_m": 16, "block_n": 32, "block_k": 256, "swap_ab": 1}, "swap_ab"),
    ],
)
def test_config_from_fields_refuses_bad_configs(fields, message):
    with pytest.raises(ValueError, match=message):
        configs.config_from_fields(fields)


def test_mx_decode_table_is_data():
    """The weight-only MX decode table (`mx/ops.py: DECODE_TUNED`) is the `"mx"` table of the data files: keys
    (w_fmt code, M bucket's upper end, K, N), configs `DecodeConfig` fields; no device name in the code."""
    pytest.importorskip("triton")
    from qlower.lowerings.kernels.triton.mx import ops

    with_mx = [d for d in tuned.documents() if "mx" in d["tables"]]
    assert with_mx, "no data file holds the MX decode table"
    assert set(ops.DECODE_TUNED.by_device) == {d["device"] for d in with_mx}
    for doc in with_mx:
        for e in doc["tables"]["mx"]["entries"]:
            assert len(e["key"]) == 4, e
            assert ops.decode_config_from_fields(e["config"]) == ops.DECODE_TUNED.get(
                tuple(e["key"]), doc["device"]
            )
    assert len(ops.DECODE_TABLE) == 24 and ops.DECODE_TABLE is ops.DECODE_TUNED.entries(tuned.STAND_IN)
    with pytest.raises(ValueError, match="kernel must be"):
        ops.decode_config_from_fields({**dataclasses_asdict(ops.HF_WIDE), "kernel": "fft"})
    with pytest.raises(ValueError, match="prefetch must be bool"):
        ops.decode_config_from_fields({**dataclasses_asdict(ops.HF_WIDE), "prefetch": 1})


def dataclasses_asdict(cfg):
    import dataclasses

    return dataclasses.asdict(cfg)
