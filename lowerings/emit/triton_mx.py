"""The CUDA lowerings (kind TRITON) that call qlower's MX Triton kernels (`mx_kernels`), and when they may.

For GPUs without MX tensor cores (capability < 10.0: the H200 here) and for weight-only MX anywhere. fp8
converts and fp8 tensor-core dots in Triton need capability >= 8.9.

Measured on the H200 (BENCHMARKS.md, "MX"): the GEMV kernel wins at decode sizes (MXFP8 weight-only M=1
1.30x bf16), but the dynamic-activation tile kernel (fp8 dots per 32-wide K chunk) ran at 0.15x bf16 at
M=4096 and 0.33x at M=128. So `MX_TRITON` declines dynamic-activation records above the GEMV range and AUTO
falls through to the fused emulation (dequantize + bf16 mm); `MX_TRITON_ANY_M`, ranked after emulation,
still serves an explicit `KernelPreference.TRITON`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from qlower.patterns.graph_utils import is_static, known_eq, tensor_val
from qlower.patterns.record import QuantLinear

from qlower.lowerings.backends.capability import cuda_capability, describe_capability
from qlower.lowerings.emit.common import Emitter, finish
from qlower.lowerings.emit.mx import as_u8_view, scale_codes, spec_layout_blocker
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.registry import Lowering
from qlower.lowerings.kernels.triton import triton_unavailable

MIN_CAPABILITY = (8, 9)
_ACT_DTYPES = (torch.bfloat16, torch.float16)
_OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def supports_mx_triton(rec: QuantLinear) -> str | None:
    why = triton_unavailable()
    if why:
        return why
    if rec.device.type != "cuda":
        return f"device {rec.device} is not CUDA"
    cap = cuda_capability(rec.device)
    if cap is None or cap < MIN_CAPABILITY:
        return f"Triton fp8 needs capability >= 8.9; this device's is {describe_capability(cap)}"
    if rec.act_quant is None:
        xv = tensor_val(rec.x)
        if xv is None or xv.dtype not in _ACT_DTYPES or xv.dim() != 2:
            return f"activation dtype {rec.compute_dtype}: the kernels take bf16/fp16 activations"
    elif rec.act_quant.scheme != "mx_block":
        return f"activation quantization {rec.act_quant.scheme} is not MX"
    if rec.compute_dtype not in _OUT_DTYPES:
        return f"output dtype {rec.compute_dtype}"
    return spec_layout_blocker(rec)


def supports_mx_triton_measured(rec: QuantLinear) -> str | None:
    """`supports_mx_triton`, minus where the tile kernel measured slower than the emulation by far.

    Weight-only MX at a static M above the decode kernels' range: the tile kernel ran 0.16-0.43x bf16 at
    M=128-4096 on the H200 (2026-11-30, BENCHMARKS.md), the emulation (dequantize once, bf16 matmul) 0.85-0.93x
    of bf16 at M=4096. A symbolic M keeps the Triton op (its decode buckets serve M <= 16, where it is 2x bf16).
    """
    why = supports_mx_triton(rec)
    if why:
        return why
    from qlower.lowerings.kernels.triton.mx_ops import DECODE_MAX_M, GEMV_MAX_M  # no Triton import: mx_ops imports it, so read them lazily

    if rec.act_quant is None:
        if is_static(rec.m) and int(rec.m) > DECODE_MAX_M:
            return (
                f"weight-only MX with M={rec.m} > {DECODE_MAX_M} would run the tile kernel, measured at 0.16-0.43x "
                "bf16 (M=128-4096) on H200, below the emulation; ask for KernelPreference.TRITON to use it anyway"
            )
        return None
    if not is_static(rec.m) or int(rec.m) > GEMV_MAX_M:
        return (
            f"dynamic-activation MX with M={rec.m} > {GEMV_MAX_M} would run the fp8 tile kernel, measured at "
            "0.15x bf16 (M=4096) and 0.33x (M=128) on H200; ask for KernelPreference.TRITON to use it anyway"
        )
    return None


def _elem_code(elem: str) -> int:
    return {"e4m3": 1, "e5m2": 2, "e2m1": 3}[elem]


def emit_mx_triton(graph: fx.Graph, rec: QuantLinear) -> fx.Node:
    from qlower.lowerings.kernels.triton import mx_ops  # noqa: F401  (registers qlower::mx_linear; imports Triton)
    from qlower.lowerings.kernels.triton.inline import emit_traced

    em = Emitter(graph, rec.output)
    cols = rec.k // 32
    d = rec.details
    w = as_u8_view(em, rec.weight if rec.weight_layout == "NK" else em.transpose(rec.weight))
    ws, w_swz = scale_codes(
        em, rec.weight_scale, d["w_scale_layout"], d["w_scale_codes"], d["w_scale_assoc"], cols
    )
    aq = rec.act_quant
    if aq is None:
        a, a_fmt, a_swz, tensors = rec.x, 0, False, [rec.x]
    else:
        ad = aq.details
        a, a_fmt = as_u8_view(em, aq.x_q), _elem_code(ad["elem"])
        xs, a_swz = scale_codes(
            em, aq.x_scale, ad["scale_layout"], ad["scale_codes"], ad["scale_assoc"], cols
        )
        tensors = [a, xs]
    bv = tensor_val(rec.bias)
    bias = rec.bias if bv is not None and known_eq(bv.numel(), rec.n) else None
    tensors += [w, ws] + ([bias] if bias is not None else [])
    w_fmt, out_dtype, has_xs = _elem_code(d["w_elem"]), rec.compute_dtype, aq is not None

    def call(*ts: torch.Tensor) -> torch.Tensor:
        it = iter(ts)
        a_t = next(it)
        xs_t = next(it) if has_xs else None
        w_t, ws_t = next(it), next(it)
        b_t = next(it, None)
        return torch.ops.qlower.mx_linear(a_t, xs_t, w_t, ws_t, b_t, a_fmt, w_fmt, a_swz, w_swz, out_dtype)

    core = emit_traced(em, call, tensors)
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)


MX_TRITON = Lowering(
    name="triton.mx_linear",
    family="mx",
    kind=KernelPreference.TRITON,
    supports=supports_mx_triton_measured,
    emit=emit_mx_triton,
    doc="qlower Triton MX kernels: GEMV at small M, tiles above (not for dynamic MX above the GEMV range)",
)

MX_TRITON_ANY_M = Lowering(
    name="triton.mx_linear.any_m",
    family="mx",
    kind=KernelPreference.TRITON,
    supports=supports_mx_triton,
    emit=emit_mx_triton,
    doc="the same kernels at every M (ranked after emulation: serves KernelPreference.TRITON)",
)
