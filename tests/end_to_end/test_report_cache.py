"""A compile served from Inductor's caches never shows another compile's report.

Inductor runs the joint-graph passes (qlower's among them) before it looks up the FX graph cache, so an FX
graph cache hit still runs the pass and reports its decisions; a compile the AOTAutograd cache serves whole runs
no pass, and gets a report of its own that says so (`pass_ran=False`, passes/report.py `watch_compiles`). Tests:
options switched between compiles of one model in one process, and Inductor's mega-cache
(`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) carried into a fresh process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import qlower
from qlower.passes.report import SERVED_FROM_CACHE
from tests.forms.woq_int8 import WoqLinear
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

BF16 = torch.bfloat16
# What each preference lowers a bf16 woq-int8 linear to on a CPU (AUTO: any of the CPU's woq lowerings).
CPU_WOQ = {"aten._weight_int8pack_mm", "qlower.woq_int8_gemm", "qlower.woq_int8_mm_by_m", "dequant_mm"}
EXPECTED = {"auto": CPU_WOQ, "emulated": {"dequant_mm"}, "aten": {"aten._weight_int8pack_mm"}}


def _caches_on():
    return (
        torch._inductor.config.patch(fx_graph_cache=True, force_disable_caches=False),
        torch._functorch.config.patch(enable_autograd_cache=True),
    )


def test_options_switched_between_cached_compiles_never_show_another_compiles_rows():
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    fx_on, aot_on = _caches_on()
    served = 0
    with fresh_cache(), fx_on, aot_on, torch.no_grad():
        counters.clear()
        previous = None
        for pref in ("auto", "emulated", "auto", "aten", "emulated"):
            torch._dynamo.reset()
            hits = counters["aot_autograd"]["autograd_cache_hit"]
            out = torch.compile(model, options=qlower.inductor_options(kernel_preference=pref))(x)
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=1e-1)
            report = qlower.last_report()
            assert report is not previous, f"{pref}: the previous compile's report"
            if counters["aot_autograd"]["autograd_cache_hit"] > hits:
                served += 1
                assert not report.pass_ran and not report.entries, report.table()
                assert SERVED_FROM_CACHE in report.table() and pref.upper() in report.table()
            else:
                assert report.pass_ran and len(report.entries) == 1, report.table()
                assert report.entries[0].lowering in EXPECTED[pref], (pref, report.table())
            previous = report
    # the third and fifth compiles repeat an earlier one's options: the AOTAutograd cache serves them
    assert served == 2, counters["aot_autograd"]


def test_stock_compiles_beside_qlower_ones_open_no_report():
    """A compile without qlower's options, served from the caches or not, leaves the reports alone."""
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    fx_on, aot_on = _caches_on()
    with fresh_cache(), fx_on, aot_on, torch.no_grad():
        torch.compile(model, options=qlower.inductor_options())(x)
        ours = qlower.all_reports()
        for _ in range(2):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(model)(x), model(x), rtol=2e-2, atol=1e-1)
        assert [id(r) for r in qlower.all_reports()] == [id(r) for r in ours]


_FRESH_PROCESS = """
import os, sys, torch
import qlower
from tests.forms.woq_int8 import WoqLinear
from torch._dynamo.utils import counters

torch.manual_seed(0)
model = WoqLinear(64, 48, torch.bfloat16)
x = torch.randn(2, 64, dtype=torch.bfloat16)
with open(sys.argv[1], "rb") as f:
    torch.compiler.load_cache_artifacts(f.read())
with torch.no_grad():
    out = torch.compile(model, options=qlower.inductor_options())(x)
    torch.testing.assert_close(out, model(x), rtol=2e-2, atol=1e-1)
report = qlower.last_report()
if counters["aot_autograd"]["autograd_cache_hit"]:  # served from the loaded artifacts: a report saying so
    assert not report.pass_ran and not report.entries, report.table()
else:  # an AOTAutograd cache miss (its key covers more of the process than the FX graph): the pass ran
    assert report.pass_ran and [d.family for d in report.lowered] == ["woq_int8"], report.table()
print("served" if report.pass_ran is False else "ran", "ok")
"""


def test_mega_cache_in_a_fresh_process_reports_a_served_compile(tmp_path):
    torch.manual_seed(0)
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    fx_on, aot_on = _caches_on()
    with fresh_cache(), fx_on, aot_on, torch.no_grad():
        torch.compile(model, options=qlower.inductor_options())(x)
        assert qlower.last_report().pass_ran
        artifacts = torch.compiler.save_cache_artifacts()
    assert artifacts is not None
    (tmp_path / "cache.bin").write_bytes(artifacts[0])
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor_cache")}
    script = textwrap.dedent(_FRESH_PROCESS)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "cache.bin")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
