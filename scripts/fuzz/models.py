"""The fuzz's models: a case's linear in the form it drew (the forms of tests/forms/), the fuzz's own forms
(torchao's matvec spelling, hand-written MX functions as modules, a partial MX block, a heads epilogue), and
`build`: the model on the case's device with the eager twin and float64 reference it is checked against.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scripts.fuzz import classes
from scripts.fuzz.case import DTYPES, Case
from tests.forms import dynamic_int8 as dyn
from tests.forms import mx as mx_forms
from tests.forms import woq_int8 as woq_forms
from tests.forms.woq_int8 import WoqLinear

# dynamic-int8 forms (tests/forms/dynamic_int8.py), as tests/end_to_end/test_dynamic_int8_numerics.py uses
# them
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
WRITE_TARGETS = {"woq_int8": ("w", "s"), "dynamic_int8": ("q", "s"), "mx": ("q", "e")}  # (weight, its scale)


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
    """A hand-written MX form f(x, q, e) of tests/forms/mx.py with q, e as buffers (static under dynamic=True)."""

    def __init__(self, name: str, n: int, k: int, seed: int) -> None:
        super().__init__()
        self.name, self.fn = name, mx_forms.hand_written_forms(n, k)[name]
        _, q, e = mx_forms.form_inputs(name, n, k, m=1, seed=seed)
        self.register_buffer("q", q)
        self.register_buffer("e", e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.q, self.e)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        y = mx_forms.reference(self.name, x, self.q, self.e)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class MXPartialBlock(nn.Module):
    """tests/end_to_end/test_mx_cpu.py's K-not-a-multiple-of-32 spelling: qlower must leave it alone, with a
    reason."""

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
            y = woq_forms.split_heads(y, x.shape[:-1], self.h, self.d, self.split)
        return self._epilogue(y, x, f64=False)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner.reference(x).reshape(*x.shape[:-1], self.h, self.d)
        return self._epilogue(y, x, f64=True)


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
            return woq_forms.WoqHeads(case.k, *_heads(case), dtype, ex["split"], case.bias, sdt, s)
        if case.form == "expand":
            return woq_forms.WoqExpandScale(case.k, case.n, dtype, ex["scale"], case.bias, sdt, s)
        if case.form == "torchao_matvec":
            return WoqTorchaoMatvec(case.k, case.n, dtype, case.bias, s)
        if "scales" in ex:
            return woq_forms.WoqExtremeScale(
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
        return mx_forms.MXLinear(a_elem, ex["weight"], case.n, case.k, ex["e8m0"], case.bias, s)
    if case.form == "mx_special":
        return mx_forms.MXSpecial(case.n, case.k, ex["special"], ex["elem"], case.bias, s)
    if case.form == "mx_extreme":
        shift = ex.get("shift", 0)
        return mx_forms.MXExtreme(
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


def tensor_at(model: nn.Module, dotted: str) -> torch.Tensor:
    prefix, _, leaf = dotted.rpartition(".")
    return getattr(model.get_submodule(prefix), leaf)


def write_names(case: Case, model: nn.Module) -> list[str]:
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
        arrays = {name: _numpy_backed(model, name) for name in write_names(case, model)}
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
