"""Smoke test of scripts/fuzz_compile.py on CPU: a few seeded cases end to end, every family, a JSON record.

The fuzz is the tool that checks qlower against inputs the unit tests do not pin (see BENCHMARKS.md,
"Correctness fuzz"); this keeps it runnable. A qlower failure in these cases fails the test (the script exits 1). The second
test runs one case per variant (defect class) of the script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scripts.fuzz import classes as fc
from scripts.fuzz.case import FAMILIES as FUZZ_FAMILIES
from scripts.fuzz.draw import make_case
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

FUZZ = [sys.executable, "-m", "scripts.fuzz_compile"]  # run with cwd=ROOT
OK = {"pass", "left_alone", "declined", "misrecognized", "imprecise", "upstream"}  # `silent` is a failure


FAMILIES = ("woq_int8", "dynamic_int8", "mx")
# Seed 2123 draws three AUTO cases, one per family, each of a form the family's recognizer takes (so a
# recognizer that matches nothing, which the outcomes alone would pass as `left_alone`, fails the test);
# cheaper than the six cases it replaced, of which three were declined or left alone by design.
SMOKE_SEED, SMOKE_CASES = "2123", "3"


def test_fuzz_runs_and_records_every_case(tmp_path: Path) -> None:
    cmd = [*FUZZ, "--device", "cpu", "--cases", SMOKE_CASES, "--seed", SMOKE_SEED,
           "--budget-s", str(SUBPROCESS_TIMEOUT_S), "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((tmp_path / "fuzz_cpu.json").read_text())
    cases = record["cases"]
    outcomes = [(c["seed"], c["family"], c["outcome"]) for c in cases]
    assert len(cases) == int(SMOKE_CASES) and {c["outcome"] for c in cases} <= OK, outcomes
    assert {c["family"] for c in cases} <= set(FAMILIES)
    assert all(c["seed"] and c["m"] >= 1 for c in cases)
    # recognized and rewritten: a report row of the case's own family with a lowering, counted per family
    lowered = {
        fam: sum(
            any(d["family"] == fam and d["lowering"] for d in c["decisions"])
            for c in cases
            if c["family"] == fam
        )
        for fam in FAMILIES
    }
    assert all(n > 0 for n in lowered.values()), (lowered, outcomes)
    assert "qlower failures: 0" in proc.stdout


# One cheap case per defect class the variants target (scripts/fuzz_compile.py's docstring), picked by what
# it draws, so the picks follow the script when its draws change. Each must come out OK.
VARIANTS = (
    "view_epilogue", "expanded_scale", "fp16_extreme", "training", "weight_write", "mx_special",
    "mx_training", "family_order", "near_mx", "stacked_experts",
)  # fmt: skip


def _small(c) -> bool:
    rows = (c.batch or 1) * max(c.m, c.m2 or 0)
    return c.preference == "AUTO" and rows * c.k * c.n <= 1 << 17


PICKS = {
    "view_epilogue, woq, scale after the view": lambda c, x: x.get("variant") == "view_epilogue"
    and c.family == "woq_int8" and x.get("scale_at") == "heads" and _small(c),
    "view_epilogue, dynamic int8, a [D] bias after the view": lambda c, x: x.get("variant") == "view_epilogue"
    and c.family == "dynamic_int8" and x["epi"] == "add_D" and "scale_at" not in x
    and not x["heads"].startswith("1x") and _small(c),
    "expanded_scale, dynamic int8, torchao's order": lambda c, x: x.get("variant") == "expanded_scale"
    and c.family == "dynamic_int8" and x["order"] == "torchao" and x["x_scale"] == "m1" and _small(c),
    "fp16_extreme, woq, scales up to 4096": lambda c, x: x.get("variant") == "fp16_extreme"
    and c.family == "woq_int8" and x["scales"] == "large" and _small(c),
    "training, woq, scale and bias require grad": lambda c, x: x.get("variant") == "training"
    and c.family == "woq_int8" and x["grad"] == "both" and c.bias and _small(c),
    "weight_write, dynamic int8, prepack cache": lambda c, x: x.get("variant") == "weight_write"
    and c.family == "dynamic_int8" and x.get("isa") == "vnni" and c.k * c.n >= 1 << 22
    and x["api"] in ("data_setitem", "numpy") and c.form in ("IntMMDivide", "IntMMReciprocal", "OutDtypeMM")
    and c.preference == "AUTO" and not c.dynamic,
    "mx_special, e8m0 code 255 -> 0": lambda c, x: x.get("variant") == "mx_special"
    and x["special"] == "e255_zero" and _small(c),
    "mx_training, the smallest shape": lambda c, x: x.get("variant") == "mx_training"
    and c.m * (c.batch or 1) == c.k == c.n == 32,
    "family_order, 1-D activation, woq_int8 listed first": lambda c, x: x.get("variant") == "family_order"
    and x.get("x_dims") == "k" and x["families"].startswith("woq_int8") and "dynamic_int8" in x["families"]
    and _small(c),
    "family_order, dynamic_int8 off: woq_int8 says why": lambda c, x: x.get("variant") == "family_order"
    and "dynamic_int8" not in x["families"] and "x_dims" not in x and _small(c),
    "near_mx, e4m3 scale bytes": lambda c, x: x.get("variant") == "near_mx" and x["decode"] == "e4m3_scale"
    and _small(c),
    "stacked_experts, bmm over 4 experts": lambda c, x: x.get("variant") == "stacked_experts"
    and c.form == "bmm" and x["experts"] == 4 and _small(c),
}  # fmt: skip


def _pick_seeds() -> dict[str, int]:
    picks: dict[str, int] = {}
    for seed in range(1, 200_000):
        case = make_case(seed, "cpu", FUZZ_FAMILIES, VARIANTS)
        for name, pred in PICKS.items():
            if name not in picks and pred(case, case.extra):
                picks[name] = seed
        if len(picks) == len(PICKS):
            return picks
    raise AssertionError(f"no seed draws {sorted(set(PICKS) - set(picks))}")


def test_fuzz_variants_one_case_per_defect_class(tmp_path: Path) -> None:
    picks = _pick_seeds()
    cmd = [*FUZZ, "--device", "cpu", "--only", *map(str, picks.values()),
           "--variant", *VARIANTS, "--budget-s", str(SUBPROCESS_TIMEOUT_S), "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    cases = {c["seed"]: c for c in json.loads((tmp_path / "fuzz_cpu.json").read_text())["cases"]}
    assert set(cases) == set(picks.values())
    assert {c["outcome"] for c in cases.values()} <= OK, [(c["seed"], c["outcome"]) for c in cases.values()]
    assert {c["extra"]["variant"] for c in cases.values()} == set(VARIANTS)
    training = cases[picks["training, woq, scale and bias require grad"]]
    checked = {m["what"] for m in training["metrics"]}
    assert checked >= {"out", "grad x", "grad s", "grad b"}, training["metrics"]
    written = cases[picks["weight_write, dynamic int8, prepack cache"]]
    assert "qlower.qlinear_u8_cached" in written["lowerings"], written["report"]
    assert len(written["metrics"]) >= 1
    assert "qlower failures: 0 (wrong: 0, crashed: 0, silent: 0)" in proc.stdout
    mx_training = cases[picks["mx_training, the smallest shape"]]
    assert mx_training["outcome"] == "pass" and len(mx_training["decisions"]) == 3, mx_training["report"]
    checked = {m["what"] for m in mx_training["metrics"]}  # `weight` or `0.weight`: its builder's name
    assert {"out", "grad x"} <= checked and any(w.endswith("weight") for w in checked), checked
    # the classes' expected rows are checked by the script (check_rows of scripts/fuzz/classes.py)
    for name in PICKS:
        if name.startswith(("family_order, dynamic_int8 off", "near_mx", "stacked_experts")):
            assert cases[picks[name]]["outcome"] == "left_alone", cases[picks[name]]


# A two_models case whose stock compile, beside qlower's, miscompiles a partial MX block on CPU (stock alone
# does too): stock off eager beside qlower is qlower's only where stock alone is right, so the case passes.
STOCK_MISCOMPILE_SEED = 1454501074


def test_two_models_leaves_stock_miscompiles_to_stock(tmp_path: Path) -> None:
    cmd = [*FUZZ, "--device", "cpu", "--only", str(STOCK_MISCOMPILE_SEED),
           "--budget-s", str(SUBPROCESS_TIMEOUT_S), "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    (case,) = json.loads((tmp_path / "fuzz_cpu.json").read_text())["cases"]
    assert case["extra"]["variant"] == "two_models" and case["form"] == "partial_block", case["extra"]
    assert proc.returncode == 0 and case["outcome"] == "pass", proc.stdout[-3000:] + proc.stderr[-2000:]


def _mx_training_case(device: str):
    for seed in range(1, 5000):
        case = make_case(seed, device, FUZZ_FAMILIES, ("mx_training",))
        if case.extra.get("variant") == "mx_training" and case.preference == "AUTO":
            return case
    raise AssertionError("no AUTO mx_training case drawn")


def test_mx_training_rows_left_to_stock_only_on_cuda_auto() -> None:
    """The mx_training class accepts a row left alone with the training-compile reason on CUDA under AUTO
    (devices/cuda.py `_prefer_mx_emulated`) and nowhere else; a row left alone for another reason fails."""

    def rows(case, reason: str | None) -> list[dict]:
        t = case.m * (case.batch or 1)
        shapes = [(t, case.k, case.n), (t, case.n, case.k), (case.n, t, case.k)]
        return [{"family": "mx", "shape": [str(s) for s in shape], "lowering": None if reason else
                 "mx_dequant_mm", "reason": reason or "", "compile": 0} for shape in shapes]  # fmt: skip

    from qlower.lowerings.devices.cuda import TRAINING_STOCK

    stock = TRAINING_STOCK + "'s fused decode measured faster"
    cuda, cpu = _mx_training_case("cuda"), _mx_training_case("cpu")
    assert fc.check_rows(cuda, rows(cuda, None)) is None
    assert fc.check_rows(cuda, rows(cuda, stock)) is None
    assert fc.check_rows(cuda, rows(cuda, "no lowering supports it")) is not None
    assert fc.check_rows(cpu, rows(cpu, stock)) is not None
