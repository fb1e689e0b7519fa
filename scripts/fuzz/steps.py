"""The calls of one case: the compile with its options, a call (under CUDA graphs the third of three), the
weight write of `weight_write`, forward + backward for the training variants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import qlower
from scripts.fuzz import classes
from scripts.fuzz.case import Case
from scripts.fuzz.models import Built, tensor_at, write_names


def compile_families(case: Case) -> tuple[str, ...] | None:
    drawn = classes.families(case)  # family_order: an order and subset of its own
    if drawn is not None:
        return drawn
    return None if case.extra.get("all_families") else (case.family,)


def compile_case(model: nn.Module, case: Case, with_qlower: bool = True):
    torch._dynamo.reset()
    qlower.clear_reports()
    graphs = bool(case.extra.get("cudagraphs"))
    mode = "reduce-overhead" if graphs else None
    opts = (
        {
            "options": qlower.inductor_options(
                kernel_preference=case.preference, families=compile_families(case), mode=mode
            )
        }
        if with_qlower
        else ({"mode": mode} if graphs else {})
    )
    return torch.compile(model, dynamic=case.dynamic or None, fullgraph=True, **opts)


def call_compiled(compiled, x: torch.Tensor, case: Case) -> Any:
    """One call; under CUDA graphs (`cudagraphs`) the third of three (warm-up, recording, replay), cloned
    before the next call's replay overwrites it."""
    if not case.extra.get("cudagraphs"):
        return compiled(x)
    for _ in range(3):
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(x)
    return out.clone()


@dataclass
class Progress:
    """Where a case is (an exception's stage) and what its run noticed besides numbers."""

    stage: str = "build"
    reports: list[tuple[bool, int]] = field(
        default_factory=list
    )  # training: (pass_ran, rows) of last_report()
    problems: list[str] = field(default_factory=list)  # a pipeline class's broken invariants (pipelines.py)


@dataclass
class Obs:
    """One compiled call and what it is checked against."""

    x: torch.Tensor
    out: Any
    eager: torch.Tensor
    ref: torch.Tensor | None
    after_write: bool = False
    grads: list[tuple[str, Any, Any, Any]] = field(default_factory=list)  # (name, compiled, eager, float64)
    state: dict[str, torch.Tensor] | None = None  # differential mode: the weights this call ran with
    checked: bool = True  # differential mode: calls before the write have no reference


def differential(case: Case) -> bool:
    """Whether the case forces an int8 ISA the CPU lacks (`isa=vnni` on an AVX2 CPU, to reach the prepack
    cache): the forced u8s8 kernels then round differently from eager (AVX2's u8 x s8 pair sums saturate int16),
    so a call after the weight write is compared with a fresh compile of the written model instead: a stale
    read shows, the forced kernels' own precision does not."""
    isa = case.extra.get("isa")
    return (
        bool(isa)
        and case.device == "cpu"
        and not (torch.cpu._is_vnni_supported() or torch.cpu._is_amx_tile_supported())
    )


def case_steps(case: Case) -> list[str]:
    """The calls of a case: M, (a weight write, M again), then M2 for a dynamic M."""
    steps = ["m"]
    if case.extra.get("variant") == "weight_write":
        steps += ["write", "m"]
    return steps + (["m2"] if case.dynamic else [])


