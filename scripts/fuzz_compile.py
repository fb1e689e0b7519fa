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
    python -P scripts/fuzz_compile.py --device cpu --cases 8 --variant weight_write   # one defect class

Writes `fuzz_<device>.json` (every case: parameters, chosen lowerings, errors, exceptions) under `--out`
($OUT, else ./out), rewritten after each case, so a hard crash still leaves the case that was running
(`in_progress`).

Outcomes: `pass` (lowered, numbers right), `left_alone` (qlower left the linear to Inductor and said why,
numbers right), `declined` (an explicit kernel preference refused with qlower's UnsupportedPlatformError);
warnings: `misrecognized` (lowered as another family under `inductor_options()`'s default of every family,
or no row of the case's family; numbers right: a left-alone row of another family is a true report of another
product, e.g. a training backward's `grad @ dequantized weight`), `imprecise` (within the GPU tests' relative bounds vs the reference, bf16 1e-2 say, but
outside their tighter eager-relative ones), `upstream` (wrong numbers, a crash or a matmul operand with a
short leading dimension in a graph qlower left alone, which stock torch.compile reproduces without qlower);
failures: `fail` (wrong numbers or gradients, NaN, wrong shape/dtype, preference not honoured, K % 32 != 0
lowered to anything but the emulation, a training compile's report without rows, a defect class's rows
other than it expects: `fuzz_classes.check_rows`), `error` (any other exception) and `silent` (no report
row at all: every case's model holds a quantized linear, so qlower passed one over without a word). A
failure in a graph where qlower lowered something stays a failure; when stock torch.compile fails too, its
`why` says so. The summary counts failures as wrong (`fail`), crashed (`error`) and silent. Exit status 1
when a case failed, errored or was silent.

Variants (`extra["variant"]`, drawn after every other choice, so a seed keeps its family, form, dtype and
shape; `--variant V [V ...]` fuzzes only those, and a summary's rerun line repeats the flag). `plain` is the
case as drawn. The others each target one defect class, with several spellings, every family they reach:
- `view_epilogue` (all families): the linear's [.., N] output split into heads (`.view(*lead, H, D)`,
  `.unflatten(-1, (H, D))`, `.reshape`, `.view(*lead, -1, D)`), then multiplied and/or biased by a vector
  over the viewed dims ([D], [H, D], [1, 1, 1, D]) or a per-row-looking gate [.., 1, 1] computed from x
  (`epi`); for woq and dynamic int8 also the linear's own scale written after the view (`scale_at=heads`:
  `mm.view(.., H, D) * s.view(H, D)`, `acc.view(.., H, D) * sx.view(.., 1, 1) * s.view(H, D)`).
- `expanded_scale` (woq, dynamic int8): scales reaching the epilogue through `.expand(M, N)` (torchao's
  CUDA spelling `_int_mm(xq, w.t()) * x_scale.expand(M, N)`), as [N], [1, N], [N, 1] or 0-d; woq also on
  the weight (`w * s.expand(N, K)`).
- `fp16_extreme` (woq, MX; fp16): per-channel scales up to 4096 with small activations (finite in the
  user's formula, beyond 65504 once folded into the weight), tiny scales (fp16 subnormals), both mixed;
  MX scale codes shifted up (weights beyond 65504 under an fp32 matmul, or just below it in an fp16
  dequantization) or down (subnormal fp16 weights).
- `training` (all): x and/or the float parameters (scale, bias) require grad; forward + backward; outputs
  and gradients are checked (against float64 where the reference is the same function, else eager: 2e-2),
  and `qlower.last_report()` after the first backward must describe a compile that ran (`pass_ran`, rows).
- `weight_write` (all): call, write the weight (and maybe its scale) through one API — `w.data.copy_`,
  `w.data[:] =`, `torch.no_grad(): w.copy_`, `load_state_dict` in place or `assign=True`, a
  `torch.from_numpy` view written through numpy (CPU) — call again with the same input, compare with eager
  after the write. Dynamic int8 on CPU mostly sets `QLOWER_CPU_INT8_ISA=vnni` for the case (`isa`) and takes
  K*N >= 2^22 weights, so qlower's prepack cache (`qlower.qlinear_u8_cached`) is what a stale read hits.
  On a CPU without that ISA (AVX2: the forced u8 x s8 kernels saturate int16 pair sums, wrong on their own)
  a call after the write is compared with a fresh compile of the written model instead (`differential`).
- `mx_special` (MX): dequantizations that give special codes their own meaning — e8m0 code 255 -> 0
  (`where(e == 255, 0, exp2(e - 127))`, or an e8m0 tensor's NaN zeroed), NaN fp8 elements zeroed
  (`nan_to_num`), the fp4 table a module buffer (the e2m1 values, or NF4's codebook), fp4 packed high nibble
  first — over data holding scale codes 0 and 255, NaN encodings and every fp4 byte; and the spec's own decode
  over NaN / Inf fp8 elements and code 255 (`spec_codes`: lowered, its NaN / Inf outputs where eager has them).
- `cudagraphs=True` (a plain dynamic CUDA case, half of them): compiled with
  `inductor_options(mode="reduce-overhead")`, so a symbolic M runs the gated launches (one per M range into
  one output) rather than default mode's host `if`s; each call is the third of three (warm-up, recording,
  replay). (Two MXFP4 dequantize + cuBLAS ranges once shared the first one's gate: zeros above M = 128.)
- `matvec` (woq, MX): M = 1 in the matrix-vector form Inductor's `mm` decomposition leaves on GPUs once
  `coordinate_descent_tuning` is on (torchao's `quantize_` turns it on): both operands upcast to fp32, the
  broadcast product summed over K, cast back. `matvec=decomposed` (CUDA) compiles the case's own form with
  that setting on; `matvec=hand` (woq, any device: CPU Inductor never decomposes) is torchao
  `Int8WeightOnlyConfig`'s linear (`mm(x, w.t().to(dt)) * s.to(dt).flatten()`, s fp32 [N, 1]) written in that
  form, so the CPU checks the numbers of what the recognizer makes of it. MX on CPU is its plain form at M = 1.
- `mx_training` (MX; needs torchao, else skipped with a note and seeds draw among the other variants):
  torchao's MX training recipes, `MXFP8Linear(K, N, kernel_preference=EMULATED)` (`scale_mode` RCEIL,
  FLOOR or CEIL) or `quantize_(Sequential(Linear(K, N)), MXFP8TrainingOpConfig.from_recipe(
  MXFP8_EMULATED_RCEIL))`, bf16; tokens, K and N multiples of 32 with odd block counts (96, 160, 224), at
  most 256 on CPU, 2048 on CUDA. Forward + backward against torchao's eager MX (output, grad x and every
  parameter's gradient within 1e-2); the report holds the three MX matmuls (T, K, N), (T, N, K), (N, T, K),
  all lowered.
- `family_order` (dynamic int8): a dynamic-int8 linear written dequantize-then-matmul (`scale_on_weight`,
  `scale_after_linear`, `fp32_dequant`) over a 1-D, 2-D or 3-D activation, compiled with `families=` in a
  drawn order and subset (`families`): one row per compile, dynamic_int8 lowered where it is enabled, else
  woq_int8 left alone with `patterns.woq_int8.DYNAMIC_ACTIVATION`.
- `near_mx` (MX): MX-shaped decodes that are not MX (`decode`): scale bytes read as e4m3 or e5m2,
  `2 ** (e - 126)`, `exp2(e - 128)`, e8m0 codes per 16 elements, NVFP4-like (e2m1, an e4m3 scale per 16
  elements, a global scale); e4m3, e5m2 or e2m1 elements; `F.linear` or an fp32 matmul. One mx row, left
  alone, its reason starting "scale decode differs from e8m0" (scale decodes) or "weight is computed from
  8-bit data" (16-element blocks).
- `stacked_experts` (woq): stacked int8 experts W [E, N, K], E in 1, 2, 4, 8,
  `bmm(x, W.to(dt).transpose(1, 2)) * S[:, None]` and `einsum("mk,enk->emn", x, W.to(dt)) * S[:, None]`;
  the weight on the left, `(w.to(dt) @ v) * s` with v [K] or [K, B] (`x_dims`). One woq_int8 row, left
  alone, its reason from patterns/unclaimed.py (batched matmul, W @ x).
- `lora_training` (all; drawn only when `--variant` names it): a frozen quantized linear beside a trainable
  low-rank adapter, x requiring grad (the base's scale too: `scale_grad`), forward + backward: the forward
  linear's rows the case's family, one lowered; a dynamic-int8 base one dynamic_int8 row, lowered.
- `producer_ops` (all; drawn only when `--variant` names it; needs optimum-quanto): a linear inside a
  producer's own op: quanto's frozen qint8 `QLinear` (`quanto::qbytes_mm`: woq_int8, lowered), its
  `activations=qint8` arithmetic with quanto's ops (dynamic_int8, lowered), qfloat8 weights (mx, left alone)
  and an unproven op of vLLM's namespace (woq_int8, left alone): each left-alone reason names the op.
These classes are scripts/fuzz_classes.py (draws, models, the rows each expects): numbers against float64
(torchao's eager MX for `mx_training`), every compile's rows against the class's expectation.
The tolerance of woq, MX and those classes is max(the relative bound above, 2x eager's own error): an fp16
dequantization that rounds subnormal weights is the user's formula, not a qlower failure.

Needs torch (and Triton on CUDA): it imports tests/woq_models.py, tests/dynamic_int8_forms.py and
tests/mx_models.py (never their torchao builders), no pytest or expecttest; torchao only for `mx_training`,
optimum-quanto only for `producer_ops`.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import math
import os
import platform
import random
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.utils import run_and_get_code

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))  # `python -P` leaves the script's folder off sys.path

import dynamic_int8_forms as dyn  # noqa: E402
import fuzz_classes as classes  # noqa: E402
import fuzz_pipelines as pipelines  # noqa: E402
import mx_models  # noqa: E402
import woq_models  # noqa: E402
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
    "QuantizeThenFlatten": (dyn.QuantizeThenFlatten, {}),
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
GRAD_EAGER_TOL = (
    2e-2  # gradients checked against eager only (no float64 twin): catches missing terms, not ulps
)
MX_TRAINING_GRAD_TOL = 1e-2  # torchao's eager MX decodes the same: only bf16 rounding (test_mx_training.py)

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
    # mx_training, family_order, near_mx, stacked_experts, lora_training: scripts/fuzz_classes.py
    **classes.VARIANTS,
}
# cache_switch, two_models, aoti_package (scripts/fuzz_pipelines.py): drawn by `pipelines.pick`
ALL_VARIANTS = {**VARIANTS, **pipelines.VARIANTS}
UNAVAILABLE = classes.unavailable()  # variant -> why this environment cannot run it (never drawn here)
TRAINING = ("training", *classes.TRAINING)  # variants that run forward + backward (_train_call)
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
WRITE_TARGETS = {"woq_int8": ("w", "s"), "dynamic_int8": ("q", "s"), "mx": ("q", "e")}  # (weight, its scale)
# (K, N) with K*N = 2^22: the smallest weights qlower's cached qlinear (the prepack cache) takes
PREPACK_SHAPES = ((2048, 2048), (4096, 1024), (1024, 4096))
MX_EXTREMES = (("fp32_matmul", "large"), ("f16_dequant", "large"), ("f16_dequant", "tiny"))


# ------------------------------------------------------------------------------------------ models (woq)
class WoqTorchaoMatvec(WoqLinear):
    """torchao `Int8WeightOnlyConfig`'s linear (`mm(x2d, w.t().to(dt)) * s.to(dt).flatten()`, s fp32 [N, 1])
    at M = 1, written as Inductor's `mm` decomposition leaves it on a GPU with `coordinate_descent_tuning`:
    x and w upcast to fp32, the broadcast product summed over K, cast back (`pw_cast_for_opmath`)."""

    def __init__(self, k: int, n: int, dtype: torch.dtype, bias: bool = False, seed: int = 0) -> None:
        super().__init__(k, n, dtype, "gpt_fast", bias, torch.float32, seed)
        self.s = nn.Parameter(self.s.detach().reshape(n, 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        wt = self.w.t().to(x.dtype)
        y = (x2.float().unsqueeze(2) * wt.float().unsqueeze(0)).sum(1).to(x.dtype)
        y = (y * self.s.to(y.dtype).flatten()).reshape(*x.shape[:-1], y.shape[-1])
        return y if self.b is None else y + self.b


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


class HeadsEpilogue(nn.Module):
    """`inner(x)` split into heads [.., H, D] (or already split: `presplit`), then multiplied / biased by
    vectors over the viewed dims ([D], [H, D], [1, 1, 1, D]) or by a per-row-looking gate [.., 1, 1] computed
    from x: what attention code does right after a projection. Steps come from the `epi` name
    ('mul_D_add_HD': times a [D] vector, plus an [H, D] one)."""

    SHAPES = {"D": lambda h, d: (d,), "HD": lambda h, d: (h, d), "111D": lambda h, d: (1, 1, 1, d)}

    def __init__(
        self, inner: nn.Module, h: int, d: int, split: str, epi: str, vec_dtype: torch.dtype, seed: int,
        presplit: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        g = torch.Generator().manual_seed(seed + 17)
        self.inner, self.h, self.d, self.split, self.presplit = inner, h, d, split, presplit
        parts = [] if epi == "none" else epi.split("_")
        self.steps = list(zip(parts[0::2], parts[1::2], strict=True))
        for i, (_, kind) in enumerate(self.steps):
            if kind != "row":
                vec = torch.randn(self.SHAPES[kind](h, d), generator=g)
                self.register_buffer(f"v{i}", vec.to(vec_dtype))

    @property
    def gain(self) -> float:
        """Largest factor the epilogue multiplies an output by (bounds one quantization step after it)."""
        g = 1.0
        for i, (op, kind) in enumerate(self.steps):
            if op == "mul" and kind != "row":  # the row gate is a sigmoid: <= 1
                g *= getattr(self, f"v{i}").abs().max().item()
        return g

    def _epilogue(self, y: torch.Tensor, x: torch.Tensor, f64: bool) -> torch.Tensor:
        for i, (op, kind) in enumerate(self.steps):
            # the gate in x's dtype, for eager and reference alike: an input of the epilogue, like a vector
            v = torch.sigmoid(x[..., :1]).unsqueeze(-1) if kind == "row" else getattr(self, f"v{i}")
            v = v.double() if f64 else v
            y = y * v if op == "mul" else y + v
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        if not self.presplit:
            y = woq_models.split_heads(y, x.shape[:-1], self.h, self.d, self.split)
        return self._epilogue(y, x, f64=False)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner.reference(x).reshape(*x.shape[:-1], self.h, self.d)
        return self._epilogue(y, x, f64=True)


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
        dims = self.extra.get("x_dims")  # a vector [K], or the right operand [K, M] of `w @ v` (fuzz_classes)
        if dims == "k":
            return (self.k,)
        if dims == "k,m":
            return (self.k, m)
        return (m, self.k) if self.batch is None else (self.batch, m, self.k)

    def m_of(self, x: torch.Tensor) -> int:
        """The M of an input of `x_shape`."""
        dims = self.extra.get("x_dims")
        return 1 if dims == "k" else x.shape[-1] if dims == "k,m" else x.shape[-2]

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
    # the flows around a compile (fuzz_pipelines) from a stream of their own: every other seed draws as before
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
    c.extra.update(heads=f"{c.n // d}x{d}", split=rng.choice(woq_models.HEAD_SPELLINGS), epi=epi)
    if inside:
        c.form = "heads" if c.family == "woq_int8" else "RescaleAfterView"
        c.extra["scale_at"] = "heads"
    if rng.random() < 0.25:
        c.extra["vec_dtype"] = "float32"


def _draw_expanded_scale(rng: random.Random, c: Case) -> None:
    if c.family == "woq_int8":
        c.form = "expand"
        c.extra["scale"] = rng.choice(woq_models.EXPAND_SPELLINGS)
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
        scales = rng.choice(woq_models.SCALE_RANGES)
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
    special = rng.choice(list(mx_models.MX_SPECIALS))
    _replace_mx_form(c, "mx_special")
    c.extra.update(special=special, elem=rng.choice(mx_models.MX_SPECIALS[special]))
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


# ------------------------------------------------------------------------------------------ build, check
def _to_device(model: nn.Module, dev: str) -> nn.Module:
    """model.to(dev), moving 1-byte float buffers (fp8, e8m0 scales) as their bytes."""
    for mod in model.modules():
        for name, b in list(mod._buffers.items()):
            if b is not None and b.element_size() == 1 and b.dtype not in (torch.int8, torch.uint8):
                mod._buffers[name] = b.view(torch.uint8).to(dev).view(b.dtype)
    return model.to(dev)


@dataclass
class Built:
    """One case's models: `model` is compiled; `eager_model` is what `eager` runs (the model itself, or its CPU
    twin for dynamic int8: eager CUDA `_int_mm` rejects M <= 16 and odd K, N)."""

    model: nn.Module
    eager_model: nn.Module
    eager: Callable[[torch.Tensor], torch.Tensor]
    ref: Callable[[torch.Tensor], torch.Tensor] | None  # float64; None where eager is the reference
    arrays: dict[str, Any] = field(default_factory=dict)  # numpy arrays backing weights (weight_write numpy)

    @property
    def x_std(self) -> float | None:
        """The activation scale a model needs (fp16_extreme: small x keeps the user's formula finite)."""
        for mod in self.model.modules():
            if hasattr(mod, "x_std"):
                return mod.x_std
        return None


def _heads(case: Case) -> tuple[int, int]:
    h, d = case.extra["heads"].split("x")
    return int(h), int(d)


def _base_model(case: Case) -> nn.Module:
    """The case's linear on the CPU, before any variant wrapper."""
    dtype, s, ex = DTYPES[case.dtype], case.seed % (1 << 31), case.extra
    if case.family == "woq_int8":
        sdt = DTYPES.get(ex.get("scale_dtype", ""))
        if case.form == "heads":
            return woq_models.WoqHeads(case.k, *_heads(case), dtype, ex["split"], case.bias, sdt, s)
        if case.form == "expand":
            return woq_models.WoqExpandScale(case.k, case.n, dtype, ex["scale"], case.bias, sdt, s)
        if case.form == "torchao_matvec":
            return WoqTorchaoMatvec(case.k, case.n, dtype, case.bias, s)
        if "scales" in ex:
            return woq_models.WoqExtremeScale(
                case.k, case.n, dtype, case.form, ex["scales"], case.bias, sdt, s
            )
        return WoqLinear(case.k, case.n, dtype, form=case.form, bias=case.bias, scale_dtype=sdt, seed=s)
    if case.family == "dynamic_int8":
        kw = dict(bias=case.bias, kn=ex["kn"], seed=s)
        if case.form == "RescaleAfterView":
            return dyn.RescaleAfterView(case.k, *_heads(case), ex["split"], **kw)
        if case.form == "ExpandScales":
            return dyn.ExpandScales(case.k, case.n, ex["x_scale"], ex["w_scale"], ex["order"], **kw)
        cls, fkw = DYN_FORMS[case.form]
        return cls(case.k, case.n, **kw, **fkw)
    if case.form == "partial_block":
        return MXPartialBlock(case.n, case.k, s)
    if case.form == "mx_linear":
        a_elem = None if ex["act"] == "none" else ex["act"]
        return mx_models.MXLinear(a_elem, ex["weight"], case.n, case.k, ex["e8m0"], case.bias, s)
    if case.form == "mx_special":
        return mx_models.MXSpecial(case.n, case.k, ex["special"], ex["elem"], case.bias, s)
    if case.form == "mx_extreme":
        shift = ex.get("shift", 0)
        return mx_models.MXExtreme(
            case.n, case.k, ex["elem"], ex["spelling"], ex["scales"], shift, case.bias, s
        )
    return MXFormModule(case.form, case.n, case.k, s)


def _has_reference(case: Case) -> bool:
    """Whether the model's float64 `reference` is its function (MX with quantized activations: eager is)."""
    return not (case.form == "mx_linear" and case.extra["act"] != "none")


def _make_trainable(model: nn.Module, names: tuple[str, ...] = ("s", "b")) -> None:
    """Float scales and biases (parameters or buffers) become parameters that require grad."""
    for mod in model.modules():
        for name in names:
            t = mod._parameters.get(name)
            if t is not None and t.dtype.is_floating_point:
                t.requires_grad_(True)
                continue
            t = mod._buffers.get(name)
            if t is not None and t.dtype.is_floating_point:
                del mod._buffers[name]
                mod.register_parameter(name, nn.Parameter(t.clone(), requires_grad=True))


def _tensor(model: nn.Module, dotted: str) -> torch.Tensor:
    prefix, _, leaf = dotted.rpartition(".")
    return getattr(model.get_submodule(prefix), leaf)


def _write_names(case: Case, model: nn.Module) -> list[str]:
    """Dotted names of the tensors weight_write overwrites: the weight, and its scale ('weight+scale')."""
    wanted = WRITE_TARGETS[case.family][: 2 if case.extra["write"] == "weight+scale" else 1]
    found = {n.rpartition(".")[2]: n for n, _ in (*model.named_parameters(), *model.named_buffers())}
    return [found[w] for w in wanted]


def _numpy_backed(model: nn.Module, dotted: str) -> Any:
    """Replace a 1-byte weight by a `torch.from_numpy` view (same values); return the numpy array."""
    prefix, _, leaf = dotted.rpartition(".")
    mod = model.get_submodule(prefix)
    t = getattr(mod, leaf)
    raw = t.detach().view(torch.int8 if t.dtype == torch.int8 else torch.uint8)
    arr = raw.numpy().copy()
    nt = torch.from_numpy(arr)
    nt = nt if nt.dtype == t.dtype else nt.view(t.dtype)
    if leaf in mod._parameters:
        mod._parameters[leaf] = nn.Parameter(nt, requires_grad=False)
    else:
        mod._buffers[leaf] = nt
    return arr


def build(case: Case) -> Built:
    """The case's models on its device, wrapped and prepared as its variant wants."""
    dev, ex = case.device, case.extra
    variant = ex.get("variant", "plain")
    if variant in classes.VARIANTS:  # the class's own model; eager is the reference where it has no float64
        model = classes.build(case, _to_device)
        return Built(model, model, model, getattr(model, "reference", None))
    base = _base_model(case)
    if variant == "training" and ex["grad"] != "x":
        _make_trainable(base)
    model: nn.Module = base
    if variant == "view_epilogue":
        vdt = DTYPES[ex.get("vec_dtype", case.dtype)]
        presplit = ex.get("scale_at") == "heads"
        model = HeadsEpilogue(
            base, *_heads(case), ex["split"], ex["epi"], vdt, case.seed % (1 << 31), presplit
        )
    arrays = {}
    if variant == "weight_write" and ex["api"] == "numpy":
        arrays = {name: _numpy_backed(model, name) for name in _write_names(case, model)}
    if case.family == "dynamic_int8" and not arrays:  # numpy weights: CPU only, eager runs the model itself
        twin, model = model, _to_device(copy.deepcopy(model), dev)

        def eager(x: torch.Tensor) -> torch.Tensor:  # on CPU: eager CUDA _int_mm rejects M <= 16, odd K/N
            return twin(x.cpu()).to(x.device)

        return Built(model, twin, eager, model.reference)
    model = _to_device(model, dev)
    return Built(model, model, model, model.reference if _has_reference(case) else None, arrays)


def make_x(case: Case, m: int, salt: int, std: float | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed((case.seed * 7919 + salt) % (1 << 62))
    x = torch.randn(case.x_shape(m), generator=g)
    if std is not None:
        x = x * std
    elif case.family == "dynamic_int8":
        x = x * 2.0 + 0.3  # as the tests: an offset, so asymmetric zero points are not 0
    return x.to(DTYPES[case.dtype]).to(case.device)


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
    (woq_models.assert_close_to_reference; test_dynamic_int8_gpu._check).
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
            "compile": i,  # which compile's report (rows per compile: fuzz_classes.check_rows)
        }
        for i, r in enumerate(reports)
        for d in r.entries
    ]
    return out, sum(r.pass_ran for r in reports), sum(not r.pass_ran for r in reports)


def _families(case: Case) -> tuple[str, ...] | None:
    drawn = classes.families(case)  # family_order: an order and subset of its own
    if drawn is not None:
        return drawn
    return None if case.extra.get("all_families") else (case.family,)


def _compile(model: nn.Module, case: Case, with_qlower: bool = True):
    torch._dynamo.reset()
    qlower.clear_reports()
    graphs = bool(case.extra.get("cudagraphs"))
    mode = "reduce-overhead" if graphs else None
    opts = (
        {
            "options": qlower.inductor_options(
                kernel_preference=case.preference, families=_families(case), mode=mode
            )
        }
        if with_qlower
        else ({"mode": mode} if graphs else {})
    )
    return torch.compile(model, dynamic=case.dynamic or None, fullgraph=True, **opts)


def _call(compiled, x: torch.Tensor, case: Case) -> Any:
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
    problems: list[str] = field(default_factory=list)  # a pipeline class's broken invariants (fuzz_pipelines)


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


def _steps(case: Case) -> list[str]:
    """The calls of a case: M, (a weight write, M again), then M2 for a dynamic M."""
    steps = ["m"]
    if case.extra.get("variant") == "weight_write":
        steps += ["write", "m"]
    return steps + (["m2"] if case.dynamic else [])


def _new_values(case: Case, built: Built) -> dict[str, torch.Tensor]:
    """Fresh values for the tensors weight_write overwrites (same shape and dtype, on the CPU)."""
    g = torch.Generator().manual_seed((case.seed * 31 + 5) % (1 << 62))
    out = {}
    for name in _write_names(case, built.model):
        t = _tensor(built.model, name).detach().cpu()
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


def _write_weights(case: Case, built: Built) -> None:
    """Overwrite the weight (and maybe its scale) through the case's API, then mirror it into the eager twin."""
    api, model = case.extra["api"], built.model
    new = _new_values(case, built)
    if api.startswith("load_state_dict"):
        sd = model.state_dict()
        sd.update({k: v.to(sd[k].device) for k, v in new.items()})
        model.load_state_dict(sd, assign=api == "load_state_dict_assign")
    for name, v in new.items():
        t = _tensor(model, name)
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


def _train_call(case: Case, built: Built, compiled, x: torch.Tensor, prog: Progress, first: bool) -> Obs:
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


def _execute_pipeline(case: Case, built: Built, xs: dict[str, torch.Tensor], prog: Progress) -> list[Obs]:
    """A fuzz_pipelines class: its flow of compiles (or a package), each output an Obs against eager."""
    variant = case.extra["variant"]

    def compile_with(model: nn.Module, preference: str):
        opts = qlower.inductor_options(kernel_preference=preference, families=_families(case))
        return torch.compile(model, dynamic=case.dynamic or None, fullgraph=True, options=opts)

    x = xs["m"]
    if variant == "aoti_package":
        inputs = list(xs.values())
        opts = qlower.inductor_options(kernel_preference=case.preference, families=_families(case))
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
    """Run the case's steps (_steps) through `compiled`; each call's eager and float64 results are taken right
    after it, before any later weight write (`diff`: the weights are kept for `_fresh_references` instead)."""
    xs = {"m": make_x(case, case.m, 0, built.x_std)}
    if case.dynamic:
        xs["m2"] = make_x(case, case.m2, 1, built.x_std)
    if case.extra.get("variant") in pipelines.VARIANTS and compiled is not STOCK_STEPS:
        return _execute_pipeline(case, built, xs, prog)
    if compiled is STOCK_STEPS:  # a pipeline class's stock check: its plain steps, stock-compiled
        compiled = _compile(built.model, case, with_qlower=False)
    obs: list[Obs] = []
    written = False
    for step in _steps(case):
        if step == "write":
            prog.stage = "write weights"
            _write_weights(case, built)
            written = True
            continue
        x = xs[step]
        prog.stage = "compile/run"
        if case.extra.get("variant") in TRAINING:
            obs.append(_train_call(case, built, compiled, x, prog, first=not obs))
            continue
        if case.dynamic and not obs:
            torch._dynamo.mark_dynamic(x, x.dim() - 2)
        if obs:
            out = _call(compiled, x, case)
        else:  # the compiling call: its generated code is checked too
            out, codes = run_and_get_code(_call, compiled, x, case)
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
    fuzzer's CI) read it right, so the code is checked, not just the numbers (lowerings/emit/inductor_fixes.py
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
        opts = qlower.inductor_options(kernel_preference=case.preference, families=_families(case))
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
        obs = _execute(case, built, _compile(built.model, case), prog, diff)
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
    elif prog.problems:  # a pipeline class (fuzz_pipelines) checks each of its compiles' preference itself
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


ACCEPTABLE = ("pass", "left_alone", "misrecognized", "declined", "imprecise")
FAILURES = {"fail": "wrong", "error": "crashed", "silent": "silent"}  # outcome -> its name in the summary


def summarize(
    records: list[dict[str, Any]],
    device: str,
    families: tuple[str, ...],
    variants: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    outcome = collections.Counter(r["outcome"] for r in records)
    by_variant: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_family: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_lowering: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    by_pref: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in records:
        by_variant[r["extra"].get("variant", "plain")][r["outcome"]] += 1
        by_family[r["family"]][r["outcome"]] += 1
        by_pref[r["preference"]][r["outcome"]] += 1
        for lw in r.get("lowerings") or ["(no decision)"]:
            by_lowering[r["family"]][lw] += 1

    fam = "" if families == FAMILIES else " --families " + " ".join(families)  # cases depend on it
    fam += "" if variants is None else " --variant " + " ".join(variants)

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
        "by_variant": {k: dict(v) for k, v in by_variant.items()},
        "by_preference": {k: dict(v) for k, v in by_pref.items()},
        "lowerings": {k: dict(v) for k, v in by_lowering.items()},
        "misrecognized": listed("misrecognized"),
        "imprecise": listed("imprecise"),
        "upstream": listed("upstream"),
        "failures": listed(*FAILURES),
    }


def _print_summary(summary: dict[str, Any], elapsed: float, stopped: str | None) -> None:
    print(
        f"\n==== qlower compile fuzz: {summary['cases']} cases in {elapsed:.0f}s"
        + (f" ({stopped})" if stopped else "")
    )
    print("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["outcomes"].items())))
    for fam, c in sorted(summary["by_family"].items()):
        print(f"  {fam:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("by variant:")
    for var, c in sorted(summary["by_variant"].items()):
        print(f"  {var:15s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("by preference:")
    for pref, c in sorted(summary["by_preference"].items()):
        print(f"  {pref:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items())))
    print("lowerings chosen (cases):")
    for fam, c in sorted(summary["lowerings"].items()):
        print(f"  {fam:13s} " + ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1])))
    for key, title in (
        ("misrecognized", "decided as another family (numbers right; a warning)"),
        ("imprecise", "within the tests' relative bounds, outside their eager-relative ones (a warning)"),
        ("upstream", "stock torch.compile fails the same way without qlower (not qlower's)"),
        ("failures", "qlower failures"),
    ):
        counts = ""
        if key == "failures":  # the three counts: wrong numbers, crashes, linears without a row
            n = collections.Counter(f["outcome"] for f in summary[key])
            counts = " (" + ", ".join(f"{name}: {n[o]}" for o, name in FAILURES.items()) + ")"
        print(f"{title}: {len(summary[key])}{counts}")
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
    p.add_argument(
        "--variant", nargs="+", choices=list(ALL_VARIANTS), help="draw only these variants (module docstring)"
    )
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
    variants = tuple(args.variant) if args.variant else None
    for v, why in UNAVAILABLE.items():
        if variants is None or v in variants:
            print(f"note: variant {v} skipped ({why}); seeds draw among the others", flush=True)
    if not variant_families(families, variants):
        p.error(f"--variant {' '.join(variants or ())} reaches none of --families {' '.join(families)}")
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
        case = make_case(seed, args.device, families, variants)
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
    doc["summary"] = summarize(doc["cases"], args.device, families, variants)
    doc["elapsed_s"] = round(elapsed, 1)
    doc["stopped"] = stopped
    dump()
    _print_summary(doc["summary"], elapsed, stopped)
    print(f"wrote {path}")
    return 1 if doc["summary"]["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
