"""woq_int8 cases for scripts/bench.py: gpt-fast's `F.linear(x, w.to(x.dtype)) * s`, per-row int8 weights.

The interface every family module of bench_families/ follows is documented at the top of bench.py.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from qlower.quantize import quantize_per_row_int8

FAMILY = "woq_int8"
DTYPE = torch.bfloat16
GRID_M = (1, 4, 16, 128, 1024)
GRID_M_CUDA = (1, 4, 16, 128, 1024, 4096)
GRID_KN = ((4096, 4096), (4096, 14336))
QUICK_M = (1, 16, 128)
QUICK_KN = ((4096, 4096),)


def make_weights(k: int, n: int, device: str, seed: int) -> dict[str, torch.Tensor]:
    """One weight set: the bf16 weight [N, K] and its int8 quantization q [N, K] with bf16 row scales s [N]."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * k**-0.5).to(DTYPE)
    q, s = quantize_per_row_int8(w)
    return {"bf16": w.to(device), "q": q.to(device), "s": s.to(DTYPE).to(device)}


def quant_bytes(k: int, n: int) -> int:
    """Bytes any kernel must read for the quantized weight: int8 [N, K] plus bf16 scales [N]."""
    return n * k + 2 * n


def bf16_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.linear(x, w["bf16"])


def woq_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The quantized model as gpt-fast writes it (what stock compile and qlower both receive)."""
    return F.linear(x, w["q"].to(x.dtype)) * w["s"]


def dequant_then_mm(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """Eager: materialise the bf16 weight every call, then a bf16 GEMM."""
    return F.linear(x, w["q"].to(x.dtype) * w["s"][:, None])


_GEMLITE: dict[int, object] = {}


def gemlite_linear(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """gemlite 0.6's A16W8_INT8 (Triton, its own autotuned configs) on the same int8 weight and scales, packed
    once per weight set; what a user picking a low-bit GEMM library instead of the compiler pass would run."""
    from gemlite.helper import A16W8_INT8

    layer = _GEMLITE.get(id(w["q"]))
    if layer is None:
        layer = A16W8_INT8(device=str(w["q"].device), dtype=x.dtype).from_weights(
            w["q"], None, w["s"][:, None]
        )
        _GEMLITE[id(w["q"])] = layer
    return layer(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


def _gemlite_runs() -> bool:
    """gemlite needs CUDA and the package (`pip install gemlite`); without either the variant is left out."""
    return importlib.util.find_spec("gemlite") is not None and torch.cuda.is_available()


# name -> (fn, how to run it): None = eager, "stock" = torch.compile, "qlower" = torch.compile + qlower.
VARIANTS = {
    "bf16": (bf16_linear, None),
    "stock": (woq_linear, "stock"),
    "dequant_mm": (dequant_then_mm, None),
    "eager_woq": (woq_linear, None),  # the quantized model uncompiled: convert, bf16 GEMM, scale the output
    "qlower": (woq_linear, "qlower"),
}
if _gemlite_runs():
    VARIANTS["gemlite"] = (gemlite_linear, None)
