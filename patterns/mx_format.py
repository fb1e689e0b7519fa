"""MX (OCP microscaling) format facts shared by the recognizer, the lowerings, tests and benchmarks.

An MX tensor is elements (fp8 e4m3 / e5m2, or fp4 e2m1 packed two per byte, even element in the low
nibble) and one e8m0 scale per 32 consecutive elements along K: value = elem * 2 ** (code - 127), code 255
is NaN, code 0 is 2 ** -127. K need not be a multiple of 32: the last block is then partial and its scale
applies to the tail. Scales are stored plain ([rows, ceil(K / 32)]) or swizzled into the 128x4 tiles cuBLAS
reads (`swizzle_offsets`). Pure torch, no device knowledge; the float64 reference lives here once.
"""

from __future__ import annotations

import math

import torch

BLOCK = 32
E8M0_BIAS = 127
E8M0_NAN = 255

# Element formats: name -> (storage dtypes the recognizer accepts, largest finite value, exponent of it).
ELEM_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "e4m3": (torch.float8_e4m3fn,),
    "e5m2": (torch.float8_e5m2,),
    "e2m1": (torch.uint8, torch.float4_e2m1fn_x2),
}
ELEM_MAX = {"e4m3": 448.0, "e5m2": 57344.0, "e2m1": 6.0}
ELEM_MAX_POW2 = {"e4m3": 8, "e5m2": 15, "e2m1": 2}
FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
# Element codes with no finite value (e4m3: NaN; e5m2: +-Inf then NaN), and the byte decoding to 1.0.
ELEM_SPECIAL_CODES: dict[str, tuple[int, ...]] = {
    "e4m3": (0x7F, 0xFF),
    "e5m2": (*range(0x7C, 0x80), *range(0xFC, 0x100)),
    "e2m1": (),
}
ELEM_ONE_BYTE = {"e4m3": 0x38, "e5m2": 0x3C, "e2m1": 0x22}
# e8m0 codes the plain formula 2 ** (code - 127) does not give: the spec's value, and the other values a
# decode may give there that qlower reproduces exactly (a bit-shift decode gives 0.0 at code 0; an
# unguarded `exp2(code - 127)` in float32 overflows to +Inf at code 255).
E8M0_SPECIAL = {0: 2.0**-E8M0_BIAS, E8M0_NAN: math.nan}
E8M0_SPECIAL_ALTERNATIVES = {0: (0.0,), E8M0_NAN: (math.inf,)}
NIBBLE_ORDERS = ("low_first", "high_first")  # which nibble of a packed e2m1 byte holds the even element


def elem_of_dtype(dtype: torch.dtype) -> str | None:
    """The element format a storage dtype can hold ('e2m1' for packed bytes), or None."""
    for name, dtypes in ELEM_DTYPES.items():
        if dtype in dtypes:
            return name
    return None


