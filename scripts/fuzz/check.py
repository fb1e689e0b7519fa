"""How the fuzz judges one compiled output or gradient: against the float64 reference (or eager, where that
is the defined reference) with the GPU tests' bounds."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from scripts.fuzz import classes
from scripts.fuzz.case import DTYPES, Case

# Relative (norm) error bounds vs the reference, as the GPU tests use them.
REL_TOL = {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-4}
MX_REL_TOL = 1e-2  # MXFP8 and MXFP4 alike: only the activation dtype's rounding is left
GRAD_EAGER_TOL = (
    2e-2  # gradients checked against eager only (no float64 twin): catches missing terms, not ulps
)
MX_TRAINING_GRAD_TOL = 1e-2  # torchao's eager MX decodes the same: only bf16 rounding (test_mx_training.py)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    den = b.norm().item()
    return (a - b).norm().item() / den if den else (a - b).norm().item()


def check(
    case: Case, model: nn.Module, x: torch.Tensor, out: Any, eager: torch.Tensor, ref: torch.Tensor | None
) -> tuple[str, dict, str]:
    """('ok' | 'imprecise' | 'fail', metrics, why).

    'fail': wrong numbers (the GPU tests' relative bounds vs the reference: bf16 1e-2, MX 1e-2, or 2x eager's
    own error where that is larger: the user's formula rounding subnormals, say), NaN/inf, a wrong shape or
    dtype. 'imprecise': within those bounds, but outside the tighter eager-relative ones the tests also apply
    (woq_forms.assert_close_to_reference; test_dynamic_int8_gpu._check).
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
    r = e if ref is None else ref.detach().double().to(out.device)
    met: dict[str, Any] = {"finite": bool(torch.isfinite(o).all())}
    special = ~torch.isfinite(e)  # NaN / Inf the user's own formula gives (mx_special's spec_codes)
    if not met["finite"] or special.any():
        met["nonfinite"] = int((~torch.isfinite(o)).sum())
        same = torch.equal(o.isnan(), e.isnan()) and torch.equal(o.isinf(), e.isinf())
        if not (same and torch.equal(o[o.isinf()], e[e.isinf()])):
            why = f"{met['nonfinite']} non-finite outputs where eager has {int(special.sum())}, not the same ones"
            return "fail", met, why
        o, e, r = (t.masked_fill(special, 0.0) for t in (o, e, r))  # compare the finite rest
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
    if case.extra.get("variant") in classes.VARIANTS:  # one bound: the class checks decisions, not kernels
        tol = max(MX_REL_TOL if case.family == "mx" else REL_TOL[case.dtype], 2.0 * met["eager_rel_err"])
        if met["rel_err"] > tol:
            return "fail", met, f"rel err {met['rel_err']:.3g} > {tol:.3g} vs {met['ref']}"
        return "ok", met, ""
    if case.family == "woq_int8":
        tol = max(REL_TOL[case.dtype], 2.0 * met["eager_rel_err"])
        if met["rel_err"] > tol:
            return (
                "fail",
                met,
                f"rel err {met['rel_err']:.3g} > {tol:.3g} (eager's {met['eager_rel_err']:.3g})",
            )
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
            base = getattr(model, "inner", model)  # HeadsEpilogue: its linear; `gain` scales a step after it
            q_nk = base.q_nk().float().abs() * base.s.detach().float().abs().reshape(-1, 1)
            step = x.float().abs().amax().item() / 127 * q_nk.max().item() * getattr(model, "gain", 1.0)
            bound, close = 1.05 * met["eager_max_err"] + 1e-4 * scale, 1e-3 * scale + step
        else:  # Inductor computes half-precision quantization parameters in fp32: other roundings than eager
            bound, close = 1.5 * met["eager_max_err"] + 2 * eps * scale, math.inf
        if met["max_err"] > bound:
            why = f"max err {met['max_err']:.3g} > {bound:.3g} (vs eager's {met['eager_max_err']:.3g})"
            return "imprecise", met, why
        if met["max_diff_vs_eager"] > close:
            return "imprecise", met, f"max |out - eager| {met['max_diff_vs_eager']:.3g} > {close:.3g}"
        return "ok", met, ""
    tol = max(MX_REL_TOL, 2.0 * met["eager_rel_err"])
    if met["rel_err"] > tol:
        return "fail", met, f"rel err {met['rel_err']:.3g} > {tol:.3g} vs {met['ref']}"
    return "ok", met, ""


def check_grad(
    case: Case, name: str, got: torch.Tensor | None, eager: torch.Tensor | None, ref: torch.Tensor | None
) -> tuple[str, dict, str]:
    """('ok' | 'fail', metrics, why) for one gradient (training): against float64 where the reference is the
    model's own function (max(2x the forward bound, 2x eager's error)), else against eager (GRAD_EAGER_TOL)."""
    if got is None or eager is None:
        if got is None and eager is None:
            return "ok", {}, ""
        return "fail", {}, f"grad of {name}: compiled {got is not None}, eager {eager is not None}"
    if got.shape != eager.shape or got.dtype != eager.dtype:
        return (
            "fail",
            {},
            f"grad of {name}: {tuple(got.shape)} {got.dtype} vs eager {tuple(eager.shape)} {eager.dtype}",
        )
    c, e = got.double(), eager.double().to(got.device)
    if not bool(torch.isfinite(c).all()):
        return "fail", {}, f"grad of {name}: non-finite (eager finite: {bool(torch.isfinite(e).all())})"
    met: dict[str, Any] = {"rel_err_vs_eager": _rel(c, e)}
    if ref is not None:
        r = ref.double().to(got.device)
        met.update(rel_err=_rel(c, r), eager_rel_err=_rel(e, r))
        base = MX_REL_TOL if case.family == "mx" else REL_TOL[case.dtype]
        tol = max(2.0 * base, 2.0 * met["eager_rel_err"])
        if met["rel_err"] > tol:
            return "fail", met, f"grad of {name}: rel err {met['rel_err']:.3g} > {tol:.3g} vs float64"
    elif met["rel_err_vs_eager"] > (
        tol := MX_TRAINING_GRAD_TOL if case.extra.get("variant") == "mx_training" else GRAD_EAGER_TOL
    ):
        return "fail", met, f"grad of {name}: rel err vs eager {met['rel_err_vs_eager']:.3g} > {tol:g}"
    return "ok", met, ""
