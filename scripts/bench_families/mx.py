"""mx cases for scripts/bench.py (interface at the top of bench.py); scripts/bench_mx.py sweeps the kernels.

    QLOWER_BENCH_MX=mxfp8_dynamic python -m scripts.bench --family mx --device cuda --shapes 4096x4096x14336
    QLOWER_BENCH_MX=mxfp4_weight_only python -m scripts.bench --family mx --device cuda --shapes 1x4096x14336

Cases (QLOWER_BENCH_MX, default mxfp8_dynamic): the model as written by hand with plain torch ops
(`patterns/mx_format.dequantize`, and `quantize` for the dynamic activation), what stock torch.compile and
qlower both receive. `A_ELEM`, `W_ELEM` are the case's formats (bench_mx.py's --e2e sets them per case).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from qlower.quantize import mx_format as fmt

FAMILY = "mx"
DTYPE = torch.bfloat16
CASES = {  # name -> (activation element format or None for weight-only, weight element format)
    "mxfp8_dynamic": ("e4m3", "e4m3"),
    "mxfp8_weight_only": (None, "e4m3"),
    "mxfp4_weight_only": (None, "e2m1"),
    "mxfp4_dynamic": ("e2m1", "e2m1"),
}
CASE = os.environ.get("QLOWER_BENCH_MX", "mxfp8_dynamic")
if CASE not in CASES:
    raise SystemExit(f"bench_mx: QLOWER_BENCH_MX={CASE!r}, expected one of {sorted(CASES)}")
A_ELEM, W_ELEM = CASES[CASE]
GRID_M = (1, 16, 128, 4096) if A_ELEM is None else (16, 128, 1024, 4096)
GRID_KN = ((4096, 4096), (4096, 14336))
QUICK_M = (1, 4096)
QUICK_KN = ((4096, 14336),)


def make_weights(k: int, n: int, device: str, seed: int) -> dict[str, torch.Tensor]:
    """The bf16 weight [N, K] and its MX quantization: elements q and uint8 scale codes e [N, K / 32]."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(DTYPE).to(device)
    q, e = fmt.quantize(w.float(), W_ELEM)
    return {"bf16": w, "q": q, "e": e}


def quant_bytes(k: int, n: int) -> int:
    """Elements (1 byte, or half a byte for e2m1) plus one e8m0 code per 32."""
    return (n * k // 2 if fmt.packed(W_ELEM) else n * k) + n * k // fmt.BLOCK


def bf16_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.linear(x, w["bf16"])


def mx_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The MX model: (dynamically quantized) activation times the dequantized MX weight."""
    x2 = x.reshape(-1, x.shape[-1])
    if A_ELEM is not None:
        xq, xe = fmt.quantize(x2, A_ELEM)
        x2 = fmt.dequantize(xq, xe, A_ELEM, x.dtype)
    y = F.linear(x2, fmt.dequantize(w["q"], w["e"], W_ELEM, x.dtype))
    return y.reshape(*x.shape[:-1], -1)


VARIANTS = {
    "bf16": (bf16_linear, None),
    "stock": (mx_linear, "stock"),
    "qlower": (mx_linear, "qlower"),
}
