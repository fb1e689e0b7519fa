"""Randomized correctness fuzz of qlower through `torch.compile`, for all three families.

Why: the unit tests pin a handful of shapes per lowering, while qlower's choices depend on M, K, N, dtype,
bias, batch dims, dynamic M and the kernel preference together (tile tables, M buckets, padding, swap-AB,
K/N alignment rules, decode kernels). This script draws random cases from those axes, compiles each one
with `qlower.inductor_options(...)`, runs it and compares the result with a float64 reference (or with the
eager model where that is the defined reference, as the GPU tests do), recording what qlower chose.

Each case is drawn from `random.Random(case_seed)` only, so any case re-runs alone with `--only SEED`:

    python -P scripts/fuzz_compile.py                                  # CUDA if available, else CPU
    python -P scripts/fuzz_compile.py --device cuda --cases 200 --budget-s 240
    python -P scripts/fuzz_compile.py --device cpu --cases 15          # CPU: smaller K, N (slow compiles)
    python -P scripts/fuzz_compile.py --device cuda --only 1234567     # re-run one case (seed from a summary)

Writes `fuzz_<device>.json` (every case: parameters, chosen lowerings, errors, exceptions) under `--out`
($OUT, else ./out), rewritten after each case, so a hard crash still leaves the case that was running
(`in_progress`).

Outcomes: `pass` (lowered, numbers right), `left_alone` (qlower left the linear to Inductor and said why,
numbers right), `declined` (an explicit kernel preference refused with qlower's UnsupportedPlatformError);
warnings: `unmatched` (no candidate recognized, numbers right), `misrecognized` (decided as another family
under `inductor_options()`'s default of every family, numbers right), `imprecise` (within the GPU tests'
relative bounds vs the reference, bf16 1e-2 say, but outside their tighter eager-relative ones), `upstream`
(wrong numbers or a crash in a graph qlower left alone, which stock torch.compile reproduces without
qlower); failures: `fail` (wrong numbers, NaN, wrong shape/dtype, preference not honoured, K % 32 != 0
lowered) and `error` (any other exception). Exit status 1 when a case failed or errored.

Needs torch (and Triton on CUDA) only: it imports tests/woq_models.py, tests/dynamic_int8_forms.py and
tests/mx_models.py (never their torchao builders), no pytest, expecttest or torchao.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import os
import platform
import random
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import dynamic_int8_forms as dyn  # noqa: E402
import mx_models  # noqa: E402
from woq_models import FORMS as WOQ_FORMS  # noqa: E402
from woq_models import WoqLinear  # noqa: E402

import qlower  # noqa: E402

FAMILIES = ("woq_int8", "dynamic_int8", "mx")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}

M_CHOICES = (1, 2, 3, 5, 8, 16, 17, 33, 64, 100, 128, 200, 256, 257, 1000)
INT8_K = (16, 48, 64, 100, 256, 1000, 4096)
INT8_K_ODD = (7, 33, 77, 129, 255, 999, 1025)  # K off every alignment: the forms take any K
N_NICE = (8, 16, 24, 33, 48, 64, 100, 127, 128, 255, 256, 257, 512, 1000, 1024, 2048, 2999, 3000)
MX_K = (32, 64, 96, 128, 160, 256, 320, 512, 1024, 2048, 4096)
MX_K_BAD = (16, 48, 80, 100, 136, 200, 1000)  # not multiples of 32: must be left alone with a reason

# Per device: largest K and N, largest rows * K * N (compiles dominate; the float64 reference and the CPU
# eager run of dynamic-int8 stay cheap), and the kernel-preference weights.
LIMITS = {
    "cuda": dict(k=4096, n=3000, macs=1 << 30, dyn_macs=1 << 28),
    "cpu": dict(k=512, n=512, macs=1 << 22, dyn_macs=1 << 22),
}
PREFERENCE_WEIGHTS = {
    "cuda": {"AUTO": 40, "TRITON": 35, "EMULATED": 12, "ATEN": 13},
    "cpu": {"AUTO": 55, "EMULATED": 20, "ATEN": 15, "TRITON": 10},
}

# dynamic-int8 forms (tests/dynamic_int8_forms.py), as tests/test_dynamic_int8_numerics.py uses them
DYN_FORMS: dict[str, tuple[type, dict[str, Any]]] = {
    "IntMMDivide": (dyn.IntMMDivide, {}),
    "IntMMReciprocal": (dyn.IntMMReciprocal, {}),
    "OutDtypeMM": (dyn.OutDtypeMM, {}),
    "Int32MM": (dyn.Int32MM, {}),
    "FloatCarrier": (dyn.FloatCarrier, {}),
    "DequantBoth": (dyn.DequantBoth, {}),
    "DequantEinsum": (dyn.DequantEinsum, {}),
    "AsymInt32": (dyn.AsymInt32, {}),
    "PT2E": (dyn.PT2E, {}),
    "PT2E_asym": (dyn.PT2E, {"asymmetric": True}),
}
MX_HAND_WRITTEN = tuple(mx_models.hand_written_forms(32, 32))
# (activation format or None: weight-only, weight format) of tests/mx_models.py's MXLinear
MX_LINEAR_FORMATS = (
    (None, "e4m3"),
    (None, "e2m1"),
    (None, "e5m2"),
    ("e4m3", "e4m3"),
    ("e2m1", "e2m1"),
    ("e4m3", "e2m1"),
)

# Relative (norm) error bounds vs the reference, as the GPU tests use them.
REL_TOL = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-4}
MX_REL_TOL = 1e-2  # MXFP8 and MXFP4 alike: only the activation dtype's rounding is left


# ------------------------------------------------------------------------------------------ models (MX)
class MXFormModule(nn.Module):
    """A hand-written MX form f(x, q, e) of tests/mx_models.py with q, e as buffers (static under dynamic=True)."""

    def __init__(self, name: str, n: int, k: int, seed: int) -> None:
        super().__init__()
        self.name, self.fn = name, mx_models.hand_written_forms(n, k)[name]
        _, q, e = mx_models.form_inputs(name, n, k, m=1, seed=seed)
        self.register_buffer("q", q)
        self.register_buffer("e", e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.q, self.e)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        y = mx_models.reference(self.name, x, self.q, self.e)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class MXPartialBlock(nn.Module):
    """tests/test_mx_cpu.py's K-not-a-multiple-of-32 spelling: qlower must leave it alone, with a reason."""

    def __init__(self, n: int, k: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("q", (torch.randn(n, k, generator=g) * 0.1).to(torch.float8_e4m3fn))
        self.register_buffer("e", torch.randint(120, 131, (n, -(-k // 32)), generator=g, dtype=torch.uint8))
        self.k = k

    def scale(self) -> torch.Tensor:
        return torch.exp2(self.e.float() - 127).repeat_interleave(32, dim=1)[:, : self.k]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, (self.q.float() * self.scale()).to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() @ (self.q.double() * self.scale().double()).t()


# ------------------------------------------------------------------------------------------ cases
@dataclass
class Case:
    seed: int
    device: str
    family: str
    form: str
    dtype: str
    m: int  # rows per batch entry (the dim marked dynamic)
    k: int
    n: int
    batch: int | None  # None: 2-D input [M, K]; else [batch, M, K]
    bias: bool
    preference: str
    dynamic: bool
    m2: int | None = None  # the second call's M (dynamic cases)
    extra: dict[str, Any] = field(default_factory=dict)

    def x_shape(self, m: int) -> tuple[int, ...]:
        return (m, self.k) if self.batch is None else (self.batch, m, self.k)

    def describe(self) -> str:
        ext = "".join(f" {k}={v}" for k, v in self.extra.items())
        dyn_ = f" dyn(M {self.m}->{self.m2})" if self.dynamic else ""
        shape = "x".join(map(str, self.x_shape(self.m)))
        return (
            f"{self.family} {self.form} {SHORT[self.dtype]} x={shape} "
            f"N={self.n}{' bias' if self.bias else ''}{ext} pref={self.preference}{dyn_}"
        )


def _weighted(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _pick_n(rng: random.Random, cap: int) -> int:
    if rng.random() < 0.5:
        return rng.choice([n for n in N_NICE if n <= cap])
    return rng.randint(8, cap)


def make_case(seed: int, device: str, families: tuple[str, ...]) -> Case:
    """Every random choice of one case, from `random.Random(seed)` and the device alone."""
    rng = random.Random(seed)
    lim = LIMITS[device]
    family = rng.choice(families)
    extra: dict[str, Any] = {}
    bias = rng.random() < 0.5
    macs = lim["macs"]
    if family == "woq_int8":
        form = rng.choice(WOQ_FORMS)
        dtype = rng.choice(("bfloat16", "float16"))
        if form != "unscaled" and rng.random() < 0.3:
            extra["scale_dtype"] = "float32"
        k_choices = [k for k in INT8_K + INT8_K_ODD if k <= lim["k"]]
    elif family == "dynamic_int8":
        form = rng.choice(list(DYN_FORMS))
        dtype = rng.choice(("float32", "bfloat16", "float16"))
        extra["kn"] = rng.random() < 0.3
        k_choices = [k for k in INT8_K + INT8_K_ODD if k <= lim["k"]]
        macs = lim["dyn_macs"]  # eager runs on CPU (CUDA _int_mm rejects small M / odd K, N; no int32 mm)
    else:
        r = rng.random()
        form = "partial_block" if r < 0.1 else rng.choice(MX_HAND_WRITTEN) if r < 0.5 else "mx_linear"
        dtype = rng.choice(("bfloat16", "float16"))
        if form == "mx_linear":
            a_elem, w_elem = rng.choice(MX_LINEAR_FORMATS)
            extra.update(act=a_elem or "none", weight=w_elem, e8m0=rng.random() < 0.3)
        else:
            bias = form == "fp4_bits_bias_3d"  # the hand-written forms fix their bias
        k_choices = [k for k in (MX_K_BAD if form == "partial_block" else MX_K) if k <= lim["k"]]
    preference = _weighted(rng, PREFERENCE_WEIGHTS[device])
    if rng.random() < 0.5:  # inductor_options() with every family (the default), else just this one
        extra["all_families"] = True
    dynamic = rng.random() < 0.25
    batch = None if rng.random() < 0.5 else rng.choice((1, 2, 3))
    m_choices = [m for m in M_CHOICES if m >= 2] if dynamic else list(M_CHOICES)  # mark_dynamic needs M >= 2
    for _ in range(100):  # rejection sampling keeps the size distribution honest under the cap
        m, k, n = rng.choice(m_choices), rng.choice(k_choices), _pick_n(rng, lim["n"])
        m2 = rng.choice([v for v in M_CHOICES if v != m]) if dynamic else None
        rows = max(m, m2 or 0) * (batch or 1)
        if rows * k * n <= macs:
            break
    else:
        m, k, n, m2 = 2, min(k_choices), 8, (3 if dynamic else None)
    return Case(seed, device, family, form, dtype, m, k, n, batch, bias, preference, dynamic, m2, extra)


# ------------------------------------------------------------------------------------------ build, check
def _to_device(model: nn.Module, dev: str) -> nn.Module:
    """model.to(dev), moving 1-byte float buffers (fp8, e8m0 scales) as their bytes."""
    for mod in model.modules():
        for name, b in list(mod._buffers.items()):
            if b is not None and b.element_size() == 1 and b.dtype not in (torch.int8, torch.uint8):
                mod._buffers[name] = b.view(torch.uint8).to(dev).view(b.dtype)
    return model.to(dev)


def build(case: Case) -> tuple[nn.Module, Any, Any]:
    """(model on the device, eager(x), reference(x) in float64 or None when eager is the reference)."""
    dev, dtype, s = case.device, DTYPES[case.dtype], case.seed % (1 << 31)
    if case.family == "woq_int8":
        sdt = DTYPES.get(case.extra.get("scale_dtype", ""))
        model = WoqLinear(case.k, case.n, dtype, form=case.form, bias=case.bias, scale_dtype=sdt, seed=s)
        model = _to_device(model, dev)
        return model, model, model.reference
    if case.family == "dynamic_int8":
        cls, kw = DYN_FORMS[case.form]
        cpu_model = cls(case.k, case.n, bias=case.bias, kn=case.extra["kn"], seed=s, **kw)
        model = _to_device(copy.deepcopy(cpu_model), dev)

        def eager(x: torch.Tensor) -> torch.Tensor:  # on CPU: eager CUDA _int_mm rejects M <= 16, odd K/N
            return cpu_model(x.cpu()).to(x.device)

        return model, eager, model.reference
    if case.form == "partial_block":
        model = _to_device(MXPartialBlock(case.n, case.k, s), dev)
        return model, model, model.reference
    if case.form == "mx_linear":
        a_elem = None if case.extra["act"] == "none" else case.extra["act"]
        model = mx_models.MXLinear(
            a_elem, case.extra["weight"], case.n, case.k, case.extra["e8m0"], case.bias, s
        )
        model = _to_device(model, dev)
        return model, model, (model.reference if a_elem is None else None)
    model = _to_device(MXFormModule(case.form, case.n, case.k, s), dev)
    return model, model, model.reference


def make_x(case: Case, m: int, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed((case.seed * 7919 + salt) % (1 << 62))
    x = torch.randn(case.x_shape(m), generator=g)
    if case.family == "dynamic_int8":
        x = x * 2.0 + 0.3  # as the tests: an offset, so asymmetric zero points are not 0
    return x.to(DTYPES[case.dtype]).to(case.device)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    den = b.norm().item()
    return (a - b).norm().item() / den if den else (a - b).norm().item()


def check(
    case: Case, model: nn.Module, x: torch.Tensor, out: Any, eager: torch.Tensor, ref: torch.Tensor | None
) -> tuple[str, dict, str]:
    """('ok' | 'imprecise' | 'fail', metrics, why).

    'fail': wrong numbers (the GPU tests' relative bounds vs the reference: bf16 1e-2, MX 1e-2), NaN/inf, a
    wrong shape or dtype. 'imprecise': within those bounds, but outside the tighter eager-relative ones the
    tests also apply (woq_models.assert_close_to_reference; test_dynamic_int8_gpu._check).
    """
    if not isinstance(out, torch.Tensor):
        return "fail", {}, f"output is {type(out).__name__}, not a tensor"
    if out.shape != eager.shape or out.dtype != eager.dtype:
        return (
            "fail",
            {},
            f"output {tuple(out.shape)} {out.dtype} vs eager {tuple(eager.shape)} {eager.dtype}",
        )
    o, e = out.detach().double(), eager.detach().double().to(out.device)
    met: dict[str, Any] = {"finite": bool(torch.isfinite(o).all())}
    if not met["finite"]:
        met["nonfinite"] = int((~torch.isfinite(o)).sum())
        eager_finite = bool(torch.isfinite(e).all())
        return "fail", met, f"{met['nonfinite']} non-finite outputs (eager finite: {eager_finite})"
    r = e if ref is None else ref.double().to(out.device)
    if not r.numel():
        return "ok", met, ""
    scale = r.abs().max().item()
    met.update(
        rel_err=_rel(o, r),
        eager_rel_err=_rel(e, r),
        rel_err_vs_eager=_rel(o, e),
        max_err=(o - r).abs().max().item(),
        eager_max_err=(e - r).abs().max().item(),
        max_diff_vs_eager=(o - e).abs().max().item(),
        ref="eager" if ref is None else "float64",
    )
    eps = torch.finfo(DTYPES[case.dtype]).eps
    if case.family == "woq_int8":
        tol = REL_TOL[case.dtype]
        if met["rel_err"] > tol:
            return "fail", met, f"rel err {met['rel_err']:.3g} > {tol:g}"
        bound = max(2.0 * met["eager_max_err"], 2 * torch.finfo(out.dtype).eps * scale)
        if met["max_err"] > bound:
            why = f"max err {met['max_err']:.3g} > {bound:.3g} = max(2x eager's {met['eager_max_err']:.3g}, 2 ulp)"
            return "imprecise", met, why
        return "ok", met, ""
    if case.family == "dynamic_int8":
        # The reference is the unquantized-activation linear: eager's own error is the quantization noise.
        tol = 2.0 * met["eager_rel_err"] + 2 * eps
        if met["rel_err"] > tol:
            return (
                "fail",
                met,
                f"rel err {met['rel_err']:.3g} > {tol:.3g} (2x eager's {met['eager_rel_err']:.3g})",
            )
        if case.dtype == "float32":  # eager and compiled quantize x alike: test_dynamic_int8_gpu's bounds
            # ... plus one activation step per output, for a tie rounded the other way (a scale's reciprocal)
            q_nk = model.q_nk().float().abs() * model.s.float().abs()[:, None]
            step = x.float().abs().amax().item() / 127 * q_nk.max().item()
            bound, close = 1.05 * met["eager_max_err"] + 1e-4 * scale, 1e-3 * scale + step
        else:  # Inductor computes half-precision quantization parameters in fp32: other roundings than eager
            bound, close = 1.5 * met["eager_max_err"] + 2 * eps * scale, math.inf
        if met["max_err"] > bound:
            why = f"max err {met['max_err']:.3g} > {bound:.3g} (vs eager's {met['eager_max_err']:.3g})"
            return "imprecise", met, why
        if met["max_diff_vs_eager"] > close:
            return "imprecise", met, f"max |out - eager| {met['max_diff_vs_eager']:.3g} > {close:.3g}"
        return "ok", met, ""
    if met["rel_err"] > MX_REL_TOL:
        return "fail", met, f"rel err {met['rel_err']:.3g} > {MX_REL_TOL:g} vs {met['ref']}"
    return "ok", met, ""


# ------------------------------------------------------------------------------------------ running
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
        }
        for r in reports
        for d in r.entries
    ]
    return out, sum(r.pass_ran for r in reports), sum(not r.pass_ran for r in reports)


def _families(case: Case) -> tuple[str, ...] | None:
    return None if case.extra.get("all_families") else (case.family,)


def _compile(model: nn.Module, case: Case, with_qlower: bool = True):
    torch._dynamo.reset()
    qlower.clear_reports()
    opts = (
        {"options": qlower.inductor_options(kernel_preference=case.preference, families=_families(case))}
        if with_qlower
        else {}
    )
    return torch.compile(model, dynamic=case.dynamic or None, fullgraph=True, **opts)


def _run_calls(case: Case, compiled, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    outs = []
    for i, x in enumerate(xs):
        if case.dynamic and i == 0:
            torch._dynamo.mark_dynamic(x, x.dim() - 2)
        outs.append(compiled(x))
    if case.device == "cuda":
        torch.cuda.synchronize()
    return outs


def run_case(case: Case) -> dict[str, Any]:
    rec: dict[str, Any] = {**asdict(case), "description": case.describe()}
    t0 = time.perf_counter()
    outs: list[torch.Tensor] = []
    exc: BaseException | None = None
    stage = "build"
    with torch.no_grad():
        try:
            model, eager_fn, ref_fn = build(case)
            xs = [make_x(case, case.m, 0)] + ([make_x(case, case.m2, 1)] if case.dynamic else [])
            stage = "compile/run"
            outs = _run_calls(case, _compile(model, case), xs)
        except Exception as e:  # noqa: BLE001 - every exception is a fuzz result
            exc = e
        decisions, compiles, missed = _decisions()
        rec.update(decisions=decisions, compiles=compiles, compiles_without_pass=missed)
        rec["lowerings"] = sorted({d["lowering"] or "-- left alone --" for d in decisions})
        rec["report"] = "\n\n".join(r.table() for r in qlower.all_reports())
        lowered = [d for d in decisions if d["lowering"]]
        metrics, whys, status = [], [], "ok"
        if exc is None:
            stage = "check (eager model or reference)"
            try:
                for i, (x, out) in enumerate(zip(xs, outs, strict=True)):
                    eager = eager_fn(x)
                    ref = None if ref_fn is None else ref_fn(x)
                    st, met, why = check(case, model, x, out, eager, ref)
                    metrics.append({"call": i, "m": x.shape[-2], "status": st, **met})
                    if st != "ok":
                        whys.append(f"call {i} (M={x.shape[-2]}): {why}")
                        status = "fail" if "fail" in (st, status) else st
            except Exception as e:  # noqa: BLE001
                exc = e
            rec["metrics"] = metrics
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
        elif any(d["family"] != case.family for d in decisions):
            rec["outcome"] = "misrecognized"
            rec["why"] = f"decided as {sorted({d['family'] for d in decisions})}, not {case.family}"
        elif not decisions:
            rec["outcome"] = "unmatched"
        elif not lowered:
            rec["outcome"] = "left_alone"
        else:
            rec["outcome"] = "pass"
        # Wrong numbers or a crash where qlower lowered nothing: does stock torch.compile do the same?
        if (
            rec["outcome"] in ("fail", "error")
            and rec.get("stage", "compile/run") == "compile/run"
            and not lowered
        ):
            rec["stock"] = _stock_check(case, model, eager_fn, ref_fn, xs)
            if not rec["stock"]["ok"]:
                rec["outcome"] = "upstream"
        # Invariants of the decisions themselves.
        bad = None
        if exc is None and compiles == 0:
            bad = "qlower's pass never ran (an Inductor cache hit, or no compile?)"
        elif case.preference != "AUTO" and any(d["kind"] != case.preference for d in lowered):
            bad = (
                f"preference {case.preference} not honoured: {[(d['lowering'], d['kind']) for d in lowered]}"
            )
        elif case.form == "partial_block" and lowered:
            bad = f"K={case.k} (not a multiple of 32) was lowered"
        elif case.form == "partial_block" and exc is None:
            if not any("multiple of the MX block size" in (d["reason"] or "") for d in decisions):
                bad = "K % 32 != 0 not reported as left alone with its reason"
        if bad:
            rec["why"] = f"{rec['why']}; {bad}" if rec.get("why") else bad
            rec["outcome"] = "fail" if rec["outcome"] != "error" else "error"
    rec["time_s"] = round(time.perf_counter() - t0, 2)
    return rec


def _poison_freed_memory(case: Case, model: nn.Module, xs: list[torch.Tensor]) -> None:
    """Allocate and free NaN-filled blocks of the sizes a kernel of this case likely allocates, so that a kernel
    reading an uninitialized buffer reads NaN rather than stale correct values (an allocator hands a freed
    block of the same size back first)."""
    kp = -(-case.k // 32) * 32
    shapes = [tuple(t.shape) for t in (*model.buffers(), *model.parameters(), *xs) if t is not None]
    shapes += [(case.n, case.k), (case.n, kp), (case.k, case.n), (case.n * kp,)]
    shapes += [(math.prod(x.shape[:-1]), case.n) for x in xs]
    blocks = [
        torch.full(shape, math.nan, dtype=dt, device=case.device)
        for shape in shapes
        for dt in (torch.float32, torch.float64, DTYPES[case.dtype])
    ]
    del blocks


def _stock_check(case: Case, model, eager_fn, ref_fn, xs, attempts: int = 3) -> dict[str, Any]:
    """The same case through stock torch.compile (no qlower options). Several attempts: a kernel reading
    uninitialized memory is wrong only some of the time (seen on CPU)."""
    for attempt in range(1, attempts + 1):
        _poison_freed_memory(case, model, xs)
        try:
            outs = _run_calls(case, _compile(model, case, with_qlower=False), xs)
        except Exception as e:  # noqa: BLE001
            return {"ok": False, "attempt": attempt, "exception": _exc_record(e)}
        whys = []
        for x, out in zip(xs, outs, strict=True):
            st, _, why = check(case, model, x, out, eager_fn(x), None if ref_fn is None else ref_fn(x))
            if st == "fail":
                whys.append(why)
        if whys:
            return {"ok": False, "attempt": attempt, "why": "; ".join(whys)}
    return {"ok": True, "attempts": attempts}


def _line(i: int, total: int, rec: dict[str, Any]) -> str:
    mets = rec.get("metrics") or []
    rel = max((m.get("rel_err", math.nan) for m in mets), default=math.nan)
    low = ",".join(rec.get("lowerings") or []) or "-"
    tail = f"rel={rel:.2e}" if mets else ""
    if "why" in rec:
        tail += f" WHY: {rec['why'][:200]}"
    elif rec["outcome"] == "declined":
        msg = rec["exception"]["root_message"]
        tail += f" ({msg[:160]}{'...' if len(msg) > 160 else ''})"
    return (
        f"[{i:3d}/{total}] seed={rec['seed']:<10d} {rec['outcome'].upper():10s} {rec['description']} "
        f"-> {low} {tail} ({rec['time_s']:.1f}s)"
    )


ACCEPTABLE = ("pass", "left_alone", "unmatched", "misrecognized", "declined", "imprecise")


def summarize(records: list[dict[str, Any]], device: str, families: tuple[str, ...]) -> dict[str, Any]:
    outcome = collections.Counter(r["outcome"] for r in records)
    by_family: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_lowering: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_pref: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        by_family[r["family"]][r["outcome"]] += 1
        by_pref[r["preference"]][r["outcome"]] += 1
        for lw in r.get("lowerings") or ["(no decision)"]:
            by_lowering[r["family"]][lw] += 1

    fam = "" if families == FAMILIES else " --families " + " ".join(families)  # cases depend on it

    def listed(*outcomes: str) -> list[dict[str, Any]]:
        return [
            {
                "seed": r["seed"],
                "outcome": r["outcome"],
                "case": r["description"],
                "why": r.get("why", ""),
                "rerun": f"python -P scripts/fuzz_compile.py --device {device} --only {r['seed']}{fam}",
            }
            for r in records
            if r["outcome"] in outcomes
        ]

    return {
        "cases": len(records),
        "outcomes": dict(outcome),
        "by_family": {k: dict(v) for k, v in by_family.items()},
        "by_preference": {k: dict(v) for k, v in by_pref.items()},
        "lowerings": {k: dict(v) for k, v in by_lowering.items()},
        "unmatched": listed("unmatched"),
        "misrecognized": listed("misrecognized"),
        "imprecise": listed("imprecise"),
        "upstream": listed("upstream"),
        "failures": listed("fail", "error"),
    }


def _print_summary(summary: dict[str, Any], elapsed: float, stopped: str | None) -> None:
    print(
        f"\n==== qlower compile fuzz: {summary['cases']} cases in {elapsed:.0f}s"
        + (f" ({stopped})" if stopped else "")
    )
    print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["outcomes"].items())))
    for fam, c in sorted(summary["by_family"].items()):
        print(f"  {fam:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("by preference:")
    for pref, c in sorted(summary["by_preference"].items()):
        print(f"  {pref:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("lowerings chosen (cases):")
    for fam, c in sorted(summary["lowerings"].items()):
        print(f"  {fam:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])))
    for key, title in (
        ("unmatched", "no candidate recognized (numbers right; a warning)"),
        ("misrecognized", "decided as another family (numbers right; a warning)"),
        ("imprecise", "within the tests' relative bounds, outside their eager-relative ones (a warning)"),
        ("upstream", "stock torch.compile fails the same way without qlower (not qlower's)"),
        ("failures", "qlower failures"),
    ):
        print(f"{title}: {len(summary[key])}")
        for f in summary[key]:
            why = f"\n      {f['why'][:300]}" if f["why"] else ""
            print(f"  seed={f['seed']} {f['outcome']}: {f['case']}{why}\n      rerun: {f['rerun']}")


def _configure() -> None:
    """No silent eager fallback, no cache hits that skip qlower's pass, no PGO state carried across runs."""
    dc = torch._dynamo.config
    for name, value in (
        ("cache_size_limit", 1024),
        ("recompile_limit", 1024),
        ("accumulated_cache_size_limit", 1 << 16),
        ("accumulated_recompile_limit", 1 << 16),
        ("fail_on_recompile_limit_hit", True),
        ("suppress_errors", False),
        ("automatic_dynamic_local_pgo", False),
        ("automatic_dynamic_remote_pgo", False),
    ):
        if hasattr(dc, name):
            setattr(dc, name, value)
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.fx_graph_remote_cache = False
    torch._functorch.config.enable_autograd_cache = False


def _environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["capability"] = list(torch.cuda.get_device_capability())
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="seed of the case seeds")
    p.add_argument("--budget-s", type=float, default=240.0, help="start no new case after this many seconds")
    p.add_argument("--out", default=os.environ.get("OUT") or "out")
    p.add_argument("--only", type=int, nargs="+", metavar="SEED", help="run just these case seeds")
    p.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    p.add_argument("--verbose", action="store_true", help="print qlower's report table of every case")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available")
    _configure()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"fuzz_{args.device}.json"
    master = random.Random(args.seed)
    seeds = args.only or [master.randrange(1 << 31) for _ in range(args.cases)]
    families = tuple(args.families)
    doc: dict[str, Any] = {
        "args": vars(args),
        "environment": _environment(args.device),
        "cases": [],
        "in_progress": None,
    }

    def dump() -> None:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(path)

    print(
        f"qlower compile fuzz on {args.device} ({doc['environment']}), {len(seeds)} cases -> {path}",
        flush=True,
    )
    start, stopped = time.perf_counter(), None
    for i, seed in enumerate(seeds, 1):
        if time.perf_counter() - start > args.budget_s:
            stopped = f"budget of {args.budget_s:g}s spent; {len(seeds) - i + 1} cases not started"
            break
        case = make_case(seed, args.device, families)
        doc["in_progress"] = {**asdict(case), "description": case.describe()}
        dump()
        rec = run_case(case)
        doc["cases"].append(rec)
        doc["in_progress"] = None
        dump()
        print(_line(i, len(seeds), rec), flush=True)
        if args.verbose or rec["outcome"] not in ACCEPTABLE:
            print("    " + rec["report"].replace("\n", "\n    "))
            if "traceback" in rec and rec["outcome"] not in ACCEPTABLE:
                print("    " + rec["traceback"][-1500:].replace("\n", "\n    "))
        if args.device == "cuda" and rec["outcome"] not in ACCEPTABLE:
            try:  # an illegal memory access poisons the context: later cases would all fail
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                stopped = f"CUDA context lost after seed {seed}: {str(e)[:200]}"
                break
    elapsed = time.perf_counter() - start
    doc["summary"] = summarize(doc["cases"], args.device, families)
    doc["elapsed_s"] = round(elapsed, 1)
    doc["stopped"] = stopped
    dump()
    _print_summary(doc["summary"], elapsed, stopped)
    print(f"wrote {path}")
    return 1 if doc["summary"]["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
