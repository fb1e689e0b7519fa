"""Emitters for dynamic-int8 records: an int8 x int8 -> int32 matmul between the graph's own activation
quantization (prologue) and one fused rescale (epilogue).

The epilogue always runs in fp32: y = (acc - compensation) * x_scale[M, 1] * w_scale[N] + bias, then the
record's output dtype and shape. Zero points become integer compensation terms (exact in int32):
  (x_q - zx) @ (w_q - zw).T = x_q @ w_q.T - rowsum(x_q) zw - zx colsum(w_q) + K zx zw.

Which device uses which emitter, and for which shapes, is decided in the per-device modules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from qlower.lowerings.emit.common import scale_vector, weight_nk
from qlower.lowerings.graph import inductor_fixes
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.graph.decompose import materialize
from qlower.lowerings.kernels import custom_ops
from qlower.lowerings.preference import KernelPreference
from qlower.patterns.graph_utils import aten, is_static, tensor_val
from qlower.patterns.record import QuantLinear

# fp32 adds integers exactly up to 2**24; an int8 x int8 product is at most 128 * 128 = 2**14 in magnitude.
EXACT_FP32_K = 2**24 // 2**14


class _Emitter(Emitter):
    """An Emitter that remembers which PT2E fallback nodes it already inlined (shared scale/zero point)."""

    def __init__(self, graph: fx.Graph, before: fx.Node) -> None:
        super().__init__(graph, before)
        self.memo: dict[fx.Node, Any] = {}


def _emitter(graph: fx.Graph, rec: QuantLinear) -> _Emitter:
    return _Emitter(graph, rec.output)


def activation_2d(em: _Emitter, rec: QuantLinear) -> fx.Node:
    """The int8 activation as a contiguous [M, K] tensor (PT2E fallback quantize ops inlined as aten)."""
    assert rec.act_quant is not None
    x = materialize(em, rec.act_quant.x_q, em.memo)
    v = tensor_val(x)
    assert v is not None
    if v.dim() != 2:
        x = em.reshape(x, [-1, rec.k])
    return em.contiguous(x)


def _per_row(em: _Emitter, node: Any, dtype: torch.dtype) -> Any:
    """A per-token (numel M) or per-tensor value as [M, 1] / [1, 1] of `dtype`; Python numbers pass."""
    if not isinstance(node, fx.Node):
        return node
    node = materialize(em, node, em.memo)
    v = tensor_val(node)
    assert v is not None
    node = em.reshape(node, [-1, 1]) if v.dim() != 2 or v.shape[-1] != 1 else node
    return em.convert(node, dtype)


def _per_col(em: Emitter, rec: QuantLinear, node: Any, dtype: torch.dtype) -> Any:
    """A per-channel (numel N) or per-tensor value as [1, N] / [1, 1] of `dtype`; Python numbers pass."""
    if not isinstance(node, fx.Node):
        return node
    v = tensor_val(node)
    assert v is not None
    shape = [1, rec.n] if is_static(v.numel()) and int(v.numel()) == rec.n else [1, 1]
    return em.convert(em.reshape(node, shape), dtype)


def _times(em: _Emitter, a: Any, b: Any) -> Any:
    """a * b where either may be a Python int (the tensor goes first, as aten.mul.Tensor wants)."""
    if not isinstance(a, fx.Node):
        a, b = b, a
    return em.call(aten.mul.Tensor, a, b)


def _compensate(
    em: _Emitter, rec: QuantLinear, acc: fx.Node, x_in: fx.Node, w_nk: fx.Node, shift: int = 0
) -> fx.Node:
    """Subtract the zero-point terms from the int32 accumulator of `x_in @ w_nk.T`, where x_in = x_q + shift
    (shift 128: the u8s8 form): (x_in - zx - shift) @ (w - zw).T. No-op for symmetric records, shift 0."""
    assert rec.act_quant is not None
    zx = rec.act_quant.zero_point
    zw = rec.weight_zero_point
    i32 = torch.int32
    if zx is not None:
        zx = _per_row(em, zx, i32)
    if shift:
        zx = (
            shift
            if zx is None
            else (zx + shift if isinstance(zx, int) else em.call(aten.add.Tensor, zx, shift))
        )
    if zw is not None:
        row_sum = em.call(aten.sum.dim_IntList, x_in, [1], True, dtype=i32)  # [M, 1]
        acc = em.call(aten.sub.Tensor, acc, _times(em, row_sum, _per_col(em, rec, zw, i32)))
    if zx is not None:
        col_sum = em.reshape(em.call(aten.sum.dim_IntList, w_nk, [1], False, dtype=i32), [1, rec.n])
        acc = em.call(aten.sub.Tensor, acc, _times(em, col_sum, zx))
        if zw is not None:
            both = _times(em, _per_col(em, rec, zw, i32), zx)
            acc = em.call(aten.add.Tensor, acc, em.call(aten.mul.Tensor, both, rec.k))
    return acc


def rescale(
    em: _Emitter, rec: QuantLinear, acc: fx.Node, x_in: fx.Node, w_nk: fx.Node, shift: int = 0
) -> fx.Node:
    """int32 [M, N] accumulator -> the record's output value (compensation, fp32 scales, bias, dtype, shape)."""
    assert rec.act_quant is not None
    acc = _compensate(em, rec, acc, x_in, w_nk, shift)
    # int32 * fp32 promotes exactly like convert-then-multiply. No explicit convert on purpose: with freezing,
    # Inductor's `_register_smooth_quant_int_mm_pattern` rewrites `convert(_int_mm(a, w_const)) * s * s` to
    # oneDNN qlinear, which on AVX512-VNNI CPUs without AMX is 20-90x slower than `_int_mm` (BENCHMARKS.md).
    y = em.call(aten.mul.Tensor, acc, _per_row(em, rec.act_quant.x_scale, torch.float32))
    if rec.weight_scale is not None:
        y = em.call(aten.mul.Tensor, y, scale_vector(em, rec, torch.float32))
    if rec.bias is not None:  # in fp32, like torchao's own epilogue: one rounding, at the end
        y = em.call(aten.add.Tensor, y, em.reshape(rec.bias, [rec.n]))
    y = em.convert(y, rec.out_dtype)
    return em.reshape(y, rec.out_shape) if rec.out_shape is not None else y


