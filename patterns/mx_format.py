"""MX (OCP microscaling) format facts shared by the recognizer, the lowerings, tests and benchmarks.

An MX tensor is elements (fp8 e4m3 / e5m2, or fp4 e2m1 packed two per byte, even element in the low
nibble) and one e8m0 scale per 32 consecutive elements along K: value = elem * 2 ** (code - 127), code 255
is NaN. Scales are stored plain ([rows, K / 32]) or swizzled into the 128x4 tiles cuBLAS reads
(`swizzle_offsets`). Pure torch, no device knowledge; the float64 reference lives here once.
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


def from_swizzled(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return flat.reshape(-1)[swizzle_offsets(rows, cols).to(flat.device)]


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (any integer tensor, values 0..15) -> float32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def unpack_e2m1(packed_bytes: torch.Tensor) -> torch.Tensor:
    """[..., K / 2] bytes (low nibble first) -> [..., K] float32."""
    b = packed_bytes.view(torch.uint8) if packed_bytes.dtype != torch.uint8 else packed_bytes
    codes = torch.stack([b & 15, b >> 4], dim=-1).flatten(-2)
    return e2m1_decode(codes)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes 0..15 -> [..., K / 2] uint8, even element in the low nibble."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def elements_f64(q: torch.Tensor, elem: str) -> torch.Tensor:
    """Element values as float64, [rows, K] (unpacking e2m1)."""
    if packed(elem):
        return unpack_e2m1(q).double()
    return q.view(FP8_DTYPE[elem]).double()


def scale_f64(codes: torch.Tensor) -> torch.Tensor:
    """e8m0 codes (uint8 or float8_e8m0fnu) -> float64 2 ** (code - 127), NaN for 255."""
    c = codes.view(torch.uint8).double()
    return torch.where(c == E8M0_NAN, torch.nan, torch.exp2(c - E8M0_BIAS))


def dequantize_f64(q: torch.Tensor, codes: torch.Tensor, elem: str) -> torch.Tensor:
    """The float64 reference: [rows, K] elements times their block's scale (codes plain [rows, K / 32])."""
    x = elements_f64(q, elem)
    rows, k = x.shape
    s = scale_f64(codes).reshape(rows, k // BLOCK, 1)
    return (x.reshape(rows, k // BLOCK, BLOCK) * s).reshape(rows, k)


def _round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Float32 values already within [-6, 6] -> nearest e2m1 code (ties to the even code)."""
    mags = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=v.device)
    dist = (v.abs().unsqueeze(-1) - mags).abs()
    # Prefer the even code on ties: a tiny bias toward even indices.
    dist = dist + torch.tensor([0.0, 1e-7] * 4, device=v.device)
    code = dist.argmin(-1).to(torch.uint8)
    return torch.where(v < 0, code | 8, code)


def quantize(x: torch.Tensor, elem: str, mode: str = "floor") -> tuple[torch.Tensor, torch.Tensor]:
    """Reference MX quantization of a [rows, K] float tensor: (elements, uint8 scale codes [rows, K / 32]).

    `mode` 'floor' (OCP spec: 2 ** (floor(log2 amax) - emax), saturating cast) or 'rceil' (2 ** ceil(log2(amax
    / max))). Elements are fp8 tensors, or packed e2m1 bytes (uint8). For tests and benchmarks.
    """
    rows, k = x.shape
    if k % BLOCK:
        raise ValueError(f"K={k} is not a multiple of {BLOCK}")
    blocks = x.float().reshape(rows, k // BLOCK, BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    if mode == "floor":
        e = torch.floor(torch.log2(amax)) - ELEM_MAX_POW2[elem]
    elif mode == "rceil":
        e = torch.ceil(torch.log2(amax / ELEM_MAX[elem]))
    else:
        raise ValueError(f"unknown mode {mode}")
    e = torch.nan_to_num(e, neginf=-E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = (blocks / torch.exp2(e)).clamp(-ELEM_MAX[elem], ELEM_MAX[elem]).reshape(rows, k)
    codes = (e + E8M0_BIAS).to(torch.uint8).reshape(rows, k // BLOCK)
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