def _new_values(case: Case, built: Built) -> dict[str, torch.Tensor]:
    """Fresh values for the tensors weight_write overwrites (same shape and dtype, on the CPU)."""
    g = torch.Generator().manual_seed((case.seed * 31 + 5) % (1 << 62))
    out = {}
    for name in write_names(case, built.model):
        t = tensor_at(built.model, name).detach().cpu()
        if t.dtype == torch.int8:
            v = torch.randint(-127, 128, t.shape, generator=g, dtype=torch.int8)
        elif t.dtype == torch.uint8 and name.endswith("q"):  # packed fp4: any byte is two valid codes
            v = torch.randint(0, 256, t.shape, generator=g, dtype=torch.uint8)
        elif t.element_size() == 1 and name.endswith("q"):  # fp8 elements, away from NaN and saturation
            v = (torch.randn(t.shape, generator=g) * 4).to(t.dtype)
        elif t.element_size() == 1:  # e8m0 codes (uint8 or float8_e8m0fnu): a few binades either way
            c = t.view(torch.uint8).int() + torch.randint(-2, 3, t.shape, generator=g)
            v = c.clamp(0, 254).to(torch.uint8).view(t.dtype)
        else:  # a float scale
            v = t * (0.5 + 1.5 * torch.rand(t.shape, generator=g)).to(t.dtype)
        out[name] = v
    return out


def write_weights(case: Case, built: Built) -> None:
    """Overwrite the weight (and maybe its scale) through the case's API, then mirror it into the eager twin."""
    api, model = case.extra["api"], built.model
    new = _new_values(case, built)
    if api.startswith("load_state_dict"):
        sd = model.state_dict()
        sd.update({k: v.to(sd[k].device) for k, v in new.items()})
        model.load_state_dict(sd, assign=api == "load_state_dict_assign")
    for name, v in new.items():
        t = tensor_at(model, name)
        v = v.to(t.device)
        if api == "data_copy":
            t.data.copy_(v)
        elif api == "data_setitem":
            if t.dim():
                t.data[:] = v
            else:
                t.data[...] = v
        elif api == "no_grad_copy":
            with torch.no_grad():
                t.copy_(v)
        elif api == "numpy":
            arr = built.arrays[name]
            arr[...] = v.view(torch.int8 if v.dtype == torch.int8 else torch.uint8).numpy()
    if built.eager_model is not model:
        built.eager_model.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})


def _cotangent(case: Case, out: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed((case.seed * 13 + 7) % (1 << 62))
    return torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.device)


def _backward(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, cot: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Gradients of sum(y * cot) w.r.t. x (if it requires grad) and the model's trainable parameters."""
    if not y.requires_grad:  # nothing differentiable reaches y (MX-quantized activations, no bias)
        return {}
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None
    (y.to(cot.dtype) * cot).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in params if p.grad is not None}
    for _, p in params:
        p.grad = None
    if x.grad is not None:
        grads["x"] = x.grad.detach().clone()
    return grads


def train_call(case: Case, built: Built, compiled, x: torch.Tensor, prog: Progress, first: bool) -> Obs:
    """Forward + backward, compiled then eager then float64 (where the reference is the same function)."""
    wants_x = case.extra.get("grad", "both") != "params" or not any(
        p.requires_grad for p in built.model.parameters()
    )
    with torch.enable_grad():
        xc = x.detach().requires_grad_(wants_x)
        if case.dynamic and first:
            torch._dynamo.mark_dynamic(xc, xc.dim() - 2)
        out = compiled(xc)
        cot = _cotangent(case, out)
        g_c = _backward(built.model, xc, out, cot)
        if case.device == "cuda":
            torch.cuda.synchronize()
        if first:
            rep = qlower.last_report()
            prog.reports.append((bool(rep is not None and rep.pass_ran), len(rep.entries) if rep else 0))
        prog.stage = "check (eager model or reference)"
        xe = x.detach().clone().requires_grad_(wants_x)
        eager = built.eager(xe)
        g_e = _backward(built.eager_model, xe, eager, cot.to(eager.device))
        ref, g_r = None, None
        if built.ref is not None:
            xr = x.detach().clone().requires_grad_(wants_x)
            ref = built.ref(xr)
            if case.family != "dynamic_int8":  # its reference is the unquantized linear: another function
                g_r = _backward(built.model, xr, ref, cot)
    grads = [(n, g_c.get(n), g_e.get(n), None if g_r is None else g_r.get(n)) for n in sorted({*g_c, *g_e})]
    return Obs(x, out.detach(), eager.detach(), None if ref is None else ref.detach(), grads=grads)
