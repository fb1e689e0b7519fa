"""MX model forms for the tests: hand-written dequantizations and torchao's EMULATED config.

Each hand-written form is a function (x, q, e) -> y over a fixed (N, K), written the way users spell it; the
tests check qlower recognizes every one of them and computes the same numbers.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from qlower.patterns import mx_format as fmt


def hand_written_forms(n: int, k: int) -> dict[str, Callable[..., torch.Tensor]]:
    """name -> f(x, q, e): fp8 [N, K] or packed e2m1 [N, K / 2] elements q, codes e [N, K / 32]."""

    def e8m0_float(x, q, e):  # e: float8_e8m0fnu; .float() is the decode
        w = (q.float().view(n, k // 32, 32) * e.float().unsqueeze(-1)).view(n, k).to(x.dtype)
        return F.linear(x, w)

    def pow2_fp32_matmul(x, q, e):  # e: uint8; the matmul in fp32, cast at the end
        w = (q.float().view(n, k // 32, 32) * 2 ** (e.float() - 127)[..., None]).view(n, k)
        return (x.float() @ w.t()).to(x.dtype)

    def exp2_repeat_interleave(x, q, e):
        s = torch.exp2(e.to(torch.int32) - 127).repeat_interleave(32, dim=1)
        return F.linear(x, (q.to(torch.bfloat16) * s).to(x.dtype))

    def fp4_table_scale_t(x, q, e):  # e stored [K / 32, N]: e.t() is the plain [N, K / 32]
        lut = torch.tensor(fmt.E2M1_VALUES, device=q.device)
        vals = lut[torch.stack([q & 15, q >> 4], -1).view(n, k).long()]
        s = torch.exp2(e.t().float() - 127)
        return F.linear(x, (vals.view(n, k // 32, 32) * s[..., None]).view(n, k).to(x.dtype))

    def fp4_table_moved(x, q, e):
        # `torch.tensor(list, device=q.device)` under dynamic shapes on CUDA traces as a host-built table moved
        # by prims.device_put; spelled out so a CPU trace holds the same node
        lut = torch.ops.prims.device_put(torch.tensor(fmt.E2M1_VALUES), q.device)
        vals = lut[torch.stack([q & 15, q >> 4], -1).view(n, k).long()]
        return F.linear(
            x, (vals.view(n, k // 32, 32) * torch.exp2(e.float() - 127)[..., None]).view(n, k).to(x.dtype)
        )

    def e8m0_einsum(x, q, e):  # e: float8_e8m0fnu; the product written with torch.einsum
        w = (q.float().view(n, k // 32, 32) * e.float().unsqueeze(-1)).view(n, k).to(x.dtype)
        return torch.einsum("...k,nk->...n", x, w)

    def fp4_bits_bias_3d(x, q, e):  # x [B, T, K], bias
        w = fmt.dequantize(q, e, "e2m1", x.dtype)
        return F.linear(x, w, torch.ones(n, dtype=x.dtype, device=x.device))

    return {
        "e8m0_float": e8m0_float,
        "pow2_fp32_matmul": pow2_fp32_matmul,
        "exp2_repeat_interleave": exp2_repeat_interleave,
        "fp4_table_scale_t": fp4_table_scale_t,
        "fp4_table_moved": fp4_table_moved,
        "e8m0_einsum": e8m0_einsum,
        "fp4_bits_bias_3d": fp4_bits_bias_3d,
    }


def form_inputs(name: str, n: int, k: int, m: int = 5, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, q, e) for a hand-written form, and as its float64 reference needs them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g, dtype=torch.float32).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g) * k**-0.5
    elem = "e2m1" if name.startswith("fp4") else "e4m3"
    q, e = fmt.quantize(w, elem)
    if name in ("e8m0_float", "e8m0_einsum"):
        e = e.view(torch.float8_e8m0fnu)
    if name == "fp4_table_scale_t":
        e = e.t().contiguous()
    if name == "fp4_bits_bias_3d":
        x = x.view(1, m, k)
    return x, q, e


def reference(name: str, x: torch.Tensor, q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """float64 x @ dequant(q, e).T (+ bias) for `form_inputs`."""
    elem = "e2m1" if name.startswith("fp4") else "e4m3"
    codes = e.t() if name == "fp4_table_scale_t" else e
    w = fmt.dequantize_f64(q, codes, elem)
    y = x.double().reshape(-1, w.shape[1]) @ w.t()
    if name == "fp4_bits_bias_3d":
        y = (y + 1).reshape(*x.shape[:-1], -1)
    return y


def torchao_mx_model(elem: str, bias: bool, mode: str = "FLOOR", k: int = 64, n: int = 48) -> torch.nn.Module:
    """torchao's MXDynamicActivationMXWeightConfig with KernelPreference.EMULATED on a bf16 Linear."""
    from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig
    from torchao.prototype.mx_formats.mx_tensor import ScaleCalculationMode
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    dt = {"e4m3": torch.float8_e4m3fn, "e2m1": torch.float4_e2m1fn_x2}[elem]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).to(torch.bfloat16)
    cfg = MXDynamicActivationMXWeightConfig(
        activation_dtype=dt,
        weight_dtype=dt,
        kernel_preference=KernelPreference.EMULATED,
        scaling_mode=getattr(ScaleCalculationMode, mode),
    )
    quantize_(m, cfg)
    return m


