"""The fuzz's draws: the axes every case shares (family, form, dtype, shape, bias, kernel preference,
dynamic M) and the variant (a defect class of fuzz_compile.py's docstring), all from `random.Random(seed)`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from scripts.fuzz import classes, pipelines
from scripts.fuzz.case import FAMILIES, Case
from scripts.fuzz.models import DYN_FORMS
from tests.forms import dynamic_int8 as dyn
from tests.forms import mx as mx_forms
from tests.forms import woq_int8 as woq_forms
from tests.forms.woq_int8 import FORMS as WOQ_FORMS

M_CHOICES = (1, 2, 3, 5, 8, 16, 17, 33, 64, 100, 128, 200, 256, 257, 1000)
INT8_K = (16, 48, 64, 100, 256, 1000, 4096)
INT8_K_ODD = (7, 33, 77, 129, 255, 999, 1025)  # K off every alignment: the forms take any K
N_NICE = (8, 16, 24, 33, 48, 64, 100, 127, 128, 255, 256, 257, 512, 1000, 1024, 2048, 2999, 3000)
MX_K = (32, 64, 96, 128, 160, 256, 320, 512, 1024, 2048, 4096)
MX_K_BAD = (16, 48, 80, 100, 136, 200, 1000)  # not multiples of 32: emulated or left alone with a reason

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

MX_HAND_WRITTEN = tuple(mx_forms.hand_written_forms(32, 32))
# (activation format or None: weight-only, weight format) of tests/forms/mx.py's MXLinear
MX_LINEAR_FORMATS = (
    (None, "e4m3"),
    (None, "e2m1"),
    (None, "e5m2"),
    ("e4m3", "e4m3"),
    ("e2m1", "e2m1"),
    ("e4m3", "e2m1"),
)

# Variants (see the module docstring): name -> (families it applies to, weight when drawn at random).
VARIANTS: dict[str, tuple[tuple[str, ...], int]] = {
    "plain": (FAMILIES, 40),
    "view_epilogue": (FAMILIES, 12),
    "expanded_scale": (("woq_int8", "dynamic_int8"), 10),
    "fp16_extreme": (("woq_int8", "mx"), 10),
    "training": (FAMILIES, 8),
    "weight_write": (FAMILIES, 10),
    "mx_special": (("mx",), 12),
    "matvec": (("woq_int8", "mx"), 8),
    # mx_training, family_order, near_mx, stacked_experts, lora_training: scripts/fuzz/classes.py
    **classes.VARIANTS,
}
# cache_switch, two_models, aoti_package (scripts/fuzz/pipelines.py): drawn by `pipelines.pick`
ALL_VARIANTS = {**VARIANTS, **pipelines.VARIANTS}
UNAVAILABLE = classes.unavailable()  # variant -> why this environment cannot run it (never drawn here)
TRAINING = ("training", *classes.TRAINING)  # variants that run forward + backward (train_call)
HEAD_DIMS = (2, 4, 8, 16, 32, 64, 128)
EPILOGUES = (
    "mul_D",
    "mul_HD",
    "mul_111D",
    "add_D",
    "add_HD",
    "add_111D",
    "mul_row",
    "add_row",
    "mul_D_add_HD",
)
WRITE_APIS = (
    "data_copy",
    "data_setitem",
    "no_grad_copy",
    "load_state_dict",
    "load_state_dict_assign",
    "numpy",
)
# (K, N) with K*N = 2^22: the smallest weights qlower's cached qlinear (the prepack cache) takes
PREPACK_SHAPES = ((2048, 2048), (4096, 1024), (1024, 4096))
MX_EXTREMES = (("fp32_matmul", "large"), ("f16_dequant", "large"), ("f16_dequant", "tiny"))


def _weighted(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _pick_n(rng: random.Random, cap: int) -> int:
    if rng.random() < 0.5:
        return rng.choice([n for n in N_NICE if n <= cap])
    return rng.randint(8, cap)


def variant_families(families: tuple[str, ...], variants: tuple[str, ...] | None) -> tuple[str, ...]:
    """The families a case may draw: all of `families` (no variant filter), else those a variant reaches."""
    if variants is None:
        return families
    usable = [v for v in variants if v not in UNAVAILABLE]
    return tuple(f for f in families if any(f in ALL_VARIANTS[v][0] for v in usable))


def make_case(
    seed: int, device: str, families: tuple[str, ...], variants: tuple[str, ...] | None = None
) -> Case:
    """Every random choice of one case, from `random.Random(seed)`, the device and the variant filter alone.

    The variant is drawn last, so without a filter a seed keeps the family, form, dtype and shape it had
    before variants existed; a variant then adjusts what it needs (N to H * D, fp16, the form, ...)."""
    rng = random.Random(seed)
    lim = LIMITS[device]
    family = rng.choice(variant_families(families, variants))
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
    case = Case(seed, device, family, form, dtype, m, k, n, batch, bias, preference, dynamic, m2, extra)
    weights = {
        v: w
        for v, (fams, w) in VARIANTS.items()
        # a class drawn on request only (`--variant`) leaves every other seed's draw as it was
        if family in fams
        and (v not in classes.ON_REQUEST if variants is None else v in variants)
        and v not in UNAVAILABLE
    }
    # the flows around a compile (pipelines.py) from a stream of their own: every other seed draws as before
    variant = pipelines.pick(seed, variants, VARIANTS) or _weighted(rng, weights)
    if variant != "plain":
        case.extra["variant"] = variant
        VARIANT_DRAWS[variant](rng, case)
    # drawn last, so a seed keeps every earlier choice: a dynamic CUDA case under CUDA graphs gets the gated
    # launches (one per M range into one output), not the host `if`s of default mode
    if case.device == "cuda" and case.dynamic and variant == "plain" and rng.random() < 0.5:
        case.extra["cudagraphs"] = True
    return case


# ------------------------------------------------------------------------------------------ variant draws
def _replace_mx_form(c: Case, form: str) -> None:
    """A variant's own MX form: drop mx_linear's choices; K % 32 == 0 (partial_block's K is not: the largest
    multiple of 32 below it)."""
    c.form = form
    for key in ("act", "weight", "e8m0"):
        c.extra.pop(key, None)
    c.k = max(32, c.k // 32 * 32)


def _draw_view_epilogue(rng: random.Random, c: Case) -> None:
    d = rng.choice([d for d in HEAD_DIMS if d <= c.n] or [1])
    c.n = c.n // d * d
    inside = c.family != "mx" and rng.random() < 0.35  # the linear's own scale after the view
    epi = rng.choice(EPILOGUES + (("none",) if inside else ()))
    c.extra.update(heads=f"{c.n // d}x{d}", split=rng.choice(woq_forms.HEAD_SPELLINGS), epi=epi)
    if inside:
        c.form = "heads" if c.family == "woq_int8" else "RescaleAfterView"
        c.extra["scale_at"] = "heads"
    if rng.random() < 0.25:
        c.extra["vec_dtype"] = "float32"


def _draw_expanded_scale(rng: random.Random, c: Case) -> None:
    if c.family == "woq_int8":
        c.form = "expand"
        c.extra["scale"] = rng.choice(woq_forms.EXPAND_SPELLINGS)
    else:
        c.form = "ExpandScales"
        c.extra.update(
            x_scale=rng.choice(dyn.X_SCALES),
            w_scale=rng.choice(dyn.W_SCALES),
            order=rng.choice(dyn.RESCALE_ORDERS),
        )


def _draw_fp16_extreme(rng: random.Random, c: Case) -> None:
    c.dtype = "float16"
    if c.family == "woq_int8":
        scales = rng.choice(woq_forms.SCALE_RANGES)
        forms = [
            f
            for f in WOQ_FORMS
            if f != "unscaled" and (scales == "tiny" or f not in ("scale_first", "scale_n1"))
        ]
        if c.form not in forms:
            c.form = rng.choice(forms)
        c.extra["scales"] = scales
        return
    _replace_mx_form(c, "mx_extreme")
    spelling, scales = rng.choice(MX_EXTREMES)
    c.extra.update(elem=rng.choice(("e4m3", "e2m1", "e5m2")), spelling=spelling, scales=scales)
    if spelling == "fp32_matmul":
        c.extra["shift"] = rng.randint(19, 26)  # e8m0 codes + 19..26: weights beyond 65504
    c.bias = rng.random() < 0.5


def _draw_training(rng: random.Random, c: Case) -> None:
    if c.form.startswith("PT2E"):  # quantized_decomposed ops have no autograd kernels: no gradient to compare
        c.form = rng.choice([f for f in DYN_FORMS if not f.startswith("PT2E")])
    c.extra["grad"] = rng.choice(("x", "params", "both"))


def _draw_weight_write(rng: random.Random, c: Case) -> None:
    api = rng.choice([a for a in WRITE_APIS if a != "numpy" or c.device == "cpu"])
    c.extra.update(api=api, write="weight" if api == "numpy" else rng.choice(("weight", "weight+scale")))
    if c.family == "dynamic_int8" and c.device == "cpu":
        if rng.random() < 0.7:
            c.extra["isa"] = "vnni"
        if rng.random() < 0.6:  # big enough for the prepack cache, M small enough for the CPU
            c.k, c.n = rng.choice(PREPACK_SHAPES)
            c.m, c.batch = rng.choice((2, 3, 5, 8, 16)), rng.choice((None, 1, 2))
            c.m2 = rng.choice([v for v in (2, 3, 5, 8, 16) if v != c.m]) if c.dynamic else None


def _draw_mx_special(rng: random.Random, c: Case) -> None:
    special = rng.choice(list(mx_forms.MX_SPECIALS))
    _replace_mx_form(c, "mx_special")
    c.extra.update(special=special, elem=rng.choice(mx_forms.MX_SPECIALS[special]))
    c.bias = rng.random() < 0.5


def _draw_matvec(rng: random.Random, c: Case) -> None:
    c.m, c.dynamic, c.m2 = 1, False, None  # Inductor decomposes only an mm whose M is statically 1
    c.batch = rng.choice((None, 1))
    hand = c.family == "woq_int8" and (c.device != "cuda" or rng.random() < 0.5)
    c.extra["matvec"] = "hand" if hand else "decomposed"
    if hand:
        c.form = "torchao_matvec"
        c.extra.pop("scale_dtype", None)  # torchao's scale is fp32 [N, 1]


VARIANT_DRAWS: dict[str, Callable[[random.Random, Case], None]] = {
    "view_epilogue": _draw_view_epilogue,
    "expanded_scale": _draw_expanded_scale,
    "fp16_extreme": _draw_fp16_extreme,
    "training": _draw_training,
    "weight_write": _draw_weight_write,
    "mx_special": _draw_mx_special,
    "matvec": _draw_matvec,
    **classes.DRAWS,
    **dict.fromkeys(pipelines.VARIANTS, pipelines.draw),
}
