"""How a record becomes a call of qlower's MX Triton kernels (`qlower::mx_linear`). When it is chosen is
`lowerings/devices/cuda.py` (`MX_TRITON`: `supports` checks correctness, `prefer` the measured crossover)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import torch
from torch import fx

from qlower.lowerings.emit.common import finish
from qlower.lowerings.emit.mx import as_u8_view, block_scale_bits, scale_codes
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.symbolic_m import host_branches
from qlower.patterns.graph_utils import known_eq, tensor_val
from qlower.patterns.record import QuantLinear


def _elem_code(elem: str) -> int:
    return {"e4m3": 1, "e5m2": 2, "e2m1": 3}[elem]


def special_bits(special: Mapping[int, float] | None) -> int:
    """The kernels' e8m0 flags for a record's `{code: value}` where its decode is not the spec's
    (patterns/mx.py records 0 -> 0.0 and 255 -> +inf, `mx_format.E8M0_SPECIAL_ALTERNATIVES`): without them the
    kernels would decode 0 as 2**-127 and 255 as NaN, other numbers than the graph's."""
    from qlower.lowerings.kernels.triton.mx.kernels import SPECIAL_INF, SPECIAL_ZERO

    bits = 0
    for code, value in (special or {}).items():
        if code == 0 and value == 0.0:
            bits |= SPECIAL_ZERO
        elif code == 255 and value == math.inf:
            bits |= SPECIAL_INF
        else:
            raise ValueError(f"qlower: no MX Triton kernel decodes e8m0 code {code} as {value}")
    return bits


def emit_mx_triton(
    graph: fx.Graph,
    rec: QuantLinear,
    preference: KernelPreference = KernelPreference.AUTO,
    cutlass_min_m: int = 0,
    cutlass_max_m: int = 0,
) -> fx.Node:
    """The Triton MX op. `cutlass_min_m` (> 0, a symbolic M under the CUTLASS MXFP4 lowering,
    `emit.cutlass`): the op is also handed the weight's block scales as qlower's CUTLASS MXFP4 GEMM reads
    them, and runs that GEMM from this M to `cutlass_max_m` (0: no end; `mx.ops.pick_weight_only`)."""
    from qlower.lowerings.graph.triton_inline import emit_traced
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops  # noqa: F401  (registers qlower::mx_linear; imports Triton)

    em = Emitter(graph, rec.output)
    cols = rec.k // 32
    d = rec.weight_mx
    assert d is not None
    w = as_u8_view(em, rec.weight if rec.weight_layout == "NK" else em.transpose(rec.weight))
    ws, w_swz = scale_codes(em, rec.weight_scale, d.scale_layout, d.scale_codes, d.scale_assoc, cols)
    w_sp = special_bits(d.scale_special)
    aq = rec.act_quant
    if aq is None:
        a, a_fmt, a_swz, a_sp, tensors = rec.x, 0, False, 0, [rec.x]
    else:
        ad = aq.mx
        assert ad is not None
        a_sp = special_bits(ad.scale_special)
        a, a_fmt = as_u8_view(em, aq.x_q), _elem_code(ad.elem)
        xs, a_swz = scale_codes(em, aq.x_scale, ad.scale_layout, ad.scale_codes, ad.scale_assoc, cols)
        tensors = [a, xs]
    bv = tensor_val(rec.bias)
    bias = rec.bias if bv is not None and known_eq(bv.numel(), rec.n) else None
    tensors += [w, ws] + ([bias] if bias is not None else [])
    if cutlass_min_m:
        tensors.append(block_scale_bits(em, rec))
    w_fmt, out_dtype, has_xs, has_b = _elem_code(d.elem), rec.compute_dtype, aq is not None, bias is not None
    host_branch = host_branches(rec)

    def call(*ts: torch.Tensor) -> torch.Tensor:
        it = iter(ts)
        a_t = next(it)
        xs_t = next(it) if has_xs else None
        w_t, ws_t = next(it), next(it)
        b_t = next(it) if has_b else None
        blocks = next(it, None)
        return torch.ops.qlower.mx_linear(
            a_t, xs_t, w_t, ws_t, b_t, a_fmt, w_fmt, a_swz, w_swz, out_dtype, host_branch, a_sp, w_sp,
            blocks, cutlass_min_m, cutlass_max_m,
        )  # fmt: skip

    key = (
        "mx_linear",
        has_xs,
        bias is not None,
        a_fmt,
        w_fmt,
        a_swz,
        w_swz,
        out_dtype,
        host_branch,
        a_sp,
        w_sp,
        cutlass_min_m,
        cutlass_max_m,
    )
    core = emit_traced(em, call, tensors, key)
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)
