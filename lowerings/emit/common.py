"""What every emitter shares: a record's weight and scale as graph values, the scale epilogue, and `finish`
(bias, output dtype and shape as the graph had them). Nodes are built with `graph.builder.Emitter`."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.scale_facts import product_dtype
from qlower.patterns.graph_utils import aten, tensor_val
from qlower.patterns.record import QuantLinear


def weight_nk(em: Emitter, rec: QuantLinear) -> fx.Node:
    """The quantized weight as a contiguous [N, K] tensor (what packed-weight kernels take)."""
    w = rec.weight if rec.weight_layout == "NK" else em.transpose(rec.weight)
    return em.contiguous(w)


def scale_vector(em: Emitter, rec: QuantLinear, dtype: torch.dtype) -> fx.Node:
    """The weight scale as a contiguous [N] vector of `dtype` (ones when the graph had no scale)."""
    s = rec.weight_scale
    device = rec.device
    if s is None or isinstance(s, (int, float)):
        value = 1.0 if s is None else float(s)
        return em.call(aten.full.default, [rec.n], value, dtype=dtype, device=device, pin_memory=False)
    v = tensor_val(s)
    assert v is not None
    if v.numel() == 1:
        s = em.call(aten.expand.default, em.reshape(s, [1]), [rec.n])
        s = em.call(aten.clone.default, s, memory_format=torch.contiguous_format)
    elif v.dim() != 1:
        s = em.reshape(s, [rec.n])
    return em.contiguous(em.convert(s, dtype))


def scale_fits(rec: QuantLinear, dtype: torch.dtype) -> bool:
    """Whether every value the scale can hold is exactly a `dtype` value: a kernel taking the scale in `dtype`
    then multiplies by the graph's own scale (an fp32 scale of 1e5 is inf in fp16; 0.1 rounds)."""
    s = rec.weight_scale
    if s is None:
        return True
    if isinstance(s, (int, float)):
        return float(torch.tensor(float(s), dtype=dtype)) == float(s)
    sv = tensor_val(s)
    return sv is not None and torch.promote_types(sv.dtype, dtype) == dtype


def _epilogue_scale(em: Emitter, rec: QuantLinear, dtype: torch.dtype) -> Any:
    """The scale as a multiplier of the [M, N] result: a number as is, a one-element tensor as 0-d (a 0-d CPU
    scale may mix with CUDA tensors;
    tests/lowerings/registry/test_registry.py::test_cuda_graph_with_cpu_scalar_scale), else [N]."""
    s = rec.weight_scale
    if isinstance(s, (int, float)):
        return s
    v = tensor_val(s)
    if v is not None and v.numel() == 1:
        return em.convert(em.reshape(s, []), dtype)
    return scale_vector(em, rec, dtype)


def scale_epilogue(em: Emitter, rec: QuantLinear, core: fx.Node) -> fx.Node:
    """`core` (the matmul result, rounded to the compute dtype as the graph's matmul rounds it) times the
    scale, as the graph computes `mm(...) * s`: the exact product in fp32 (or wider), rounded once to the
    graph's product dtype. The scale never touches a low-precision weight, so nothing overflows that the
    user's formula keeps finite (tests/lowerings/emit/test_dequant_range.py). The fp32 step also keeps the
    result out of Inductor's own woq pattern (`mm(...) * bf16 scale` -> `_weight_int8pack_mm`, unchecked
    K)."""
    if rec.weight_scale is None:
        return core
    out = product_dtype(rec)
    wide = torch.promote_types(out, torch.float32)
    scale = _epilogue_scale(em, rec, wide)
    sv = tensor_val(scale) if isinstance(scale, fx.Node) else None
    promotes = sv is not None and sv.dim() >= 1 and sv.dtype == wide  # mul(core, s) computes in `wide` itself
    y = em.call(aten.mul.Tensor, core if promotes else em.convert(core, wide), scale)
    return em.convert(y, out)


def finish(em: Emitter, rec: QuantLinear, core: fx.Node) -> fx.Node:
    """Add the bias, restore the output dtype and N-D shape: [M, N] core -> value of `rec.output`."""
    # Widen first: the graph promoted (matmul * scale) to out_dtype before adding the bias.
    out = em.convert(core, rec.out_dtype)
    if rec.bias is not None:
        bias = rec.bias
        bv = tensor_val(bias)
        if bv is not None and bv.dim() > 1:
            bias = em.reshape(bias, [bv.shape[-1]])
        out = em.convert(em.call(aten.add.Tensor, out, bias), rec.out_dtype)
    if rec.out_shape is not None:
        out = em.reshape(out, rec.out_shape)
    return out
