"""How a woq-int8 or dynamic-int8 record becomes a call of qlower's int8 Triton kernels. When each is chosen is
`lowerings/devices/cuda.py` (`WOQ_INT8_TRITON`, `DYNAMIC_INT8_TRITON`: `supports` checks correctness, `prefer`
the measured crossover in `kernels/triton/configs.py`)."""

from __future__ import annotations

import dataclasses

import torch
from torch import fx

from qlower.lowerings.emit.common import finish, scale_epilogue
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.preference import KernelPreference
from qlower.lowerings.scale_facts import scale_after_kernel
from qlower.lowerings.symbolic_m import host_branches
from qlower.patterns.graph_utils import is_static, known_eq, tensor_val
from qlower.patterns.record import QuantLinear


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


def _absorbed_scale(em: Emitter, rec: QuantLinear) -> fx.Node | None:
    """The fp32 tensor the graph rounds to x's dtype as this linear's scale (`patterns.record.ScaleCast`),
    flattened as a view, for a kernel that rounds it itself (`round_scale`): the graph's cast then has no
    user left and is erased with the record's nodes. None where the record has no such cast."""
    cast = rec.scale_cast
    if cast is None or cast.dtype != rec.compute_dtype:
        return None
    numel = tensor_val(rec.weight_scale).numel()
    return em.reshape(cast.source, [int(numel)])


def _fusable_bias(rec: QuantLinear) -> fx.Node | None:
    v = tensor_val(rec.bias)
    return rec.bias if v is not None and known_eq(v.numel(), rec.n) else None


def _dense_above(rec: QuantLinear, preference: KernelPreference, crossover: int | None) -> int:
    """Where a symbolic M hands over to dequant + cuBLAS inside the op: AUTO's measured crossover as the device
    rules hand it over (`devices/crossovers.py`), never under an explicit preference (TRITON keeps its kernels at
    every M), 0 for a static M (chosen at compile time)."""
    if is_static(rec.m) or preference is not KernelPreference.AUTO:
        return 0
    return crossover or 0


def emit_woq_int8(
    graph: fx.Graph,
    rec: QuantLinear,
    preference: KernelPreference,
    dense_above: int | None = None,
    cutlass_above: int | None = None,
) -> fx.Node:
    """The Triton op. `dense_above`: AUTO's crossover to dequant + cuBLAS for a symbolic M (`_dense_above`).
    `cutlass_above` (a symbolic M under the CUTLASS lowering, `emit.cutlass`): M above it
    runs qlower's CUTLASS GEMM inside the op, instead of dequant + cuBLAS above AUTO's Triton crossover; the
    scale then goes in as the graph has it (the lowering checked it is of x's dtype)."""
    from qlower.lowerings.graph.triton_inline import emit_traced
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401  (registers the triton_ops; imports Triton)

    em = Emitter(graph, rec.output)
    after = scale_after_kernel(rec)
    bias = None if after else _fusable_bias(rec)
    absorbed = None if after or cutlass_above is not None else _absorbed_scale(em, rec)
    if after:
        scale = _full(em, rec, 1.0)
    else:
        scale = absorbed if absorbed is not None else _scale_tensor(em, rec)
    tensors = [em.contiguous(rec.x), _weight_nk_view(em, rec), scale]
    tensors += [bias] if bias is not None else []

    handoff = _dense_above(rec, preference, dense_above) if cutlass_above is None else cutlass_above
    dense_cutlass = cutlass_above is not None
    host_branch = host_branches(rec)
    round_scale = absorbed is not None

    def call(
        x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        return torch.ops.qlower.woq_int8_linear(x, w, s, b, handoff, host_branch, round_scale, dense_cutlass)

    key = ("woq_int8_linear", handoff, host_branch, round_scale, bias is not None, dense_cutlass)
    core = emit_traced(em, call, tensors, key)
    core = scale_epilogue(em, rec, core) if after else core
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)


def emit_dynamic_int8(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    from qlower.lowerings.graph.triton_inline import emit_traced
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    assert rec.act_quant is not None
    em = Emitter(graph, rec.output)
    bias = _fusable_bias(rec)
    out_dtype = rec.out_dtype
    aq = rec.act_quant
    x_q = aq.x_q if tensor_val(aq.x_q).dim() == 2 else em.reshape(aq.x_q, [-1, int(rec.k)])
    x_scale = aq.x_scale if isinstance(aq.x_scale, fx.Node) else _full(em, rec, aq.x_scale)
    tensors = [em.contiguous(x_q), x_scale, _weight_nk_view(em, rec), _scale_tensor(em, rec)]
    tensors += [bias] if bias is not None else []
    host_branch = host_branches(rec)

    def call(
        xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, s: torch.Tensor, b: torch.Tensor | None = None
    ):
        return torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, b, out_dtype, host_branch)

    core = emit_traced(em, call, tensors, ("int8_dynamic_linear", out_dtype, host_branch, bias is not None))
    return finish(em, rec if bias is None else dataclasses.replace(rec, bias=None), core)
