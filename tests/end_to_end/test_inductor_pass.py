"""The pass as Inductor sees it: cache keys, logging, options (its report: test_report.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

import qlower
from qlower.testing import apply_pass, trace_for_inductor
from tests.forms.woq_int8 import WoqLinear
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S

BF16 = torch.bfloat16


def test_uuid_is_stable_and_depends_on_options():
    a = qlower.inductor_options()["joint_custom_pre_pass"]
    b = qlower.inductor_options()["joint_custom_pre_pass"]
    c = qlower.inductor_options(kernel_preference="emulated")["joint_custom_pre_pass"]
    assert a.uuid() and a.uuid() == b.uuid()
    assert a.uuid() != c.uuid()


def test_uuid_opens_no_report_and_changes_nothing():
    """Inductor's caches ask for the key inside a compile, a pass manager (vLLM's) from its config alone: either
    way it is a pure function of the configuration; the pass opens its compile's report when it runs."""
    opts = qlower.inductor_options()
    qpass, fresh = opts["joint_custom_pre_pass"], qlower.inductor_options()
    reports = qlower.all_reports()
    with torch._guards.tracing(torch._guards.TracingContext(None)):  # as inside a compile
        keys = {qpass.uuid() for _ in range(3)}
    assert len(keys) == 1 and keys == {qpass.uuid()}
    assert [id(r) for r in qlower.all_reports()] == [id(r) for r in reports]
    assert opts == fresh


def test_second_identical_compile_hits_fx_graph_cache_and_new_options_miss():
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    caches_on = torch._inductor.config.patch(fx_graph_cache=True)
    aot_cache_on = torch._functorch.config.patch(enable_autograd_cache=True)
    with fresh_cache(), caches_on, aot_cache_on, torch.no_grad():
        counters.clear()
        torch.compile(model, options=qlower.inductor_options())(x)
        assert counters["inductor"]["fxgraph_cache_miss"] == 1
        assert counters["inductor"]["fxgraph_cache_bypass"] == 0
        first, count = qlower.last_report(), len(qlower.all_reports())
        torch._dynamo.reset()
        torch.compile(model, options=qlower.inductor_options())(x)
        assert counters["inductor"]["fxgraph_cache_hit"] == 1
        cached = qlower.last_report()
        if counters["aot_autograd"]["autograd_cache_hit"]:
            # Served whole from AOTAutograd's cache: the pass did not run; a report of its own says so.
            assert cached is not first and len(qlower.all_reports()) == count + 1
            assert not cached.pass_ran and not cached.entries, cached.table()
        else:  # an FX-graph cache hit still runs the joint pass first
            assert cached.pass_ran and cached.entries[0].lowering == "aten._weight_int8pack_mm"
        torch._dynamo.reset()
        out = torch.compile(model, options=qlower.inductor_options(kernel_preference="emulated"))(x)
        assert counters["inductor"]["fxgraph_cache_miss"] == 2
        assert qlower.last_report().entries[0].lowering == "dequant_mm"
        torch.testing.assert_close(out, model(x), rtol=2e-2, atol=1e-1)


def test_fx_cache_hit_without_aot_cache_still_runs_the_pass():
    """The joint pass runs before the FX-graph cache lookup: an FX-cache hit still reports every decision."""
    model = WoqLinear(64, 48, BF16)
    x = torch.randn(2, 64, dtype=BF16)
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True), torch.no_grad():
        counters.clear()
        for _ in range(2):
            torch._dynamo.reset()
            torch.compile(model, options=qlower.inductor_options())(x)
            assert qlower.last_report().entries[0].lowering == "aten._weight_int8pack_mm"
        assert counters["inductor"]["fxgraph_cache_hit"] == 1


def test_decisions_logged_at_info(caplog):
    caplog.set_level(logging.INFO, logger="qlower")
    apply_pass(trace_for_inductor(WoqLinear(64, 32, BF16), torch.randn(1, 64, dtype=BF16)))
    assert any("woq_int8" in r.message and "_weight_int8pack_mm" in r.message for r in caplog.records)


def test_qlower_log_env_prints_decisions():
    code = (
        "import torch, qlower; from qlower.testing import *; from tests.forms import woq_int8 as wm;"
        "apply_pass(trace_for_inductor(wm.WoqLinear(64, 32, torch.bfloat16), torch.randn(1, 64, dtype=torch.bfloat16)))"
    )
    env = {**os.environ, "QLOWER_LOG": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[qlower] woq_int8 cpu" in proc.stderr


def test_dump_graphs_env_writes_the_graph_before_the_rewrite(tmp_path, monkeypatch):
    monkeypatch.setenv("QLOWER_DUMP_GRAPHS", str(tmp_path))
    gm = trace_for_inductor(WoqLinear(64, 32, BF16), torch.randn(2, 64, dtype=BF16))
    assert apply_pass(gm).entries[0].lowered
    (dump,) = tmp_path.iterdir()
    text = dump.read_text()
    assert "torch.int8[32, 64]" in text  # the int8 weight placeholder, with its dtype and shape
    assert "mm.default(" in text and "_weight_int8pack_mm" not in text  # as received, not as rewritten
    monkeypatch.delenv("QLOWER_DUMP_GRAPHS")
    apply_pass(trace_for_inductor(WoqLinear(64, 32, BF16), torch.randn(2, 64, dtype=BF16)))
    assert len(list(tmp_path.iterdir())) == 1


def test_families_option():
    gm = trace_for_inductor(WoqLinear(64, 32, BF16), torch.randn(1, 64, dtype=BF16))
    assert len(apply_pass(gm, families=())) == 0
    with pytest.raises(ValueError, match="unknown families"):
        qlower.inductor_options(families=["nope"])


def test_options_pass_through_inductor_config():
    opts = qlower.inductor_options(freezing=True)
    assert opts["freezing"] is True and isinstance(opts["joint_custom_pre_pass"], qlower.QLowerPass)