def trace(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> fx.GraphModule:
    """qlower.testing.trace_for_inductor, tolerating graphs whose tensor constants cannot be deep-copied
    (torchao's fp4 unpacking leaves scalar constants that fake tensor storage refuses to copy)."""
    import qlower.testing as qt

    qt.copy = types.SimpleNamespace(deepcopy=lambda obj: obj)  # type: ignore[attr-defined]
    try:
        return qt.trace_for_inductor(fn, *args, dynamic=dynamic)
    finally:
        qt.copy = copy  # type: ignore[attr-defined]


class MXLinear(torch.nn.Module):
    """A hand-written MX linear: weight-only, or MX-quantized activations too; optional bias. Weights are buffers
    (static shapes under dynamic=True, as parameters are); generated on `device` from `seed`."""

    def __init__(
        self,
        a_elem: str | None,
        w_elem: str,
        n: int,
        k: int,
        e8m0: bool = False,
        bias: bool = False,
        seed: int = 3,
        device: str = "cpu",
    ) -> None:
        super().__init__()
        g = torch.Generator(device=device).manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, device=device, generator=g) * k**-0.5, w_elem)
        self.register_buffer("q", q)
        self.register_buffer("e", e.view(torch.float8_e8m0fnu) if e8m0 else e)
        self.register_buffer("b", torch.randn(n, device=device, generator=g) * 0.1 if bias else None)
        self.a_elem, self.w_elem, self.n, self.k = a_elem, w_elem, n, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.k)
        if self.a_elem is not None:
            xq, xe = fmt.quantize(x2.float(), self.a_elem)
            x2 = fmt.dequantize(xq, xe, self.a_elem, x.dtype)
        w = fmt.dequantize(self.q, self.e, self.w_elem, x.dtype)
        b = None if self.b is None else self.b.to(x.dtype)
        return F.linear(x2, w, b).reshape(*x.shape[:-1], self.n)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """float64 x @ dequant(w).T (+ b): the weight-only reference (activation-quantized forms use eager)."""
        w = fmt.dequantize_f64(self.q, self.e.view(torch.uint8), self.w_elem)
        y = x.double().reshape(-1, self.k) @ w.t()
        if self.b is not None:
            y = y + self.b.to(x.dtype).double()
        return y.reshape(*x.shape[:-1], self.n)


# ------------------------------------------------------------------------------------------ fuzz variants
# Weight-only MX forms scripts/fuzz_compile.py's variants draw (mx_special, fp16_extreme); `reference` is the
# float64 math of the user's formula, special codes included.

import math  # noqa: E402

