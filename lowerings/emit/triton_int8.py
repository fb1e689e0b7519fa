"""The CUDA lowerings (kind TRITON) that call qlower's Triton kernels, and when they may be chosen.

`supports` checks correctness first (activation dtype, int8 operands, Triton importable, capability), then
the measured crossover in `configs`: where the kernel was slower than the next lowering, it declines and the
registry falls through to it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from qlower.patterns.graph_utils import is_static, known_eq, tensor_val
from qlower.patterns.record import QuantLinear

from qlower.lowerings.emit.common import Emitter, finish, product_dtype, scale_epilogue
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering
from qlower.lowerings.emit.woq_int8 import weight_scale_range_blocker
from qlower.lowerings.kernels.triton import triton_unavailable
from qlower.lowerings.kernels.triton import configs

_ACT_DTYPES = (torch.bfloat16, torch.float16)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_CAPABILITY = (8, 0)  # bf16 and int8 tensor-core dots in Triton; measured on sm_90 only


def _platform(rec: QuantLinear) -> str | None:
    why = triton_unavailable()
    if why:
        return why
    device = rec.device
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if not torch.cuda.is_available():
        return "CUDA is not available in this process (capability unknown)"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        return f"capability {cap[0]}.{cap[1]} < {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
    return None


def _is_int8_2d(node: object) -> bool:
    v = tensor_val(node)
    return v is not None and v.dtype == torch.int8 and v.dim() == 2


def _per_channel_or_tensor(node: object, n: int, what: str) -> str | None:
    if node is None or isinstance(node, (int, float)):
        return None
    v = tensor_val(node)
    if v is None or not v.dtype.is_floating_point:
        return f"{what} is not a float tensor"
    if not (known_eq(v.numel(), n) or known_eq(v.numel(), 1)):
        return f"{what} has {v.numel()} elements, expected {n} or 1"
    return None


def _static_kn(rec: QuantLinear) -> str | None:
    if not (is_static(rec.k) and is_static(rec.n)):
        return f"K={rec.k} or N={rec.n} is dynamic (configs are chosen per static K, N)"
    if int(rec.k) == 0 or int(rec.n) == 0:
        return "K or N is 0"
    return None


def _crossover(rec: QuantLinear, max_m: int | None, other: str) -> str | None:
    """AUTO only: decline where the kernel was measured slower than `other` (or where M is unknown)."""
    if not is_static(rec.m):
        return (
            f"M is dynamic: above M={configs.DYNAMIC_M_SPLIT} one tiled config serves every M and loses to "
            f"{other} at some M (kernel_preference=TRITON takes it anyway)"
        )
    if max_m is not None and int(rec.m) > max_m:
        return f"M={int(rec.m)} > {max_m}: measured slower than {other} on H200"
    return None


def supports_woq_int8(rec: QuantLinear) -> str | None:
    return _woq_int8_correct(rec) or _crossover(rec, configs.WOQ_INT8_MAX_M, "dequant + mm")


def supports_dynamic_int8(rec: QuantLinear) -> str | None:
    return _dynamic_int8_correct(rec) or _crossover(rec, configs.DYNAMIC_INT8_MAX_M, "the next CUDA lowering")


def _woq_int8_correct(rec: QuantLinear) -> str | None:
    why = _platform(rec)
    if why:
        return why
    if rec.compute_dtype not in _ACT_DTYPES:
        return f"activation dtype {rec.compute_dtype} (the kernel takes bf16/fp16)"
    xv = tensor_val(rec.x)
    if xv is None or xv.dtype != rec.compute_dtype or xv.dim() != 2:
        return "x is not a 2-D tensor of the compute dtype"
    if not _is_int8_2d(rec.weight):
        return "weight is not a 2-D int8 tensor"
    why = _static_kn(rec)
    if why:
        return why
    return _per_channel_or_tensor(rec.weight_scale, rec.n, "weight scale") or weight_scale_range_blocker(rec)


def _dynamic_int8_correct(rec: QuantLinear) -> str | None:
    why = _platform(rec)
    if why:
        return why
    aq = rec.act_quant
    if aq is None or aq.scheme not in ("per_token_symmetric", "per_tensor_symmetric"):
        return f"activation quantization {aq.scheme if aq else None} (the kernel takes symmetric int8)"
    if aq.details.get("weight_zero_point") is not None:
        return "weight has a zero point"
    xqv = tensor_val(aq.x_q)
    if xqv is None or xqv.dtype != torch.int8 or not _is_int8_2d(rec.weight):
        return "x_q or weight is not an int8 tensor"
    if rec.out_dtype not in _OUT_DTYPES:
        return f"output dtype {rec.out_dtype}"
    why = _static_kn(rec)
    if why:
        return why
    return _per_channel_or_tensor(aq.x_scale, rec.m, "activation scale") or _per_channel_or_tensor(
        rec.weight_scale, rec.n, "weight scale"
    )


def _weight_nk_view(em: Emitter, rec: QuantLinear) -> fx.Node:
    """[N, K] as a view: a stored [K, N] weight is read through its strides, never copied."""
    return rec.weight if rec.weight_layout == "NK" else em.transpose(rec.weight)


def _full(em: Emitter, rec: QuantLinear, value: float | None) -> fx.Node:
    """A per-tensor scale given as a Python number (or absent: 1) as a 1-element fp32 tensor."""
    v = 1.0 if value is None else float(value)
    return em.call(
        torch.ops.aten.full.default, [1], v, dtype=torch.float32, device=rec.device, pin_memory=False
    )


def _scale_tensor(em: Emitter, rec: QuantLinear) -> fx.Node:
    s = rec.weight_scale
    return s if isinstance(s, fx.Node) else _full(em, rec, s)


def _fusable_bias(rec: QuantLinear) -> fx.Node | None:
    v = tensor_val(rec.bias)
    return rec.bias if v is not None and known_eq(v.numel(), rec.n) else None


def _exponent_range(dtype: torch.dtype) -> int:
    return int(torch.finfo(dtype).max).bit_length()


def _scale_after_kernel(rec: QuantLinear) -> bool:
    """Whether the graph's product (`mm * s`) has a wider range than the kernel's output (x's dtype): fp16 x
    with an fp32 scale gives an fp32 result, finite where acc * s stored as fp16 would be inf. The kernel
    then runs unscaled (its output rounded like the graph's mm) and the scale follows in fp32. bf16 shares
    fp32's exponent range: its kernel output stays scaled (one rounding, no extra pass)."""
    if rec.weight_scale is None:
        return False
    return _exponent_range(rec.compute_dtype) < _exponent_range(product_dtype(rec))


def emit_woq_int8(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    from qlower.lowerings.kernels.triton import int8_ops as ops  # noqa: F401  (registers the triton_ops; imports Triton)
    from qlower.lowerings.kernels.triton.inline import emit_traced

    em = Emitter(graph, rec.output)
    after = _scale_after_kernel(rec)
    bias = None if after else _fusable_bias(rec)
    scale = _full(em, rec, 1.0) if after else _scale_tensor(em, rec)
    tensors = [em.contiguous(rec.x), _weight_nk_view(em, rec), scale]
    tensors += [bias] if bias is not None else []

    def call(
        x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.qlower.woq_int8_linear(x, w, s, b)

    core = emit_traced(em, call, tensors)
    core = scale_epilogue(em, rec, core) if after else core
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)


def emit_dynamic_int8(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    from qlower.lowerings.kernels.triton import int8_ops as ops  # noqa: F401
    from qlower.lowerings.kernels.triton.inline import emit_traced

    assert rec.act_quant is not None
    em = Emitter(graph, rec.output)
    bias = _fusable_bias(rec)
    out_dtype = rec.out_dtype
    aq = rec.act_quant
    x_q = aq.x_q if tensor_val(aq.x_q).dim() == 2 else em.reshape(aq.x_q, [-1, int(rec.k)])
    x_scale = aq.x_scale if isinstance(aq.x_scale, fx.Node) else _full(em, rec, aq.x_scale)
    tensors = [em.contiguous(x_q), x_scale, _weight_nk_view(em, rec), _scale_tensor(em, rec)]
    tensors += [bias] if bias is not None else []

    def call(
        xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None = None
    ):
        return torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, b, out_dtype)

    core = emit_traced(em, call, tensors)
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)


WOQ_INT8_TRITON = Lowering(
    name="triton.woq_int8_linear",
    family="woq_int8",
    kind=KernelPreference.TRITON,
    supports=supports_woq_int8,
    emit=emit_woq_int8,
    doc="qlower Triton kernel: int8 weight converted in the main loop (GEMV at tiny M, tensor cores above)",
)

DYNAMIC_INT8_TRITON = Lowering(
    name="triton.int8_dynamic_linear",
    family="dynamic_int8",
    kind=KernelPreference.TRITON,
    supports=supports_dynamic_int8,
    emit=emit_dynamic_int8,
    doc="qlower Triton kernel: int8 x int8 tensor-core matmul, x_scale * w_scale and bias in the epilogue",
)

# Ranked after every other lowering: AUTO never reaches them (the fallbacks always support), an explicit
# kernel_preference=TRITON does, for any M (dynamic M: skinny and tiled launches gated by M at run time).
WOQ_INT8_TRITON_ANY_M = dataclasses.replace(
    WOQ_INT8_TRITON, name="triton.woq_int8_linear.any_m", supports=_woq_int8_correct
)
DYNAMIC_INT8_TRITON_ANY_M = dataclasses.replace(
    DYNAMIC_INT8_TRITON, name="triton.int8_dynamic_linear.any_m", supports=_dynamic_int8_correct
)

LOWERINGS: tuple[Lowering, ...] = (WOQ_INT8_TRITON, DYNAMIC_INT8_TRITON)
LOWERINGS_LAST: tuple[Lowering, ...] = (WOQ_INT8_TRITON_ANY_M, DYNAMIC_INT8_TRITON_ANY_M)