def packed(elem: str) -> bool:
    return elem == "e2m1"


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def blocks(k: int) -> int:
    """Scale blocks along K (the last one partial when K % 32)."""
    return -(-k // BLOCK)


def same_values(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise a == b, NaN equal to NaN (what "the same numbers" means for decodes)."""
    return (a == b) | (a.isnan() & b.isnan())


def swizzled_numel(rows: int, cols: int) -> int:
    """Elements of the swizzled scale tensor for a [rows, cols] plain one (128-row, 4-column tiles)."""
    return round_up(rows, 128) * round_up(cols, 4)


def swizzle_offsets(rows: int, cols: int) -> torch.Tensor:
    """offsets[r, c]: where plain scale (r, c) lives in the flat swizzled tensor.

    Tiles of 128 rows x 4 columns, tile-major along columns; inside a tile, row r sits at
    (r % 32) * 16 + (r % 128 // 32) * 4 (cuBLAS' block-scaling-factor layout, torchao's `to_blocked`).
    """
    r = torch.arange(rows).view(-1, 1)
    c = torch.arange(cols).view(1, -1)
    tiles_per_row = round_up(cols, 4) // 4
    tile = (r // 128) * tiles_per_row + c // 4
    return tile * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


def to_swizzled(plain: torch.Tensor) -> torch.Tensor:
    """[rows, cols] plain scales -> flat swizzled tensor (padding filled with code 0)."""
    rows, cols = plain.shape
    out = torch.zeros(swizzled_numel(rows, cols), dtype=plain.dtype, device=plain.device)
    out[swizzle_offsets(rows, cols).to(plain.device).reshape(-1)] = plain.reshape(-1)
    return out


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (any integer tensor, values 0..15) -> float32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def unpack_codes(packed_bytes: torch.Tensor, nibbles: str = "low_first") -> torch.Tensor:
    """[..., K / 2] bytes -> [..., K] e2m1 codes (uint8), the even element from the nibble `nibbles` names."""
    b = packed_bytes.view(torch.uint8) if packed_bytes.dtype != torch.uint8 else packed_bytes
    lo, hi = b & 15, b >> 4
    pair = [lo, hi] if nibbles == "low_first" else [hi, lo]
    return torch.stack(pair, dim=-1).flatten(-2)


def unpack_e2m1(packed_bytes: torch.Tensor, nibbles: str = "low_first") -> torch.Tensor:
    """[..., K / 2] bytes -> [..., K] float32."""
    return e2m1_decode(unpack_codes(packed_bytes, nibbles))


def pack_e2m1(codes: torch.Tensor, nibbles: str = "low_first") -> torch.Tensor:
    """[..., K] codes 0..15 -> [..., K / 2] uint8, even element in the low nibble (or the high one)."""
    c = codes.to(torch.uint8)
    even, odd = c[..., 0::2], c[..., 1::2]
    return even | (odd << 4) if nibbles == "low_first" else (even << 4) | odd


def elements_f64(q: torch.Tensor, elem: str, nibbles: str = "low_first") -> torch.Tensor:
    """Element values as float64, [rows, K] (unpacking e2m1)."""
    if packed(elem):
        return unpack_e2m1(q, nibbles).double()
    return q.view(FP8_DTYPE[elem]).double()


def scale_f64(codes: torch.Tensor, special: dict[int, float] | None = None) -> torch.Tensor:
    """e8m0 codes (uint8 or float8_e8m0fnu) -> float64 2 ** (code - 127), NaN for 255.

    `special` overrides the value at code 0 and/or 255 (a decode's own choice, see E8M0_SPECIAL_ALTERNATIVES).
    """
    c = codes.view(torch.uint8).double()
    out = torch.exp2(c - E8M0_BIAS)
    for code, value in {**E8M0_SPECIAL, **(special or {})}.items():
        out = torch.where(c == code, value, out)
    return out


def dequantize_f64(
    q: torch.Tensor,
    codes: torch.Tensor,
    elem: str,
    nibbles: str = "low_first",
    special: dict[int, float] | None = None,
) -> torch.Tensor:
    """The float64 reference: [rows, K] elements times their block's scale (codes plain [rows, ceil(K / 32)]).

    Eager `repeat_interleave` + slice: exact here (stock Inductor's generated code for that form is not, see
    tests/patterns/test_mx_special_codes.py::test_upstream_repeat_interleave_slice_bug).
    """
    x = elements_f64(q, elem, nibbles)
    rows, k = x.shape
    s = scale_f64(codes, special).reshape(rows, blocks(k))
    return x * s.repeat_interleave(BLOCK, dim=1)[:, :k]


def _round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Float32 values already within [-6, 6] -> nearest e2m1 code (ties to the even code)."""
    mags = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=v.device)
    dist = (v.abs().unsqueeze(-1) - mags).abs()
    # Prefer the even code on ties: a tiny bias toward even indices.
    dist = dist + torch.tensor([0.0, 1e-7] * 4, device=v.device)
    code = dist.argmin(-1).to(torch.uint8)
    return torch.where(v < 0, code | 8, code)


def quantize(x: torch.Tensor, elem: str, mode: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference MX quantization of a [rows, K] float tensor: (elements, uint8 codes [rows, ceil(K / 32)]).

    `mode` 'floor' (OCP spec: 2 ** (floor(log2 amax) - emax), saturating cast) or 'rceil' (2 ** ceil(log2(amax
    / max))). Elements are fp8 tensors, or packed e2m1 bytes (uint8). For tests and benchmarks. With K % 32
    traced inside a model, stock Inductor compiles its final slice wrong (see `dequantize_f64`): such models
    quantize with a per-element gather instead (tests/forms/mx.py MXDynamicPartialBlock).
    """
    rows, k = x.shape
    cols = blocks(k)
    xf = x.float()
    if k % BLOCK:  # zeros change no block's amax
        xf = torch.nn.functional.pad(xf, (0, cols * BLOCK - k))
    tiles = xf.reshape(rows, cols, BLOCK)
    amax = tiles.abs().amax(-1, keepdim=True)
    if mode == "floor":
        e = torch.floor(torch.log2(amax)) - ELEM_MAX_POW2[elem]
    elif mode == "rceil":
        e = torch.ceil(torch.log2(amax / ELEM_MAX[elem]))
    else:
        raise ValueError(f"unknown mode {mode}")
    e = torch.nan_to_num(e, neginf=-E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = (tiles / torch.exp2(e)).clamp(-ELEM_MAX[elem], ELEM_MAX[elem]).reshape(rows, cols * BLOCK)
    if k % BLOCK:
        scaled = scaled[:, :k]
    codes = (e + E8M0_BIAS).to(torch.uint8).reshape(rows, cols)
    if packed(elem):
        return pack_e2m1(_round_e2m1(scaled)), codes
    return scaled.to(FP8_DTYPE[elem]), codes


def dequantize(
    q: torch.Tensor, codes: torch.Tensor, elem: str, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """MX dequantization written with plain torch ops, [rows, K] in `dtype`: the hand-written model form.

    What a user writes (and qlower recognizes); traceable with any leading dimension, dynamic included.
    """
    if packed(elem):
        b = q.view(torch.uint8)
        c = torch.stack([b & 15, b >> 4], dim=-1).flatten(-2).to(torch.int32)
        mag = c & 7
        ex = mag >> 1
        mant = (mag & 1).float()
        v = torch.where(ex == 0, 0.5 * mant, torch.exp2(ex.float() - 1) * (1 + 0.5 * mant))
        v = torch.where(c >= 8, -v, v)
    else:
        v = q.float()
    k = v.shape[-1]
    s = torch.exp2(codes.view(torch.uint8).float() - E8M0_BIAS)
    return (v.reshape(-1, k // BLOCK, BLOCK) * s.reshape(-1, k // BLOCK, 1)).reshape(-1, k).to(dtype)


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal to quantization-noise ratio of `out` against `ref`, in dB."""
    ref, out = ref.double(), out.double()
    noise = (ref - out).norm()
    return math.inf if noise == 0 else float(20 * torch.log10(ref.norm() / noise))