# special -> element formats it applies to
MX_SPECIALS: dict[str, tuple[str, ...]] = {
    "e255_zero": ("e4m3", "e5m2", "e2m1"),  # torch.where(e == 255, 0, exp2(e - 127)) on uint8 codes
    "e8m0_nan_zero": ("e4m3", "e2m1"),  # nan_to_num(e.float()) on float8_e8m0fnu codes
    "nan_elems": ("e4m3", "e5m2"),  # nan_to_num(q.float()): NaN fp8 elements count as 0
    "lut_buffer": ("e2m1",),  # the e2m1 table a module buffer
    "lut_custom": ("e2m1",),  # a buffer holding another 16-entry codebook (NF4's)
    "hi_nibble": ("e2m1",),  # fp4 packed with the even element in the high nibble
    "spec_codes": ("e4m3", "e5m2"),  # the spec's decode (255 -> NaN) over NaN / Inf elements: lowered
}
FP8_NAN_CODES = {"e4m3": (0x7F, 0xFF), "e5m2": (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF)}
NF4_TABLE = (
    -1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
    0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0,
)  # fmt: skip


class MXSpecial(torch.nn.Module):
    """A weight-only MX linear whose dequantization gives special codes its own meaning (see MX_SPECIALS).

    The data holds those codes — scale codes 0 (2^-127) and 255, NaN fp8 encodings, every fp4 byte — so a
    lowering that assumes the OCP meaning (255 is NaN, NaN stays NaN, the standard table, low nibble first)
    gives wrong numbers instead of passing unnoticed.
    """

    def __init__(self, n: int, k: int, special: str, elem: str, bias: bool = False, seed: int = 0) -> None:
        super().__init__()
        if elem not in MX_SPECIALS[special]:
            raise ValueError(f"{special} does not apply to {elem}")
        g = torch.Generator().manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, elem)
        pick = torch.rand(e.shape, generator=g)
        e = torch.where(pick < 0.05, 0, e).to(torch.uint8)
        if special in ("e255_zero", "e8m0_nan_zero", "spec_codes"):
            e = torch.where(pick > (0.99 if special == "spec_codes" else 0.9), 255, e).to(torch.uint8)
        if special in ("nan_elems", "spec_codes"):
            qb = q.view(torch.uint8).clone()
            hit = torch.rand(qb.shape, generator=g) < (0.0005 if special == "spec_codes" else 0.03)
            plant = fmt.ELEM_SPECIAL_CODES[elem] if special == "spec_codes" else FP8_NAN_CODES[elem]
            codes = torch.tensor(plant, dtype=torch.uint8)
            qb[hit] = codes[torch.randint(len(codes), (int(hit.sum()),), generator=g)]
            q = qb.view(q.dtype)
        if special == "hi_nibble":
            c = torch.stack([q & 15, q >> 4], -1).flatten(-2)
            q = (c[..., 0::2] << 4) | c[..., 1::2]
        self.register_buffer("q", q)
        self.register_buffer("e", e.view(torch.float8_e8m0fnu) if special == "e8m0_nan_zero" else e)
        if special.startswith("lut"):
            table = NF4_TABLE if special == "lut_custom" else fmt.E2M1_VALUES
            self.register_buffer("lut", torch.tensor(table, dtype=torch.float32))
        self.register_buffer("b", torch.randn(n, generator=g) * 0.1 if bias else None)
        self.n, self.k, self.special, self.elem = n, k, special, elem

    def _codes(self) -> torch.Tensor:
        lo, hi = self.q & 15, self.q >> 4
        pair = [hi, lo] if self.special == "hi_nibble" else [lo, hi]
        return torch.stack(pair, -1).view(self.n, self.k).long()

    def _elements(self) -> torch.Tensor:
        if fmt.packed(self.elem):
            lut = self.lut if self.special.startswith("lut") else None
            table = torch.tensor(fmt.E2M1_VALUES, device=self.q.device) if lut is None else lut
            return table[self._codes()]
        v = self.q.float()
        return torch.nan_to_num(v, nan=0.0) if self.special == "nan_elems" else v

    def _scales(self) -> torch.Tensor:
        if self.special == "e255_zero":
            return torch.where(self.e == 255, 0.0, torch.exp2(self.e.float() - 127))
        if self.special == "e8m0_nan_zero":
            return torch.nan_to_num(self.e.float(), nan=0.0)
        if self.special == "spec_codes":  # torchao's guard
            return torch.where(self.e == 255, float("nan"), torch.exp2(self.e.float() - 127))
        return torch.exp2(self.e.float() - 127)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.n, self.k
        w = (self._elements().view(n, k // 32, 32) * self._scales()[..., None]).view(n, k).to(x.dtype)
        return F.linear(x, w, None if self.b is None else self.b.to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        n, k = self.n, self.k
        if fmt.packed(self.elem):
            table = self.lut.double() if self.special.startswith("lut") else torch.tensor(fmt.E2M1_VALUES)
            v = table.double().to(self.q.device)[self._codes()]
        else:
            v = self.q.double()
            v = torch.nan_to_num(v, nan=0.0) if self.special == "nan_elems" else v
        c = self.e.view(torch.uint8).double()
        s = torch.where(c == 255, 0.0 if self.special.endswith("zero") else torch.nan, torch.exp2(c - 127))
        w = (v.view(n, k // 32, 32) * s[..., None]).view(n, k)
        y = x.double() @ w.t()
        return y if self.b is None else y + self.b.to(x.dtype).double()


class MXExtreme(torch.nn.Module):
    """A weight-only MX linear at fp16's edges: scale codes shifted by `shift`.

    'fp32_matmul' + 'large': weights beyond 65504 (`shift` >= 19), the user's matmul in fp32 (finite for
    activations of std `x_std`): a lowering that dequantizes into fp16 overflows. 'f16_dequant' + 'large': the
    weights just below 65504 in the user's fp16 dequantization; + 'tiny': the weights fp16 subnormals.
    """

    def __init__(
        self, n: int, k: int, elem: str, spelling: str, scale_range: str, shift: int, bias: bool, seed: int
    ) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, elem)
        amax = fmt.dequantize_f64(q, e, elem).abs().max().item()
        if spelling == "f16_dequant":
            target = 60000.0 if scale_range == "large" else 2.0**-16
            shift = math.floor(math.log2(target / amax))
        elif scale_range != "large":
            raise ValueError("fp32_matmul takes 'large' scales only")
        self.register_buffer("q", q)
        self.register_buffer("e", (e.to(torch.int32) + shift).clamp(0, 254).to(torch.uint8))
        # a bias of the outputs' size ('tiny': ~2^shift), not one that hides them
        self.register_buffer("b", torch.randn(n, generator=g) * 0.1 * 2.0 ** min(shift, 0) if bias else None)
        self.n, self.k, self.elem, self.spelling, self.shift = n, k, elem, spelling, shift
        # |x @ w.T| ~ x_std * 2^shift: about 256 ('large'), 2^shift ('tiny', x of std 1)
        self.x_std = 256.0 * 2.0**-shift if scale_range == "large" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.b is None else self.b.to(x.dtype)
        if self.spelling == "fp32_matmul":
            w = fmt.dequantize(self.q, self.e, self.elem, torch.float32)
            y = x.float() @ w.t()
            return (y if b is None else y + b).to(x.dtype)
        return F.linear(x, fmt.dequantize(self.q, self.e, self.elem, x.dtype), b)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        y = x.double() @ fmt.dequantize_f64(self.q, self.e, self.elem).t()
        return y if self.b is None else y + self.b.to(x.dtype).double()


# ---------------------------------------------------------------- special codes, tables, packing, partial K
@dataclass(frozen=True)
class SpecialForm:
    """A hand-written decode and what qlower must do with it: lower it (`left_alone` None) or leave it alone
    with a reason containing `left_alone`."""

    fn: Callable[..., torch.Tensor]  # f(x, q, e): q fp8 [N, K] or packed e2m1 [N, K / 2], e uint8 [N, K / 32]
    elem: str
    left_alone: str | None = None


def special_code_forms(n: int, k: int) -> dict[str, SpecialForm]:
    """Look-alike decodes differing from MX only at special codes, and the spec-exact ones next to them."""

    def linear(x, vals, s):
        return F.linear(x, (vals.view(n, k // 32, 32) * s[..., None]).view(n, k).to(x.dtype))

    def table_values(q, lut):
        return lut[torch.stack([q & 15, q >> 4], -1).view(n, k).long()]

    def e8m0_255_to_zero(x, q, e):  # a NaN "guard" that maps code 255 to 0: not MX at code 255
        return linear(x, q.float(), torch.where(e == 255, 0.0, torch.exp2(e.float() - 127)))

    def e8m0_255_to_nan(x, q, e):  # torchao's guard: the spec
        return linear(x, q.float(), torch.where(e == 255, float("nan"), torch.exp2(e.float() - 127)))

    def e8m0_unguarded(x, q, e):  # exp2 in float32 overflows to +Inf at code 255: reproduced exactly
        return linear(x, q.float(), torch.exp2(e.float() - 127))

    def e8m0_bit_shift(x, q, e):  # the exponent field: 0.0 at code 0, +Inf at code 255
        return linear(x, q.float(), (e.to(torch.int32) << 23).view(torch.float32))

    def e8m0_wrong_at_200(x, q, e):  # differs at one ordinary code
        return linear(x, q.float(), torch.where(e == 200, 1.0, torch.exp2(e.float() - 127)))

    def e4m3_nan_to_num(x, q, e):  # NaN elements zeroed: not MX at 0x7f / 0xff
        return linear(x, torch.nan_to_num(q.float()), torch.exp2(e.float() - 127))

    def e5m2_inf_nan(x, q, e):  # e5m2 Inf and NaN elements decode as the spec says
        return linear(x, q.float(), torch.exp2(e.float() - 127))

    def e5m2_nan_to_num(x, q, e):  # Inf clamped to the float32 max: not MX at 0x7c
        return linear(x, torch.nan_to_num(q.float()), torch.exp2(e.float() - 127))

    def e2m1_table(x, q, e):  # all 16 codes through a table built in the graph
        lut = torch.tensor(fmt.E2M1_VALUES, device=q.device)
        return linear(x, table_values(q, lut), torch.exp2(e.float() - 127))

    def e2m1_table_wrong_entry(x, q, e):  # code 9 (-0.5) decoded as -0.25
        lut = torch.tensor([*fmt.E2M1_VALUES[:9], -0.25, *fmt.E2M1_VALUES[10:]], device=q.device)
        return linear(x, table_values(q, lut), torch.exp2(e.float() - 127))

    return {
        "e8m0_255_to_zero": SpecialForm(
            e8m0_255_to_zero, "e4m3", "scale decode differs from e8m0 at code 255"
        ),
        "e8m0_255_to_nan": SpecialForm(e8m0_255_to_nan, "e4m3"),
        "e8m0_unguarded": SpecialForm(e8m0_unguarded, "e4m3"),
        "e8m0_bit_shift": SpecialForm(e8m0_bit_shift, "e4m3"),
        "e8m0_wrong_at_200": SpecialForm(
            e8m0_wrong_at_200, "e4m3", "scale decode differs from e8m0 at code 200"
        ),
        "e4m3_nan_to_num": SpecialForm(
            e4m3_nan_to_num, "e4m3", "element decode differs from e4m3 at code 0x7f"
        ),
        "e5m2_inf_nan": SpecialForm(e5m2_inf_nan, "e5m2"),
        "e5m2_nan_to_num": SpecialForm(
            e5m2_nan_to_num, "e5m2", "element decode differs from e5m2 at code 0x7c"
        ),
        "e2m1_table": SpecialForm(e2m1_table, "e2m1"),
        "e2m1_table_wrong_entry": SpecialForm(
            e2m1_table_wrong_entry, "e2m1", "element decode differs from e2m1 at code 0x09"
        ),
    }


def special_code_inputs(elem: str, n: int, k: int, m: int = 5, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(x, q, e) of a real MX weight with special codes planted: scale codes 0 and 255 and 200, every element
    code of the format (NaN / Inf fp8 bytes; all 16 fp4 nibbles, both orders)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, elem)
    e[0, 0], e[1, :], e[2, -1], e[3, 0] = 255, 0, 200, 200
    qb = q.view(torch.uint8)
    specials = fmt.ELEM_SPECIAL_CODES[elem]
    for i, code in enumerate(specials):
        qb[4 + i % (n - 4), (7 * i) % qb.shape[1]] = code
    if fmt.packed(elem):
        nib = torch.arange(16, dtype=torch.uint8)
        qb[5, :16], qb[6, :16] = nib * 16 + nib, nib * 16 + (15 - nib)
    return x, q, e


class MXFP4TableBuffer(torch.nn.Module):
    """MXFP4 decoded through an e2m1 table held as a module buffer (a graph input under torch.compile, an
    attribute under export, a constant under freezing); `nibbles`: which nibble holds the even element."""

    def __init__(self, n: int, k: int, nibbles: str = "low_first", seed: int = 5) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, "e2m1")
        self.register_buffer("q", fmt.pack_e2m1(fmt.unpack_codes(q), nibbles))
        self.register_buffer("e", e)
        self.register_buffer("lut", torch.tensor(fmt.E2M1_VALUES))
        self.n, self.k, self.nibbles = n, k, nibbles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q
        pair = [q & 15, q >> 4] if self.nibbles == "low_first" else [q >> 4, q & 15]
        vals = self.lut[torch.stack(pair, -1).view(self.n, self.k).long()]
        s = torch.exp2(self.e.float() - 127)
        w = (vals.view(self.n, self.k // 32, 32) * s[..., None]).view(self.n, self.k)
        return F.linear(x, w.to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() @ fmt.dequantize_f64(self.q, self.e, "e2m1", self.nibbles).t()


def high_nibble_first_form(n: int, k: int) -> Callable[..., torch.Tensor]:
    """f(x, q, e): MXFP4 whose bytes hold the even element in the high nibble, decoded by bit arithmetic."""

    def f(x, q, e):
        c = torch.stack([q >> 4, q & 15], dim=-1).flatten(-2).to(torch.int32)
        mag = c & 7
        ex = mag >> 1
        mant = (mag & 1).float()
        v = torch.where(ex == 0, 0.5 * mant, torch.exp2(ex.float() - 1) * (1 + 0.5 * mant))
        v = torch.where(c >= 8, -v, v)
        s = torch.exp2(e.float() - 127)
        return F.linear(x, (v.view(n, k // 32, 32) * s[..., None]).view(n, k).to(x.dtype))

    return f


class MXPartialBlock(torch.nn.Module):
    """An MX weight whose K is not a multiple of 32: the last block's scale applies to the tail, spelled with
    `repeat_interleave(32)[:, :K]` (which stock Inductor's CPU code gets wrong). fp8 or packed fp4 elements."""

    def __init__(self, elem: str, n: int, k: int, seed: int = 7) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, elem)
        self.register_buffer("q", q)
        self.register_buffer("e", e)
        self.elem, self.n, self.k = elem, n, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fmt.packed(self.elem):
            vals = torch.tensor(fmt.E2M1_VALUES, device=x.device)[
                torch.stack([self.q & 15, self.q >> 4], -1).view(self.n, self.k).long()
            ]
        else:
            vals = self.q.float()
        s = torch.exp2(self.e.float() - 127).repeat_interleave(32, dim=1)[:, : self.k]
        return F.linear(x, (vals * s).to(x.dtype))

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() @ fmt.dequantize_f64(self.q, self.e, self.elem).t()


class MXDynamicPartialBlock(torch.nn.Module):
    """Dynamic MX (e4m3 activations quantized in the graph, e4m3 weight) with K % 32 != 0, every per-element
    scale gathered by block index (`s[:, arange(K) // 32]`), a spelling stock Inductor compiles right."""

    def __init__(self, n: int, k: int, seed: int = 11) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        q, e = fmt.quantize(torch.randn(n, k, generator=g) * k**-0.5, "e4m3")
        self.register_buffer("q", q)
        self.register_buffer("e", e)
        self.n, self.k = n, k

    def _per_element(self, s: torch.Tensor) -> torch.Tensor:
        return s[:, torch.arange(self.k, device=s.device) // 32]

    def _dequant(self, q: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return q.float() * self._per_element(torch.exp2(e.float() - 127))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        amax = torch.stack([xf[:, i : i + 32].abs().amax(1) for i in range(0, self.k, 32)], 1)
        ex = (torch.floor(torch.log2(amax)) - fmt.ELEM_MAX_POW2["e4m3"]).clamp(-127, 127)
        xq = (xf / self._per_element(torch.exp2(ex))).clamp(-448, 448).to(torch.float8_e4m3fn)
        xe = (ex + 127).to(torch.uint8)
        return F.linear(self._dequant(xq, xe).to(x.dtype), self._dequant(self.q, self.e).to(x.dtype))
