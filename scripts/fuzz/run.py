"""One case end to end (`run_case`): build, compile, call, judge the numbers and the report rows, and where
it fails, whether stock torch.compile fails the same way; the record fuzz_compile.py writes per case."""

from __future__ import annotations

import contextlib
import math
import os
import re
import time
import traceback
from dataclasses import asdict
from typing import Any

import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

import qlower
from scripts.fuzz import classes, pipelines
from scripts.fuzz.case import DTYPES, Case
from scripts.fuzz.check import check, check_grad
from scripts.fuzz.draw import TRAINING
from scripts.fuzz.models import Built, build, make_x
from scripts.fuzz.steps import (
    Obs,
    Progress,
    call_compiled,
    case_steps,
    compile_case,
    compile_families,
    differential,
    train_call,
    write_weights,
)


def _exc_chain(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        chain.append(exc)
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return chain


def _exc_record(exc: BaseException) -> dict[str, str]:
    chain = _exc_chain(exc)
    root = chain[-1]
    return {
        "type": type(exc).__name__,
        "root_type": type(root).__name__,
        "message": str(exc)[:300],
        "root_message": str(root)[:300],
    }


def _is_declined(exc: BaseException) -> bool:
    return any(
        isinstance(e, qlower.UnsupportedPlatformError) or "platform unsupported" in str(e)
        for e in _exc_chain(exc)
    )


def _decisions() -> tuple[list[dict[str, Any]], int, int]:
    """Every decision of this case's compiles; the number of compiles the pass ran in, and of those it missed."""
    reports = qlower.all_reports()
    out = [
        {
            "family": d.family,
            "lowering": d.lowering,
            "kind": d.kind,
            "reason": d.reason,
            "form": d.form,
            "shape": [str(v) for v in d.shape],
            "dtype": d.dtype,
            "compile": i,  # which compile's report (rows per compile: classes.check_rows)
        }
        for i, r in enumerate(reports)
        for d in r.entries
    ]
    return out, sum(r.pass_ran for r in reports), sum(not r.pass_ran for r in reports)


def _execute_pipeline(case: Case, built: Built, xs: dict[str, torch.Tensor], prog: Progress) -> list[Obs]:
    """A pipelines.py class: its flow of compiles (or a package), each output an Obs against eager."""
    variant = case.extra["variant"]

    def compile_with(model: nn.Module, preference: str):
        opts = qlower.inductor_options(kernel_preference=preference, families=compile_families(case))
        return torch.compile(model, dynamic=case.dynamic or None, fullgraph=True, options=opts)

    x = xs["m"]
    if variant == "aoti_package":
        inputs = list(xs.values())
        opts = qlower.inductor_options(kernel_preference=case.preference, families=compile_families(case))
        runs = pipelines.aoti_package(case, built.model, inputs, opts, prog.problems)
        pairs = [(xi, out.to(xi.device)) for outs in runs for xi, out in zip(inputs, outs, strict=False)]
    else:
        if case.dynamic:
            torch._dynamo.mark_dynamic(x, x.dim() - 2)
        flow = pipelines.cache_switch if variant == "cache_switch" else pipelines.two_models
        pairs = [(x, out) for out in flow(case, built.model, x, compile_with, prog.problems)]
    if case.device == "cuda":
        torch.cuda.synchronize()
    prog.stage = "check (eager model or reference)"
    return [Obs(xi, out, built.eager(xi), None if built.ref is None else built.ref(xi)) for xi, out in pairs]


# _execute's `compiled` for _stock_check: stock torch.compile, a pipeline's plain steps
STOCK_STEPS = object()


def _execute(case: Case, built: Built, compiled, prog: Progress, diff: bool = False) -> list[Obs]:
    """Run the case's steps (case_steps) through `compiled`; each call's eager and float64 results are taken right
    after it, before any later weight write (`diff`: the weights are kept for `_fresh_references` instead)."""
    xs = {"m": make_x(case, case.m, 0, built.x_std)}
    if case.dynamic:
        xs["m2"] = make_x(case, case.m2, 1, built.x_std)
    if case.extra.get("variant") in pipelines.VARIANTS and compiled is not STOCK_STEPS:
        return _execute_pipeline(case, built, xs, prog)
    if compiled is STOCK_STEPS:  # a pipeline class's stock check: its plain steps, stock-compiled
        compiled = compile_case(built.model, case, with_qlower=False)
    obs: list[Obs] = []
    written = False
    for step in case_steps(case):
        if step == "write":
            prog.stage = "write weights"
            write_weights(case, built)
            written = True
            continue
        x = xs[step]
        prog.stage = "compile/run"
        if case.extra.get("variant") in TRAINING:
            obs.append(train_call(case, built, compiled, x, prog, first=not obs))
            continue
        if case.dynamic and not obs:
            torch._dynamo.mark_dynamic(x, x.dim() - 2)
        if obs:
            out = call_compiled(compiled, x, case)
        else:  # the compiling call: its generated code is checked too
            out, codes = run_and_get_code(call_compiled, compiled, x, case)
            LEADING_DIMS[0].extend(short_leading_dims(codes))
        if case.device == "cuda":
            torch.cuda.synchronize()
        prog.stage = "check (eager model or reference)"
        if diff:
            state = {k: v.detach().cpu().clone() for k, v in built.model.state_dict().items()}
            obs.append(Obs(x, out, out, None, written, state=state if written else None, checked=written))
            continue
        ref = None if built.ref is None else built.ref(x)
        obs.append(Obs(x, out, built.eager(x), ref, after_write=written))
    return obs


LEADING_DIMS: list[Any] = [None]  # the running case's findings (a list, set by _run_case)
_VIEW = re.compile(r"reinterpret_tensor\(\w+, \((\d+), (\d+)\), \((\d+), (\d+)\)")
_GEMM_CALL = re.compile(r"(_int_mm|_weight_int8pack_mm|\bmm|addmm|bmm|_scaled_mm)(_out)?\(")


def short_leading_dims(codes: list[str]) -> list[str]:
    """Matmul calls in generated code whose 2-D operand view has a size-1 dim with a stride below the other
    dim's size (a [1, K] view with strides (0, 1), say). Such a view names the right memory, but oneDNN took
    that stride as the leading dimension: `_int_mm` read garbage on AVX512 CPUs while AVX2 ones (this
    fuzzer's CI) read it right, so the code is checked, not just the numbers (lowerings/graph/inductor_fixes.py
    `dense_unit_strides`)."""
    bad = []
    for code in codes:
        for line in code.splitlines():
            if not _GEMM_CALL.search(line):
                continue
            for rows, cols, s0, s1 in _VIEW.findall(line):
                r, c, a, b = int(rows), int(cols), int(s0), int(s1)
                if (r == 1 and b == 1 and a < c) or (c == 1 and a == 1 and b < r):
                    bad.append(line.strip()[:200])
    return bad


def _fresh_references(case: Case, obs: list[Obs]) -> None:
    """Differential mode: each call after the write is compared with a fresh compile (same options) of a fresh
    model holding the weights that call ran with."""
    for o in obs:
        if o.state is None:
            continue
        fresh = build(case).model
        fresh.load_state_dict(o.state)
        x = o.x.clone()
        if case.dynamic:
            torch._dynamo.mark_dynamic(x, x.dim() - 2)
        opts = qlower.inductor_options(kernel_preference=case.preference, families=compile_families(case))
        o.eager = torch.compile(fresh, dynamic=case.dynamic or None, fullgraph=True, options=opts)(x)


def _judge(case: Case, model: nn.Module, obs: list[Obs]) -> tuple[str, list[dict], list[str]]:
    """('ok' | 'imprecise' | 'fail', per-call metrics, whys) of every call and gradient."""
    status, metrics, whys = "ok", [], []
    for i, o in enumerate(obs):
        if not o.checked:
            continue
        m = case.m_of(o.x)
        label = f"call {i} (M={m}{', after the write' if o.after_write else ''})"
        label += " vs a fresh compile of the written model" if o.state is not None else ""
        results = [("out", *check(case, model, o.x, o.out, o.eager, o.ref))]
        results += [(f"grad {n}", *check_grad(case, n, gc, ge, gr)) for n, gc, ge, gr in o.grads]
        for what, st, met, why in results:
            metrics.append({"call": i, "m": m, "what": what, "status": st, **met})
            if st != "ok":
                whys.append(f"{label}: {why}")
                status = "fail" if "fail" in (st, status) else st
    return status, metrics, whys


@contextlib.contextmanager
def _case_env(case: Case):
    """The environment a case asks for (`isa`: QLOWER_CPU_INT8_ISA; `matvec=decomposed`: Inductor's
    `coordinate_descent_tuning`, which decomposes an M = 1 mm on GPUs), restored afterwards."""
    isa = case.extra.get("isa")
    saved = os.environ.get("QLOWER_CPU_INT8_ISA")
    if isa:
        os.environ["QLOWER_CPU_INT8_ISA"] = isa
    decompose = case.extra.get("matvec") == "decomposed"
    tuning = (
        torch._inductor.config.patch(coordinate_descent_tuning=True)
        if decompose
        else contextlib.nullcontext()
    )
    try:
        with tuning:
            yield
    finally:
        if isa:
            if saved is None:
                os.environ.pop("QLOWER_CPU_INT8_ISA", None)
            else:
                os.environ["QLOWER_CPU_INT8_ISA"] = saved


def run_case(case: Case) -> dict[str, Any]:
    with _case_env(case), torch.no_grad():
        return _run_case(case)


def _run_case(case: Case) -> dict[str, Any]:
    rec: dict[str, Any] = {**asdict(case), "description": case.describe()}
    t0 = time.perf_counter()
    qlower.clear_reports()  # a case that fails before compiling reports nothing, not the last case's rows
    obs: list[Obs] = []
    exc: BaseException | None = None
    whys_dims: list[str] = []
    prog = Progress()
    built: Built | None = None
    diff = differential(case)
    try:
        built = build(case)
        prog.stage = "compile/run"
        dims = LEADING_DIMS[0] = []
        obs = _execute(case, built, compile_case(built.model, case), prog, diff)
        if dims:  # eager's own matmuls get dense operands: a short leading dim is the compiled code's
            whys_dims = [f"matmul operand with a short leading dimension: {dims[0]}"]
            rec["leading_dims"] = dims[:5]
    except Exception as e:  # noqa: BLE001 - every exception is a fuzz result
        exc = e
    stage = prog.stage
    decisions, compiles, missed = _decisions()
    if diff and exc is None:
        rec["reference"] = "fresh compile (forced ISA beyond the CPU: see differential())"
        try:
            _fresh_references(case, obs)
        except Exception as e:  # noqa: BLE001
            exc, stage = e, "check (fresh compile of the written model)"
    rec.update(decisions=decisions, compiles=compiles, compiles_without_pass=missed)
    rec["lowerings"] = sorted({d["lowering"] or "-- left alone --" for d in decisions})
    rec["report"] = "\n\n".join(r.table() for r in qlower.all_reports())
    lowered = [d for d in decisions if d["lowering"]]
    whys, status = [], "ok"
    if exc is None:
        try:
            status, rec["metrics"], whys = _judge(case, built.model, obs)
            if whys_dims:
                status, whys = "fail", [*whys, *whys_dims]
        except Exception as e:  # noqa: BLE001
            exc, stage = e, "check (eager model or reference)"
    if exc is not None:
        rec["stage"] = stage
        rec["exception"] = _exc_record(exc)
        rec["traceback"] = "".join(traceback.format_exception(exc))[-3000:]
        if case.preference != "AUTO" and stage == "compile/run" and _is_declined(exc):
            rec["outcome"] = "declined"
        else:
            rec["outcome"], rec["why"] = "error", f"{stage}: {type(exc).__name__}: {str(exc)[:300]}"
    elif whys:
        rec["outcome"], rec["why"] = status, "; ".join(whys)
    elif not decisions:  # every case's model holds a quantized linear
        rec["outcome"], rec["why"] = "silent", "no report row for the model's quantized linear"
    elif case.extra.get("variant") not in classes.VARIANTS and (
        any(d["family"] != case.family and d["lowering"] for d in decisions)
        or all(d["family"] != case.family for d in decisions)
    ):
        rec["outcome"] = "misrecognized"  # a class's case: check_rows checks the family
        rec["why"] = f"decided as {sorted({d['family'] for d in decisions})}, not {case.family}"
    elif not lowered:
        rec["outcome"] = "left_alone"
    else:
        rec["outcome"] = "pass"
    # Wrong numbers or a crash: does stock torch.compile do the same? Where qlower lowered nothing that makes it
    # `upstream`; where it lowered something the failure stays qlower's, with stock's result noted.
    if rec["outcome"] in ("fail", "error") and rec.get("stage", "compile/run") == "compile/run":
        rec["stock"] = _stock_check(case)
        if not rec["stock"]["ok"] and not lowered:
            rec["outcome"] = "upstream"
        elif not rec["stock"]["ok"]:
            st = rec["stock"]
            rec["why"] += (
                f"; stock torch.compile fails too: {st.get('why') or st['exception']['message'][:120]}"
            )
    # Invariants of the decisions and the reports themselves (qlower's, whatever stock does).
    bad = None
    if exc is None and compiles == 0:
        bad = "qlower's pass never ran (an Inductor cache hit, or no compile?)"
    elif prog.problems:  # a pipeline class (pipelines.py) checks each of its compiles' preference itself
        bad = "; ".join(prog.problems)
    elif (
        case.preference != "AUTO"
        and case.extra.get("variant") not in pipelines.VARIANTS
        and any(d["kind"] != case.preference for d in lowered)
    ):
        bad = f"preference {case.preference} not honoured: {[(d['lowering'], d['kind']) for d in lowered]}"
    elif case.form == "partial_block" and any(d["kind"] != "EMULATED" for d in lowered):
        bad = f"K={case.k} (a partial last MX block) lowered to a kernel: {[d['lowering'] for d in lowered]}"
    elif case.form == "partial_block" and exc is None and not lowered:
        if not any("MX block" in (d["reason"] or "") for d in decisions):
            bad = "K % 32 != 0 not reported as left alone with its reason"
    elif exc is None and any(not ran or not rows for ran, rows in prog.reports):
        ran, rows = prog.reports[0]
        bad = (
            f"training: qlower.last_report() after forward + backward has pass_ran={ran}, {rows} rows "
            "(it should describe the compile that ran)"
        )
    elif exc is None and decisions:
        bad = classes.check_rows(case, decisions)
    if bad:
        rec["why"] = f"{rec['why']}; {bad}" if rec.get("why") else bad
        rec["outcome"] = rec["outcome"] if rec["outcome"] in ("error", "silent") else "fail"
    rec["time_s"] = round(time.perf_counter() - t0, 2)
    return rec


def _poison_freed_memory(case: Case, model: nn.Module) -> None:
    """Allocate and free NaN-filled blocks of the sizes a kernel of this case likely allocates, so that a kernel
    reading an uninitialized buffer reads NaN rather than stale correct values (an allocator hands a freed
    block of the same size back first)."""
    kp = -(-case.k // 32) * 32
    xs = [case.x_shape(case.m)] + ([case.x_shape(case.m2)] if case.dynamic else [])
    shapes = [tuple(t.shape) for t in (*model.buffers(), *model.parameters()) if t is not None] + xs
    shapes += [(case.n, case.k), (case.n, kp), (case.k, case.n), (case.n * kp,)]
    shapes += [(math.prod(x[:-1]), case.n) for x in xs]
    blocks = [
        torch.full(shape, math.nan, dtype=dt, device=case.device)
        for shape in shapes
        for dt in (torch.float32, torch.float64, DTYPES[case.dtype])
    ]
    del blocks


def _stock_check(case: Case, attempts: int = 3) -> dict[str, Any]:
    """The same case, models built afresh, through stock torch.compile (no qlower options). Several attempts:
    a kernel reading uninitialized memory is wrong only some of the time (seen on CPU). Stock's generated code
    is checked as qlower's is (`short_leading_dims`): Inductor views a 1-D activation [K] as [1, K] with
    strides (0, 1) for its own `mm` (family_order, x [K], dynamic_int8 off). A pipeline class (two_models,
    cache_switch, aoti_package) runs its plain steps here: its own flow compiles with qlower's options."""
    for attempt in range(1, attempts + 1):
        built = build(case)
        _poison_freed_memory(case, built.model)
        dims = LEADING_DIMS[0] = []
        try:
            obs = _execute(case, built, STOCK_STEPS, Progress())
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "attempt": attempt, "exception": _exc_record(e)}
        if dims:
            return {
                "ok": False,
                "attempt": attempt,
                "why": f"matmul operand with a short leading dimension: {dims[0]}",
            }
        status, _, whys = _judge(case, built.model, obs)
        if status == "fail":
            return {"ok": False, "attempt": attempt, "why": "; ".join(w for w in whys if w)}
    return {"ok": True, "attempts": attempts}