def emit_int_mm(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """aten._int_mm(x_q [M, K], w [N, K].t()) and the fused rescale."""
    em = _emitter(graph, rec)
    x2d, w_nk = activation_2d(em, rec), weight_nk(em, rec)
    acc = em.call(aten._int_mm.default, x2d, em.transpose(w_nk))
    return rescale(em, rec, acc, x2d, w_nk)


U8_SHIFT = 128


def shift_to_u8(em: _Emitter, x_q: fx.Node) -> fx.Node:
    """int8 v -> uint8 v + 128, exactly: flipping the sign bit of the same byte. As a bitcast and an xor the
    fused quantize kernel took 0.38 ms at M=128, K=4096 (1 thread) against 0.74 ms for widening to int32,
    adding and narrowing; in the whole compiled linear (~11.9 ms, dominated by the 10.4 ms oneDNN call) the
    difference was within noise."""
    return em.call(aten.bitwise_xor.Scalar, em.call(aten.view.dtype, x_q, torch.uint8), U8_SHIFT)


def make_emit_int_mm_u8() -> Callable[[fx.Graph, QuantLinear, KernelPreference], fx.Node]:
    """u8s8 `_int_mm`: (x_q + 128) as uint8 [M, K] times the int8 weight, minus 128 * colsum(w) in the
    epilogue (exact in int32). The shift fuses into the quantize prologue; the column sums fold into a constant
    under freezing. Which M take it is the lowering's `supports` (lowerings/devices/cpu.py)."""

    def emit(
        graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
    ) -> fx.Node:
        em = _emitter(graph, rec)
        x2d, w_nk = activation_2d(em, rec), weight_nk(em, rec)
        x_u8 = shift_to_u8(em, x2d)
        acc = em.call(aten._int_mm.default, x_u8, em.transpose(w_nk))
        return rescale(em, rec, acc, x_u8, w_nk, shift=U8_SHIFT)

    return emit


def make_emit_int_mm_min_m(min_m: int) -> Callable[[fx.Graph, QuantLinear, KernelPreference], fx.Node]:
    """`_int_mm` for kernels that need M >= min_m: a static small M is zero-padded (the pad fuses into the
    quantize prologue) and the result sliced; a dynamic M goes through a custom op that pads only when
    M < min_m at run time."""

    def emit(
        graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
    ) -> fx.Node:
        em = _emitter(graph, rec)
        x2d, w_nk = activation_2d(em, rec), weight_nk(em, rec)
        if not is_static(rec.m):
            acc = em.call(custom_ops.int8_mm_min_m, x2d, w_nk, min_m)
        elif int(rec.m) < min_m:
            padded = em.call(aten.constant_pad_nd.default, x2d, [0, 0, 0, min_m - int(rec.m)], 0.0)
            full = em.call(aten._int_mm.default, padded, em.transpose(w_nk))
            acc = em.call(aten.slice.Tensor, full, 0, 0, int(rec.m))
        else:
            acc = em.call(aten._int_mm.default, x2d, em.transpose(w_nk))
        return rescale(em, rec, acc, x2d, w_nk)

    return emit


def make_emit_int8_gemm(max_m: int) -> Callable[[fx.Graph, QuantLinear, KernelPreference], fx.Node]:
    """`qlower::int8_gemm` (lowerings/kernels/csrc/int8_gemm.cpp): qlower's CPU kernels up to `max_m` rows,
    `_int_mm` above (decided at each call, so a symbolic M takes it too), then the fused rescale."""

    def emit(
        graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
    ) -> fx.Node:
        em = _emitter(graph, rec)
        x2d, w_nk = activation_2d(em, rec), weight_nk(em, rec)
        acc = em.call(custom_ops.int8_gemm, x2d, w_nk, max_m)
        return rescale(em, rec, acc, x2d, w_nk)

    return emit


def emit_emulated(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """The int8 matmul in fp32, exact for any K: K is cut into chunks of EXACT_FP32_K (each chunk's sum is
    an exact fp32 integer), the chunk results are added in int32. Works on every device."""
    em = _emitter(graph, rec)
    x2d, w_nk = activation_2d(em, rec), weight_nk(em, rec)
    xf, wf = em.convert(x2d, torch.float32), em.convert(w_nk, torch.float32)
    chunk = EXACT_FP32_K
    if rec.k <= chunk:
        acc = em.convert(em.call(aten.mm.default, xf, em.transpose(wf)), torch.int32)
    else:
        chunks = -(-rec.k // chunk)
        pad = chunks * chunk - rec.k
        if pad:
            xf = em.call(aten.constant_pad_nd.default, xf, [0, pad], 0.0)
            wf = em.call(aten.constant_pad_nd.default, wf, [0, pad], 0.0)
        x3 = em.call(aten.permute.default, em.reshape(xf, [-1, chunks, chunk]), [1, 0, 2])  # [C, M, chunk]
        w3 = em.call(aten.permute.default, em.reshape(wf, [rec.n, chunks, chunk]), [1, 2, 0])  # [C, chunk, N]
        partial = em.convert(em.call(aten.bmm.default, x3, w3), torch.int32)  # [C, M, N], each exact
        acc = em.call(aten.sum.dim_IntList, partial, [0], False, dtype=torch.int32)
    return rescale(em, rec, acc, x2d, w_nk)


def emit_qlinear_u8(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """oneDNN qlinear on a prepacked constant weight: (x_q + 128) as uint8 with zero point 128, the weight
    scale applied by the kernel, the per-token scale and bias in the fused epilogue. Only for weights that
    freezing turns into constants: `qlinear_prepack` is then folded once, at compile time."""

    def qlinear(em: _Emitter, x_u8: fx.Node, w_scale: fx.Node) -> fx.Node:
        inductor_fixes.fake_qlinear_prepack()
        packed = em.call(torch.ops.onednn.qlinear_prepack.default, weight_nk(em, rec), None)
        return em.call(
            torch.ops.onednn.qlinear_pointwise.default,
            *(x_u8, 1.0, U8_SHIFT, packed, w_scale, None, None, 1.0, 0, torch.float32, "none", [], ""),
        )

    return _emit_qlinear(graph, rec, qlinear)


def emit_qlinear_u8_cached(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """The same u8 qlinear for weights that stay graph inputs: the packing is cached at run time, keyed and
    checked on the live weight (lowerings/kernels/cpu_prepack.py)."""

    def qlinear(em: _Emitter, x_u8: fx.Node, w_scale: fx.Node) -> fx.Node:
        # the graph's weight itself, not the [N, K] copy: the cache keys on the tensor the caller passes
        return em.call(custom_ops.qlinear_u8_cached, x_u8, rec.weight, w_scale, rec.weight_layout == "KN")

    return _emit_qlinear(graph, rec, qlinear)


def _emit_qlinear(
    graph: fx.Graph, rec: QuantLinear, qlinear: Callable[[_Emitter, fx.Node, fx.Node], fx.Node]
) -> fx.Node:
    """Shift the activation to uint8, call `qlinear` (fp32 [M, N] with the weight scale applied), then the
    per-token scale, bias, dtype and shape."""
    assert rec.act_quant is not None
    em = _emitter(graph, rec)
    x2d = activation_2d(em, rec)
    x_u8 = shift_to_u8(em, x2d)
    y = qlinear(em, x_u8, scale_vector(em, rec, torch.float32))
    y = em.call(aten.mul.Tensor, y, _per_row(em, rec.act_quant.x_scale, torch.float32))
    if rec.bias is not None:
        y = em.call(aten.add.Tensor, y, em.reshape(rec.bias, [rec.n]))
    y = em.convert(y, rec.out_dtype)
    return em.reshape(y, rec.out_shape) if rec.out_shape is not None else y
