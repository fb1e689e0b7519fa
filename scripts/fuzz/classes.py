"""The fuzz variants aimed at known defect classes (training graphs, family order, near-MX decodes, stacked
experts, producer ops): their draws, models and report-row checks.

Why a module of its own: draw.py and run.py hold the axes every case shares (shape, dtype, preference, dynamic
M) and the outcome logic; these classes each bring their own model and their own expectation of qlower's
report, which is the point of them (a row per quantized linear, with the right family, lowered or left alone,
and the reason). draw.py draws the case, then hands it here for the class's choices (`DRAWS`),
its model (`build`) and the rows it must report (`check_rows`); numbers go through check.py's `check`.

- `mx_training`: torchao's MX training recipes (`MXFP8Linear` with `KernelPreference.EMULATED`, or
  `quantize_` with `MXFP8TrainingOpConfig.from_recipe(MXFP8_EMULATED_RCEIL)`), forward + backward: three MX
  matmuls, (T, K, N), (T, N, K) and (N, T, K), all lowered (on CUDA under AUTO: lowered, or left to stock
  with the training-compile reason; tests/end_to_end/test_mx_training.py).
- `family_order`: a dynamic-int8 linear written dequantize-then-matmul under `families=` in a drawn order
  and subset: dynamic_int8 lowers it whenever enabled, else woq_int8 leaves it with DYNAMIC_ACTIVATION
  (tests/patterns/test_family_order.py).
- `near_mx`: MX-shaped decodes that are not MX (e4m3 / e5m2 scale bytes, a bias of 126 or 128, 16-element
  blocks): left alone with the reason (tests/end_to_end/test_report.py).
- `stacked_experts`: stacked int8 experts (`bmm`, `einsum("mk,enk->emn")`) and the weight as the left
  operand (`w @ v`): one left-alone woq_int8 row each, reasons from patterns/unclaimed.py.
- `lora_training`: a frozen quantized linear of any family (woq forms, dynamic-int8 forms without PT2E, MX
  weight-only or dynamic) beside a trainable low-rank adapter, `base(x) + (x @ A.T) @ B.T`, x requiring
  grad, the base's float scale trainable too in some cases (`scale_grad`); forward + backward. The joint
  graph's backward reads the base's intermediates (a dynamic-int8 product before its per-token scale): the
  forward linear's rows all the case's family, one lowered; a dynamic-int8 base one dynamic_int8 row, lowered
  (tests/end_to_end/test_dynamic_int8_training.py); the backward's own products of dequantized data, rows of
  their own.
- `mx_decode_training`: a weight-only MX linear, x requiring grad, forward + backward, mostly fp16: partial
  blocks (K % 32 != 0, `repeat_interleave(32)[:, :K]`), every weight format, tiny scale codes (fp16
  subnormal weights), scale code 0, a run-time fp4 table, high-nibble-first fp4. The backward's grad_x = grad_y @ dequant(w) is no MX
  linear (left alone) and reads qlower's decode of the lowered forward (tests/end_to_end/test_mx_training.py).
- `producer_ops`: a quantized linear inside a producer library's own op (`PRODUCER_FORMS`): optimum-quanto's
  frozen qint8 `QLinear` (`quanto::qbytes_mm`, lowered as woq_int8), its `activations=qint8` arithmetic
  written with quanto's ops (lowered as dynamic_int8), its qfloat8 weights (an mx row naming the op, left
  alone), and an op of vLLM's namespace on a 4-bit weight packed in int32 words (a woq_int8 row naming the
  op, left alone) (tests/patterns/test_producer_ops.py).

torchao is imported only when an `mx_training` case is built, optimum-quanto when a `producer_ops` one is.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import qlower
from qlower.quantize import mx_format as fmt
from scripts.fuzz.case import Case
from tests.forms import dynamic_int8 as dyn_forms
from tests.forms import mx as mx_forms
from tests.forms import woq_int8 as woq_forms

# The reason woq_int8 gives a dynamic-int8 linear it leaves to dynamic_int8 (qlower/patterns/woq_int8.py).
DYNAMIC_ACTIVATION_WORDS = ("activation is a dequantized int8 tensor", "dynamic_int8")

# name -> (the families it applies to, its weight when drawn at random), merged into draw.VARIANTS
VARIANTS: dict[str, tuple[tuple[str, ...], int]] = {
    "mx_training": (("mx",), 6),
    "family_order": (("dynamic_int8",), 10),
    "near_mx": (("mx",), 10),
    "stacked_experts": (("woq_int8",), 10),
    "lora_training": (("woq_int8", "dynamic_int8", "mx"), 8),
    "mx_decode_training": (("mx",), 8),
    "producer_ops": (("woq_int8", "dynamic_int8", "mx"), 8),
}
# forward + backward through steps.train_call
TRAINING = ("mx_training", "lora_training", "mx_decode_training")
# drawn only when `--variant` names them: added to the random draw, a class would change the variant of
# seeds drawn before it (the seeds an issue cites)
ON_REQUEST = ("lora_training", "mx_decode_training", "producer_ops")

# ------------------------------------------------------------------------------------------ draws
# tokens, K, N: multiples of 32 (MX blocks along each matmul's K: K, N and tokens), odd block counts included
MX_TRAINING_DIMS = {
    "cpu": (32, 64, 96, 128, 160, 192, 224, 256),
    "cuda": (32, 64, 96, 160, 224, 256, 384, 512, 736, 1024, 2048),
}
MX_TRAINING_MAX_TOKENS = {"cpu": 256, "cuda": 1024}
MX_TRAINING_BUILDERS = ("MXFP8Linear", "MXFP8TrainingOpConfig")
# torchao ScaleCalculationMode of MXFP8Linear. EVEN is left out: stock torch.compile (torch 2.13, CPU) fails
# on its backward with "make_reindexer NYI on DtypeView", qlower or not.
MX_TRAINING_SCALE_MODES = ("RCEIL", "FLOOR", "CEIL")

FAMILY_ORDER_FORMS = ("scale_on_weight", "scale_after_linear", "fp32_dequant")

# decode -> (elements per scale, the start of qlower's reason for leaving it alone)
NOT_MX_SCALE = "scale decode differs from e8m0"
NOT_MX_BLOCKS = "weight is computed from 8-bit data"
NEAR_MX: dict[str, tuple[int, str]] = {
    "e4m3_scale": (32, NOT_MX_SCALE),  # the scale bytes read as e4m3 values
    "e5m2_scale": (32, NOT_MX_SCALE),
    "exp2_bias126": (32, NOT_MX_SCALE),  # 2 ** (e - 126): e8m0 off by one
    "exp2_bias128": (32, NOT_MX_SCALE),
    "e8m0_block16": (16, NOT_MX_BLOCKS),  # e8m0 codes, one per 16 elements
    "nvfp4": (16, NOT_MX_BLOCKS),  # e2m1 elements, an e4m3 scale per 16, a global fp32 scale
}
NEAR_MX_SPELLINGS = ("linear", "fp32_matmul")

# form -> a phrase of its row's reason (patterns/unclaimed.py; tests/end_to_end/test_report.py::SILENT_BEFORE)
STACKED: dict[str, str] = {
    "bmm": "batched matmul",
    "einsum": "batched matmul",
    "w_left_vector": "matrix-vector product W @ x",
    "w_left_matrix": "is the left operand (W @ x)",
}
EXPERTS = (1, 2, 4, 8)

# lora_training: the frozen bases (tests/forms/woq_int8.py FORMS, tests/forms/dynamic_int8.py, MXLinear
# formats)
LORA_DYN_FORMS = (
    "IntMMDivide",
    "IntMMReciprocal",
    "OutDtypeMM",
    "Int32MM",
    "FloatCarrier",
    "DequantBoth",
    "DequantEinsum",
    "AsymInt32",
    "QuantizeThenFlatten",
)  # PT2E's quantized_decomposed ops have no autograd kernels
# eager CUDA runs `_int_mm` (M > 16, K and N multiples of 8) and no int32 `mm`: the forms that eager runs there
LORA_DYN_FORMS_CUDA = ("IntMMDivide", "IntMMReciprocal", "OutDtypeMM", "FloatCarrier", "QuantizeThenFlatten")
LORA_MX_FORMATS = ((None, "e4m3"), (None, "e2m1"), ("e4m3", "e4m3"), ("e4m3", "e2m1"))
LORA_RANKS = (1, 4, 8, 16)
# the per-token scale's gradient reads the product before that scale: the reason dynamic_int8 gave that graph
FALSE_NO_ROW_SCALE = "no per-token activation scale"
# how the CUDA rule's reason starts (devices/cuda.py TRAINING_STOCK: scripts use public names only; the two are
# kept equal by tests/tools/test_fuzz_smoke.py::test_mx_training_rows_left_to_stock_only_on_cuda_auto)
TRAINING_STOCK = "a training compile: stock Inductor"

# mx_decode_training: form -> weight; partial blocks' K (even: packed e2m1); the specials qlower lowers whose
# weights are finite (scale code 0 in the data; a NaN weight makes eager's grad_x NaN, nothing to compare)
MX_DECODE_FORMS = {"partial_block": 5, "mx_linear": 2, "mx_extreme": 1, "mx_special": 2}
MX_DECODE_PARTIAL_K = (16, 48, 80, 100, 136, 200, 1000)  # 16: one block, no loop split to get wrong
MX_DECODE_SPECIALS = ("lut_buffer", "hi_nibble")


def unavailable() -> dict[str, str]:
    """Variants this environment cannot run, and why (mx_training builds torchao's modules, producer_ops
    optimum-quanto's)."""
    out = {}
    if importlib.util.find_spec("torchao") is None:
        out["mx_training"] = "torchao is not installed"
    if importlib.util.find_spec("optimum") is None or importlib.util.find_spec("optimum.quanto") is None:
        out["producer_ops"] = "optimum-quanto is not installed"
    return out


def _own_form(c: Case, form: str) -> None:
    """The class's own model: the base draw's form choices (MX formats, scale dtype, kn) do not apply."""
    c.form = form
    c.extra = {k: v for k, v in c.extra.items() if k in ("variant", "all_families")}


def draw_mx_training(rng: random.Random, c: Case) -> None:
    _own_form(c, rng.choice(MX_TRAINING_BUILDERS))
    dims = MX_TRAINING_DIMS[c.device]
    tokens = rng.choice([t for t in dims if t <= MX_TRAINING_MAX_TOKENS[c.device]])
    c.k, c.n = rng.choice(dims), rng.choice(dims)
    c.batch = rng.choice((None, 1, 2))
    c.m = tokens // (c.batch or 1)
    c.dtype, c.preference, c.dynamic, c.m2 = "bfloat16", "AUTO", False, None
    c.bias = rng.random() < 0.5
    if c.form == "MXFP8Linear":
        c.extra["scale_mode"] = rng.choice(MX_TRAINING_SCALE_MODES)


def draw_family_order(rng: random.Random, c: Case) -> None:
    _own_form(c, rng.choice(FAMILY_ORDER_FORMS))
    c.extra.pop("all_families", None)  # replaced by the drawn order
    int8 = ["woq_int8", "dynamic_int8"]
    if rng.random() < 0.5:
        chosen = list(qlower.FAMILIES)
    else:  # a subset holding an int8 family: with neither, no family looks at an int8 linear (no row)
        chosen = list(dict.fromkeys([rng.choice(int8)] + [f for f in qlower.FAMILIES if rng.random() < 0.5]))
    rng.shuffle(chosen)
    c.extra["families"] = ",".join(chosen)
    c.bias = False
    layout = rng.choice(("1d", "2d", "3d"))
    if layout == "1d":  # a vector-matrix product: one token, no dim to mark dynamic
        c.extra["x_dims"] = "k"
        c.m, c.batch, c.dynamic, c.m2 = 1, None, False, None
    else:
        c.batch = None if layout == "2d" else c.batch or rng.choice((1, 2, 3))


def draw_near_mx(rng: random.Random, c: Case) -> None:
    _own_form(c, "near_mx")
    decode = rng.choice(list(NEAR_MX))
    elem = "e2m1" if decode == "nvfp4" else rng.choice(("e4m3", "e5m2", "e2m1"))
    c.extra.update(decode=decode, elem=elem, spelling=rng.choice(NEAR_MX_SPELLINGS))
    c.k = max(32, c.k // 32 * 32)  # MX-shaped: whole 32-element blocks (the base draw may be a partial one)
    c.bias = rng.random() < 0.5


def draw_stacked_experts(rng: random.Random, c: Case) -> None:
    _own_form(c, rng.choice(list(STACKED)))
    c.bias = False
    if c.form in ("bmm", "einsum"):
        e = rng.choice(EXPERTS)
        c.extra["experts"] = e
        c.batch = e if c.form == "bmm" else None  # bmm: x [E, M, K]; einsum: x [M, K] against every expert
        return
    c.extra["x_dims"] = "k" if c.form == "w_left_vector" else "k,m"  # v [K] or [K, B] (B = M)
    c.batch, c.dynamic, c.m2 = None, False, None
    if c.form == "w_left_vector":
        c.m = 1


def draw_lora_training(rng: random.Random, c: Case) -> None:
    rank = rng.choice(LORA_RANKS)
    if c.device == "cpu" and c.preference == "TRITON":  # declined on CPU: the class checks decisions
        c.preference = "AUTO"
    if c.family == "woq_int8":
        _own_form(c, rng.choice(woq_forms.FORMS))
        c.extra["scale_grad"] = c.form != "unscaled" and rng.random() < 0.3
    elif c.family == "dynamic_int8":
        _own_form(c, rng.choice(LORA_DYN_FORMS_CUDA if c.device == "cuda" else LORA_DYN_FORMS))
        c.extra.update(kn=rng.random() < 0.3, scale_grad=rng.random() < 0.3)
        if c.device == "cuda":  # what eager `_int_mm` takes
            c.k, c.n = max(8, c.k // 8 * 8), max(8, c.n // 8 * 8)
            c.m = max(c.m, 17)
            c.m2 = max(c.m2, 17) if c.m2 is not None else None
            if c.m2 == c.m:
                c.m2 += 1
    else:
        a_elem, w_elem = rng.choice(LORA_MX_FORMATS)
        _own_form(c, f"{a_elem or 'none'}-{w_elem}")  # activation, weight formats
        c.k = max(32, c.k // 32 * 32)  # whole MX blocks
        c.dtype = rng.choice(("bfloat16", "float16"))
    c.extra["rank"] = rank


def draw_mx_decode_training(rng: random.Random, c: Case) -> None:
    forms = list(MX_DECODE_FORMS)
    _own_form(c, rng.choices(forms, weights=[MX_DECODE_FORMS[f] for f in forms])[0])
    c.dtype = "float16" if rng.random() < 0.7 else "bfloat16"
    c.bias = c.form != "partial_block" and rng.random() < 0.5
    if c.device == "cpu" and c.preference not in ("AUTO", "EMULATED"):  # MX on a CPU: the emulation only
        c.preference = "AUTO"
    if c.form == "partial_block":
        c.k = rng.choice(MX_DECODE_PARTIAL_K)
        c.extra["elem"] = rng.choice(("e4m3", "e2m1"))
        return
    c.k = max(32, c.k // 32 * 32)
    if c.form == "mx_special":
        special = rng.choice(MX_DECODE_SPECIALS)
        c.extra.update(special=special, elem=rng.choice(mx_forms.MX_SPECIALS[special]))
        return
    c.extra["elem"] = rng.choice(("e4m3", "e5m2", "e2m1"))
    if c.form == "mx_linear":
        c.extra["e8m0"] = rng.random() < 0.3
    # mx_extreme: weights fp16 subnormals ('large' ones overflow eager's fp16 grad_x: nothing to compare)


# producer_ops: family -> the forms it draws, each form's row: (family, lowered, how its reason starts)
PRODUCER_FORMS: dict[str, tuple[str, ...]] = {
    "woq_int8": ("quanto_qint8", "unproven_op"),
    "dynamic_int8": ("quanto_int8_act",),
    "mx": ("quanto_qfloat8",),
}
PROBE_OP = (
    "vllm::qlower_fuzz_w4a16_gemm"  # vLLM's namespace, a name no library uses: an op qlower cannot prove
)
PRODUCER_ROWS: dict[str, tuple[str, bool, str]] = {
    "quanto_qint8": ("woq_int8", True, ""),
    "quanto_int8_act": ("dynamic_int8", True, ""),
    "quanto_qfloat8": ("mx", False, "quanto::"),  # quanto::qbytes_mm, or the Marlin op it picks on some GPUs
    "unproven_op": ("woq_int8", False, f"{PROBE_OP}: vLLM's own op;"),
}


def draw_producer_ops(rng: random.Random, c: Case) -> None:
    _own_form(c, rng.choice(PRODUCER_FORMS[c.family]))
    if c.form == "unproven_op":  # eight 4-bit values per int32 word along K
        c.k, c.bias = max(8, c.k // 8 * 8), False
    elif c.form == "quanto_qint8" and c.device == "cpu" and c.dtype == "bfloat16" and c.k % 4 == 0:
        # quanto's CPU kernel, the eager reference, calls `_weight_int8pack_mm` here, which needs K % 16 == 0:
        # K = 100 segfaulted (torch 2.13, AVX512). qlower's compile does not call it (its rules check K)
        c.k = max(16, c.k // 16 * 16)


DRAWS: dict[str, Callable[[random.Random, Case], None]] = {
    "mx_training": draw_mx_training,
    "family_order": draw_family_order,
    "near_mx": draw_near_mx,
    "stacked_experts": draw_stacked_experts,
    "lora_training": draw_lora_training,
    "mx_decode_training": draw_mx_decode_training,
    "producer_ops": draw_producer_ops,
}


def families(case: Case) -> tuple[str, ...] | None:
    """The `families=` the case compiles with, in its drawn order; None where the class does not draw it."""
    order = case.extra.get("families")
    return tuple(order.split(",")) if order else None


# ------------------------------------------------------------------------------------------ models
class FamilyOrderLinear(nn.Module):
    """A dynamic-int8 linear written dequantize-then-matmul: woq_int8 also sees a dequantized int8 weight in
    it, so the family that decides must not depend on the order of `families=`
    (tests/patterns/test_family_order.py's `scale_on_weight`, `scale_after_linear`; `fp32_dequant` is
    tests/forms/dynamic_int8.py's DequantBoth)."""

    def __init__(self, k: int, n: int, form: str, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.form = form
        self.register_buffer("q", torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8))
        self.register_buffer("s", torch.rand(n, generator=g) / 100 + 1e-3)

    @staticmethod
    def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = x.abs().amax(-1, keepdim=True).clamp_min(1e-5) / 127
        return (x / s).round().clamp(-128, 127), s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq, sx = self._quantize(x)
        xq, dt = xq.to(torch.int8), x.dtype
        if self.form == "scale_on_weight":
            return (xq.to(dt) * sx) @ (self.q.to(dt) * self.s.to(dt)[:, None]).t()
        if self.form == "scale_after_linear":
            return F.linear(xq.to(dt) * sx, self.q.to(dt)) * self.s.to(dt)
        xd = xq.float() * sx.float()
        return F.linear(xd, self.q.float() * self.s[:, None]).to(dt)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 with the activation quantized exactly (eager rounds x / s in x's dtype first)."""
        xq, sx = self._quantize(x.double())
        return (xq * sx) @ (self.q.double() * self.s.double()[:, None]).t()


class NearMXLinear(nn.Module):
    """A weight decoded MX-like but not as MX (`NEAR_MX`): fp8 or packed e2m1 elements times one scale per
    block along K, the scale byte decoded otherwise than e8m0, or blocks of 16. qlower must leave it alone."""

    def __init__(self, n: int, k: int, decode: str, elem: str, spelling: str, bias: bool, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.n, self.k, self.decode, self.elem, self.spelling = n, k, decode, elem, spelling
        self.block = NEAR_MX[decode][0]
        if elem == "e2m1":
            q = fmt.pack_e2m1(torch.randint(0, 16, (n, k), generator=g))
        else:
            q = (torch.randn(n, k, generator=g) * 2).to(fmt.FP8_DTYPE[elem])
        # scale bytes whose own decode lies in 2^-6 .. 2^4 (never an fp8 NaN / Inf): finite fp16 outputs
        lo, hi = {"e4m3_scale": (0x28, 0x48), "e5m2_scale": (0x34, 0x44), "nvfp4": (0x28, 0x48)}.get(
            decode, (122, 130)
        )
        e = torch.randint(lo, hi + 1, (n, k // self.block), generator=g, dtype=torch.uint8)
        self.register_buffer("q", q)
        self.register_buffer("e", e.view(torch.float8_e4m3fn) if decode == "nvfp4" else e)
        self.register_buffer("gs", torch.tensor(0.5))  # nvfp4's per-tensor scale
        self.register_buffer("b", torch.randn(n, generator=g) * 0.1 if bias else None)

    def _elements(self) -> torch.Tensor:
        if self.elem != "e2m1":
            return self.q.float()
        lut = torch.tensor(fmt.E2M1_VALUES, device=self.q.device)
        return lut[torch.stack([self.q & 15, self.q >> 4], -1).view(self.n, self.k).long()]

    def _scales(self) -> torch.Tensor:
        d, e = self.decode, self.e
        if d == "e4m3_scale":
            return e.view(torch.float8_e4m3fn).float()
        if d == "e5m2_scale":
            return e.view(torch.float8_e5m2).float()
        if d == "exp2_bias126":
            return 2 ** (e.float() - 126)
        if d == "exp2_bias128":
            return torch.exp2(e.float() - 128)
        if d == "e8m0_block16":
            return torch.exp2(e.float() - 127)
        return e.float() * self.gs

    def weight(self) -> torch.Tensor:
        """[N, K] fp32: exact (fp8 / e2m1 values times powers of two or fp8 values)."""
        w = self._elements().view(self.n, self.k // self.block, self.block) * self._scales()[..., None]
        return w.view(self.n, self.k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight()
        if self.spelling == "fp32_matmul":
            y = x.float() @ w.t()
            return (y if self.b is None else y + self.b).to(x.dtype)
        return F.linear(x, w.to(x.dtype), None if self.b is None else self.b.to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        y = x.double() @ self.weight().double().t()
        return y if self.b is None else y + self.b.double()


class StackedExperts(nn.Module):
    """Stacked int8 experts or the weight as the left operand (`STACKED`): quantized linears no recognizer
    takes, which patterns/unclaimed.py must still report (one left-alone row each)."""

    def __init__(self, form: str, experts: int, n: int, k: int, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        lead = (experts,) if form in ("bmm", "einsum") else ()
        self.form = form
        self.register_buffer("w", torch.randint(-127, 128, (*lead, n, k), generator=g, dtype=torch.int8))
        self.register_buffer("s", torch.rand(*lead, n, generator=g) / 100 + 1e-3)

    def _product(self, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if self.form == "bmm":
            return torch.bmm(x, w.transpose(1, 2)) * s[:, None]
        if self.form == "einsum":
            return torch.einsum("mk,enk->emn", x, w) * s[:, None]
        if self.form == "w_left_vector":
            return (w @ x) * s
        return (w @ x) * s[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, self.w.to(x.dtype), self.s.to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 of the same formula, the scale rounded to x's dtype as the model does."""
        return self._product(x.double(), self.w.double(), self.s.to(x.dtype).double())


class LoRALinear(nn.Module):
    """y = base(x) + (x @ A.T) @ B.T: a frozen quantized linear and a trainable rank-r adapter in x's dtype
    (A [r, K], B [N, r]). Compared with eager: an MX base with quantized activations has no float64 twin."""

    def __init__(self, base: nn.Module, k: int, n: int, rank: int, dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed + 29)
        self.base = base
        self.a = nn.Parameter((torch.randn(rank, k, generator=g) * k**-0.5).to(dtype))
        self.b = nn.Parameter((torch.randn(n, rank, generator=g) * 0.1).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


class LoRAWithReference(LoRALinear):
    """A LoRALinear whose base has a float64 `reference` (woq, dynamic int8: the unquantized activation, MX
    weight-only): the adapter added in float64 from the same parameters."""

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        lora = (x.double() @ self.a.double().t()) @ self.b.double().t()
        return self.base.reference(x) + lora


def _lora_base(case: Case, seed: int) -> nn.Module:
    """The frozen base of a lora_training case; its float scale trainable where `scale_grad` says so."""
    dtype = getattr(torch, case.dtype)
    if case.family == "woq_int8":
        base: nn.Module = woq_forms.WoqLinear(case.k, case.n, dtype, case.form, case.bias, seed=seed)
    elif case.family == "dynamic_int8":
        form = getattr(dyn_forms, case.form)
        base = form(case.k, case.n, bias=case.bias, kn=case.extra["kn"], seed=seed)
    else:
        a_elem, w_elem = case.form.split("-")
        base = mx_forms.MXLinear(
            None if a_elem == "none" else a_elem, w_elem, case.n, case.k, bias=case.bias, seed=seed
        )
    if case.extra.get("scale_grad"):
        s = base.s.detach().clone()
        base._parameters.pop("s", None)  # a frozen parameter (woq) or a buffer (dynamic int8)
        base._buffers.pop("s", None)
        base.s = nn.Parameter(s)
    return base


def _torchao_mx_training(case: Case) -> nn.Module:
    """torchao's MX training linear, as tests/end_to_end/test_mx_training.py builds it, on the case's
    device."""
    from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
    from torchao.prototype.moe_training.mxfp8_linear import MXFP8Linear
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    def linear() -> nn.Module:
        return MXFP8Linear(
            case.k,
            case.n,
            bias=case.bias,
            kernel_preference=KernelPreference.EMULATED,
            scale_calculation_mode=ScaleCalculationMode[case.extra.get("scale_mode", "RCEIL")],
        ).to(case.device, torch.bfloat16)

    with torch.random.fork_rng(devices=[]):  # nn.Linear's init draws from the global generator
        torch.manual_seed(case.seed % (1 << 31))
        if case.form == "MXFP8Linear":
            return linear()
        model = nn.Sequential(nn.Linear(case.k, case.n, bias=case.bias)).to(case.device, torch.bfloat16)
        try:
            quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_EMULATED_RCEIL))
        except AssertionError as err:  # torchao 0.18 refuses the config on torch < 2.12 ("latest nightly")
            if "nightly" not in str(err):
                raise
            case.extra["builder_fallback"] = f"MXFP8Linear ({str(err)[:60]})"
            return linear()
    return model


def _mx_decode_model(case: Case, seed: int) -> nn.Module:
    """mx_decode_training's weight-only MX linear (tests/forms/mx.py), with its float64 `reference`."""
    ex = case.extra
    if case.form == "partial_block":
        return mx_forms.MXPartialBlock(ex["elem"], case.n, case.k, seed)
    if case.form == "mx_linear":
        return mx_forms.MXLinear(None, ex["elem"], case.n, case.k, ex["e8m0"], case.bias, seed)
    if case.form == "mx_special":
        return mx_forms.MXSpecial(case.n, case.k, ex["special"], ex["elem"], case.bias, seed)
    return mx_forms.MXExtreme(case.n, case.k, ex["elem"], "f16_dequant", "tiny", 0, case.bias, seed)


class QuantoLinear(nn.Module):
    """optimum-quanto's frozen QLinear, quantized as quanto's README does: the module itself
    (`quanto_qint8`, `quanto_qfloat8`), or what its `activations=qint8` form computes up to its output's
    quantization, written with quanto's ops from the calibrated module's tensors (`quanto_int8_act`: Dynamo
    breaks the graph around the QLinear's activation subclass, and the fuzz compiles whole graphs): x
    quantized per tensor (`quantize_symmetric`), `qbytes_mm(x_int8, w_int8, s_x * s_w)`, the bias."""

    def __init__(
        self, form: str, k: int, n: int, bias: bool, dtype: torch.dtype, device: str, seed: int
    ) -> None:
        super().__init__()
        import optimum.quanto as oq  # optional: `unavailable()`

        self.form = form
        with torch.random.fork_rng(devices=[]):  # nn.Linear's init draws from the global generator
            torch.manual_seed(seed)
            model = nn.Sequential(nn.Linear(k, n, bias=bias)).to(device, dtype)
            calib = (torch.randn(64, k) * 2 + 0.3).to(device, dtype)  # models.make_x's int8 inputs
        act = oq.qint8 if form == "quanto_int8_act" else None
        oq.quantize(model, weights=oq.qfloat8 if form == "quanto_qfloat8" else oq.qint8, activations=act)
        if act is not None:
            with oq.Calibration():
                model(calib)
        oq.freeze(model)
        lin = model[0]
        self._ref = (lin.weight._data, lin.weight._scale, lin.bias)  # what `reference` reads
        if act is None:
            self.inner = model
            return
        self.register_buffer("w", lin.weight._data)
        self.register_buffer("sw", lin.weight._scale)
        self.register_buffer("sx", lin.input_scale.detach().clone())
        self.register_buffer("b", None if lin.bias is None else lin.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.form != "quanto_int8_act":
            return self.inner(x)
        xq = torch.ops.quanto.quantize_symmetric(x, torch.int8, None, self.sx)
        y = torch.ops.quanto.qbytes_mm(xq, self.w, self.sx * self.sw)
        return y if self.b is None else y + self.b

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 of the stored weight and scale (x unquantized)."""
        data, scale, bias = self._ref
        y = x.double() @ (data.double() * scale.double()).t()
        return y if bias is None else y + bias.double()


def _register_probe_op() -> None:
    """`PROBE_OP(x, packed, scales)`: x [..., K] times a 4-bit weight (codes - 8) packed eight to an int32
    word along K ([N, K / 8]), each row times scales [N]; registered once per process."""
    ns, name = PROBE_OP.split("::")
    if hasattr(getattr(torch.ops, ns), name):
        return

    @torch.library.custom_op(PROBE_OP, mutates_args=())
    def probe(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
        w = ((packed[..., None] >> shifts) & 15).reshape(packed.shape[0], -1).to(x.dtype) - 8
        return x @ (w * scales[:, None]).t()

    @probe.register_fake
    def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        return x.new_empty(*x.shape[:-1], packed.shape[0])


class ProbeProducerOp(nn.Module):
    """A packed 4-bit linear inside `PROBE_OP`: an op of a producer's namespace that qlower cannot prove."""

    def __init__(self, k: int, n: int, dtype: torch.dtype, seed: int) -> None:
        super().__init__()
        _register_probe_op()
        g = torch.Generator().manual_seed(seed)
        codes = torch.randint(0, 16, (n, k // 8, 8), generator=g, dtype=torch.int32)
        packed = torch.zeros(n, k // 8, dtype=torch.int32)
        for i in range(8):
            packed |= codes[..., i] << (4 * i)
        self.register_buffer("packed", packed)
        self.register_buffer("codes", codes.reshape(n, k).to(torch.int8))
        self.register_buffer("scales", (torch.rand(n, generator=g) / 10 + 0.01).to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(torch.ops.vllm, PROBE_OP.split("::")[1])(x, self.packed, self.scales)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() @ ((self.codes.double() - 8) * self.scales.double()[:, None]).t()


def build(case: Case, to_device: Callable[[nn.Module, str], nn.Module]) -> nn.Module:
    """The class's model on the case's device; `reference` (float64) where the formula is known."""
    variant, seed = case.extra["variant"], case.seed % (1 << 31)
    if variant == "mx_training":
        return _torchao_mx_training(case)
    if variant == "mx_decode_training":
        return to_device(_mx_decode_model(case, seed), case.device)
    if variant == "producer_ops":
        if case.form == "unproven_op":
            return to_device(ProbeProducerOp(case.k, case.n, getattr(torch, case.dtype), seed), case.device)
        return QuantoLinear(
            case.form, case.k, case.n, case.bias, getattr(torch, case.dtype), case.device, seed
        )
    if variant == "lora_training":
        base = _lora_base(case, seed)
        twin = case.family != "mx" or case.form.startswith("none")  # MX weight-only: float64 reference
        cls = LoRAWithReference if twin else LoRALinear
        lora = cls(base, case.k, case.n, case.extra["rank"], getattr(torch, case.dtype), seed)
        return to_device(lora, case.device)
    if variant == "family_order":
        model: nn.Module = FamilyOrderLinear(case.k, case.n, case.form, seed)
    elif variant == "near_mx":
        ex = case.extra
        model = NearMXLinear(case.n, case.k, ex["decode"], ex["elem"], ex["spelling"], case.bias, seed)
    else:
        model = StackedExperts(case.form, case.extra.get("experts", 1), case.n, case.k, seed)
    return to_device(model, case.device)


# ------------------------------------------------------------------------------------------ rows
def _int_shape(d: dict[str, Any]) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in d["shape"])
    except ValueError:
        return None


def _row(d: dict[str, Any]) -> str:
    return f"({d['family']}, {d['lowering'] or 'left alone'}, {(d['reason'] or '')[:80]!r})"


def check_rows(case: Case, decisions: list[dict[str, Any]]) -> str | None:
    """What is wrong with the report rows of a class's case (`decisions`: run._decisions), or None.

    Every compile of the case reports its quantized linear (each graph of a dynamic M, the forward and the
    backward of a training step): the count, family, lowered or left alone and the reason are the class's.
    """
    variant = case.extra.get("variant")
    if variant not in VARIANTS:
        return None
    if variant == "lora_training":
        return _lora_rows(case, decisions)
    if variant == "mx_decode_training":
        return _mx_decode_rows(case, decisions)
    if variant == "mx_training":
        t = case.m * (case.batch or 1)
        want = sorted([(t, case.k, case.n), (t, case.n, case.k), (case.n, t, case.k)])
        got = sorted(_int_shape(d) or () for d in decisions)
        if got != want or any(d["family"] != "mx" or not _lowered_or_stock(case, d) for d in decisions):
            rows = [(d["family"], d["shape"], d["lowering"] or d["reason"]) for d in decisions]
            return f"MX training rows: want (M, K, N) {want} all mx and lowered, got {rows}"
        return None
    by_compile: dict[int, list[dict[str, Any]]] = {}
    for d in decisions:
        by_compile.setdefault(d["compile"], []).append(d)
    for rows in by_compile.values():
        if len(rows) != 1:
            return f"{len(rows)} rows in one compile, want 1: {', '.join(map(_row, rows))}"
        (d,) = rows
        if variant == "family_order":
            fams = families(case) or ()
            if "dynamic_int8" in fams:
                if d["family"] != "dynamic_int8" or not d["lowering"]:
                    return f"families={list(fams)}: want dynamic_int8 lowered, got {_row(d)}"
            elif (
                d["family"] != "woq_int8"
                or d["lowering"]
                or not all(w in (d["reason"] or "") for w in DYNAMIC_ACTIVATION_WORDS)
            ):
                return (
                    f"families={list(fams)}: want woq_int8 left alone with DYNAMIC_ACTIVATION, got {_row(d)}"
                )
        elif variant == "near_mx":
            start = NEAR_MX[case.extra["decode"]][1]
            if d["family"] != "mx" or d["lowering"] or not (d["reason"] or "").startswith(start):
                return f"want mx left alone, reason starting {start!r}, got {_row(d)}"
        elif variant == "producer_ops":
            family, lowered, start = PRODUCER_ROWS[case.form]
            reason = d["reason"] or ""
            if d["family"] != family or bool(d["lowering"]) != lowered or not reason.startswith(start):
                state = "lowered" if lowered else f"left alone, reason starting {start!r}"
                return f"want {family} {state}, got {_row(d)}"
            k = d["shape"][1]  # an op's row reads K from x, which a dynamic compile marks symbolic
            if d["shape"][2] != str(case.n) or (k.isdigit() and k != str(case.k)):
                return f"want (K, N) = ({case.k}, {case.n}), got {d['shape']}"
        else:
            phrase = STACKED[case.form]
            reason = d["reason"] or ""
            if d["family"] != "woq_int8" or d["lowering"] or phrase not in reason or "int8[" not in reason:
                return f"want woq_int8 left alone, reason with {phrase!r} and int8[..], got {_row(d)}"
    return None


def _lowered_or_stock(case: Case, d: dict[str, Any]) -> bool:
    """A training compile's MX row is lowered, or left to stock (`_left_to_stock`)."""
    return bool(d["lowering"]) or _left_to_stock(case, d)


def _left_to_stock(case: Case, d: dict[str, Any]) -> bool:
    """On CUDA under AUTO, an MX x MX product of a training compile left to stock Inductor because qlower's
    emulation measured slower there (devices/cuda.py `_prefer_mx_emulated`)."""
    on_cuda_auto = case.device.startswith("cuda") and case.preference == "AUTO"
    return on_cuda_auto and not d["lowering"] and (d["reason"] or "").startswith(TRAINING_STOCK)


def _mx_decode_rows(case: Case, decisions: list[dict[str, Any]]) -> str | None:
    """mx_decode_training: every row mx; in each compile one row lowered, the forward's (K, N) (the backward's
    grad_x matmul, blocks along N, is left alone)."""
    rows = ", ".join(map(_row, decisions))
    if any(d["family"] != "mx" for d in decisions):
        return f"rows of another family than mx: {rows}"
    by_compile: dict[int, list[dict[str, Any]]] = {}
    for d in decisions:
        by_compile.setdefault(d["compile"], []).append(d)
    for ds in by_compile.values():
        lowered = [d for d in ds if d["lowering"]]
        if len(lowered) != 1 or lowered[0]["shape"][1:] != [str(case.k), str(case.n)]:
            return f"want the forward (K, N) = ({case.k}, {case.n}) the one row lowered: {rows}"
    return None


def _lora_rows(case: Case, decisions: list[dict[str, Any]]) -> str | None:
    """lora_training, per compile: the forward linear (its M, K, N) lowered by the case's family and by no
    other; a dynamic-int8 base one dynamic_int8 row, lowered; no row with the reason the per-token scale's
    gradient once gave. Backward products of dequantized data (grad_x through a dequantized weight, a
    scale's gradient: a matrix-vector product whose K, N may be the forward's) are rows of their own, of
    whichever family their operands make them, with their reasons."""
    shape = [str(case.m * (case.batch or 1)), str(case.k), str(case.n)]
    by_compile: dict[int, list[dict[str, Any]]] = {}
    for d in decisions:
        by_compile.setdefault(d["compile"], []).append(d)
    for rows in by_compile.values():
        text = ", ".join(map(_row, rows))
        if any(FALSE_NO_ROW_SCALE in (d["reason"] or "") for d in rows):
            return f"a backward reader of the product taken for a missing per-token scale: {text}"
        forward = [d for d in rows if d["lowering"] and _same_shape(d["shape"], shape)]
        if any(d["family"] != case.family for d in forward):
            return f"the forward linear lowered by another family than {case.family}: {text}"
        if not forward and any(_left_to_stock(case, d) for d in rows if _same_shape(d["shape"], shape)):
            continue
        if not forward:
            return f"the forward linear (M, K, N) = ({', '.join(shape)}) not lowered: {text}"
        own = [d for d in rows if d["family"] == case.family]
        if case.family == "dynamic_int8" and (len(own) != 1 or not own[0]["lowering"]):
            return f"want one dynamic_int8 row, lowered: {text}"
    return None


def _same_shape(got: list[str], want: list[str]) -> bool:
    """A row's (M, K, N) is `want`'s: K and N equal, M equal or symbolic (a dynamic compile's)."""
    return got[1:] == want[1:] and (got[0] == want[0] or not got[0].isdigit())
