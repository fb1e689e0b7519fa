"""The demo's path (build, quantize, compile with qlower) on a small block: every linear lowered, right numbers."""

from __future__ import annotations

import re

import pytest
import torch

import qlower
from qlower import demo
from qlower.__main__ import main as cli_main
from qlower.passes.report import Decision, Report
from qlower.timing import SPREAD_DEFINITION, Timing

SMALL = demo.BlockConfig(hidden=128, intermediate=352, head_dim=32)  # K = 128 and 352: multiples of 16


@pytest.mark.parametrize("m", [1, 8])
def test_small_block_every_linear_lowered_and_close(m: int) -> None:
    (r,) = demo.run("woq_int8", "cpu", (m,), SMALL, timed=False, log=lambda _: None)
    assert r.m == m and r.expected_linears == 7
    assert r.all_lowered, r.report.table()
    assert {d.family for d in r.report} == {"woq_int8"}
    # Against a float64 reference of the same quantized model, qlower is as good as eager bf16 (up to 2x,
    # since both round to bf16 in different places) or within bf16's own resolution of the output.
    tol = max(2 * r.err_eager_vs_f64, 2**-7 * r.ref_max)
    assert r.err_qlower_vs_f64 <= tol, (r.err_qlower_vs_f64, r.err_eager_vs_f64, r.ref_max)


def test_small_block_decode_uses_packed_kernel_on_cpu() -> None:
    (r,) = demo.run("woq_int8", "cpu", (1,), SMALL, timed=False, log=lambda _: None)
    assert {d.lowering for d in r.report} == {"aten._weight_int8pack_mm"}, r.report.table()


def test_all_lowered_is_false_when_a_linear_is_left_alone() -> None:
    def decision(lowering: str | None) -> Decision:
        return Decision("woq_int8", "cpu", (1, 16, 16), "bfloat16", lowering, None if lowering else "why")

    report = Report("0/0", [decision("x")] * 6 + [decision(None)])
    r = demo.ShapeResult(1, report, 7, 0.0, 0.0, 0.0, 1.0)
    assert not r.all_lowered
    r.report = Report("0/0", [decision("x")] * 6)  # a linear the pattern never found
    assert not r.all_lowered


def test_cli_demo_runs_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["demo", "--device", "cpu", "--sizes", "4", "--hidden", "64", "--intermediate", "128"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "7/7 lowered" in out and "every linear lowered" in out
    assert "max abs error" in out and "vs stock" in out
    # every time is a median with its spread, and the header says what the spread is
    assert SPREAD_DEFINITION in out
    (row,) = [line for line in out.splitlines() if re.match(r"^\s+4\s+\d", line)]
    assert len(re.findall(r"\d+\.\d{3}ms ±\d+%", row)) == 4, row
    # The MX linear after the block: its own report, one row naming its module.
    mx = out[out.index("--- MX weight-only linear") :]
    assert "1/1 lowered" in mx and re.search(r"^0\s+proj\s+mx\s+cpu\s+4, 256, 256", mx, re.M), mx
    # Each row of the block names its linear.
    for name in ("attn.q_proj", "attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
        assert re.search(rf"^\d+\s+{re.escape(name)}\s+woq_int8", out, re.M), out


def test_quantizers_cover_only_known_families() -> None:
    from qlower.quantize import QUANTIZERS

    assert set(QUANTIZERS) <= set(qlower.FAMILIES)
    with pytest.raises(SystemExit, match="no demo quantizer"):
        demo.quantize(torch.nn.Linear(16, 16), "no_such_family")


def test_times_carry_their_spread_and_a_warning_when_unstable() -> None:
    times = {name: Timing(1e-3, 0.02, 9) for name in ("eager_bf16", "eager_quant", "stock", "qlower")}
    r = demo.ShapeResult(16, Report("0/0", []), 7, 0.0, 0.0, 0.0, 1.0, times=times, load=(0.5, 2))
    assert "1.000ms ±2%" in demo.format_results([r]) and demo.timing_warning([r]) is None
    r.times["stock"] = Timing(1e-3, 0.4, 9)
    warning = demo.timing_warning([r])
    assert warning is not None and warning.startswith("WARNING") and "stock M=16 ±40%" in warning
    r.times["stock"], r.load = Timing(1e-3, 0.02, 9), (4.0, 2)
    warning = demo.timing_warning([r])
    assert warning is not None and "load average 4.0 on 2 CPUs" in warning
