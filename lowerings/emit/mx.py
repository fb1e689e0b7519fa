"""Emitters for MX records: the operands in the layouts kernels want, fused emulation, and `_scaled_mm`.

The record names stored tensors (elements, scale codes) and their layouts (`patterns/mx.py`); these helpers
turn them into graph values. Which device uses which emitter is decided by `supports` rules elsewhere.
No e8m0 or fp4x2 value reaches a generated kernel here: Inductor's C++ backend has no type for them
(`KeyError: torch.float8_e8m0fnu`), so e8m0 and fp4x2 bytes are copied out as uint8 by `qlower::mx_bytes`
(an extern op with a C shim, so AOTInductor needs no proxy executor) and decoded from their bits.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from qlower.lowerings.emit.common import finish
from qlower.lowerings.graph.builder import Emitter
from qlower.lowerings.preference import KernelPreference
from qlower.patterns import mx_format as fmt
from qlower.patterns.graph_utils import VIEW_OPS, aten, prims, tensor_val
from qlower.patterns.record import QuantLinear


@torch.library.custom_op("qlower::mx_bytes", mutates_args=())
def _mx_bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of an 8-bit tensor of a dtype generated code cannot name (fp4x2, e8m0), as uint8."""
    return t.view(torch.uint8).clone()


@_mx_bytes.register_fake
def _(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, dtype=torch.uint8)


mx_bytes = torch.ops.qlower.mx_bytes.default


def _dtype(node: fx.Node) -> torch.dtype:
    v = tensor_val(node)
    assert v is not None
    return v.dtype


def as_u8_view(em: Emitter, node: fx.Node) -> fx.Node:
    """Same bytes as uint8 through a bitcast (fine for Triton kernels and cuBLAS; not for C++ codegen)."""
    return node if _dtype(node) == torch.uint8 else em.call(aten.view.dtype, node, torch.uint8)


def as_u8_copy(em: Emitter, node: fx.Node) -> fx.Node:
    """Same bytes as uint8, copied by an extern op when the dtype has no C++ type."""
    return node if _dtype(node) == torch.uint8 else em.call(mx_bytes, node)


def _rows_first(em: Emitter, node: fx.Node, cols: int, layout: str) -> fx.Node:
    """A stored [rows, cols] ('plain', 'nk') or [cols, rows] ('plain_t', 'kn') tensor as [rows, cols]."""
    if layout in ("plain", "nk"):
        return em.reshape(node, [-1, cols])
    return em.transpose(em.reshape(node, [cols, -1]))


def scale_codes(
    em: Emitter, src: fx.Node, layout: str, codes: fx.Node, assoc: str, cols: int
) -> tuple[fx.Node, bool]:
    """uint8 codes for a kernel: ([rows, cols] strided view, False) or (flat swizzled tensor, True)."""
    if layout == "swizzled":
        return em.reshape(as_u8_view(em, src), [-1]), True
    if layout == "other":
        return _rows_first(em, as_u8_view(em, codes), cols, assoc), False
    return _rows_first(em, as_u8_view(em, src), cols, layout), False


def _scalar(em: Emitter, value: Any, dtype: torch.dtype, device: torch.device) -> fx.Node:
    return em.call(aten.scalar_tensor.default, value, dtype=dtype, device=device)


def decode_codes(
    em: Emitter, t: fx.Node, device: torch.device, special: dict[int, float] | None = None
) -> fx.Node:
    """e8m0 codes (uint8 or float8_e8m0fnu, any shape) -> float32 2 ** (code - 127), NaN for 255.

    `special` (the record's): the matched decode's own values at code 0 (0.0) / 255 (+Inf), which are
    exactly what the bits `code << 23` give there, so they skip the spec's fix-ups.
    """
    special = special or {}
    assert all(v in fmt.E8M0_SPECIAL_ALTERNATIVES[c] for c, v in special.items()), special
    if _dtype(t) == torch.float8_e8m0fnu:
        # Copy the bytes out (qlower::mx_bytes): a float conversion of e8m0 would be a prims fallback, which
        # AOTInductor can only run through its proxy executor; mx_bytes has a C shim.
        t = as_u8_copy(em, t)
    c = em.convert(t, torch.int32)
    bits = em.call(aten.bitwise_left_shift.Tensor_Scalar, c, 23)
    if 0 not in special:
        bits = em.call(
            aten.where.self, em.call(aten.eq.Scalar, c, 0), _scalar(em, 0x00400000, torch.int32, device), bits
        )
    s = em.call(aten.view.dtype, bits, torch.float32)
    if fmt.E8M0_NAN in special:
        return s
    nan = _scalar(em, float("nan"), torch.float32, device)
    return em.call(aten.where.self, em.call(aten.eq.Scalar, c, fmt.E8M0_NAN), nan, s)


def unswizzle(em: Emitter, flat: fx.Node, rows: int, cols: int) -> fx.Node:
    """Flat 128x4-tiled scales -> [rows, cols] (static shapes: weights, or activations of static M)."""
    rt, ct = fmt.round_up(rows, 128) // 128, fmt.round_up(cols, 4) // 4
    t = em.reshape(flat, [rt, ct, 32, 4, 4])
    t = em.contiguous(em.call(aten.permute.default, t, [0, 3, 2, 1, 4]))
    t = em.reshape(t, [rt * 128, ct * 4])
    t = em.call(aten.slice.Tensor, t, 0, 0, rows)
    return em.call(aten.slice.Tensor, t, 1, 0, cols)


def scale_f32(
    em: Emitter,
    src: fx.Node,
    layout: str,
    codes: fx.Node,
    assoc: str,
    rows: Any,
    cols: int,
    device: torch.device,
    special: dict[int, float] | None = None,
) -> fx.Node:
    """Decoded block scales [rows, cols] float32; decoding happens on the stored tensor, before any layout op."""
    if layout == "swizzled":
        return unswizzle(em, decode_codes(em, em.reshape(src, [-1]), device, special), int(rows), cols)
    if layout == "other":
        return _rows_first(em, decode_codes(em, codes, device, special), cols, assoc)
    return _rows_first(em, decode_codes(em, src, device, special), cols, layout)


def _e2m1_values(em: Emitter, codes: fx.Node, device: torch.device) -> fx.Node:
    """int32 codes 0..15 -> float32 values, by exact bit arithmetic (no table, no exp2)."""
    mag = em.call(aten.bitwise_and.Scalar, codes, 7)
    exp = em.call(aten.bitwise_right_shift.Tensor_Scalar, mag, 1)
    mant = em.call(aten.bitwise_and.Scalar, mag, 1)
    # exp >= 1: (1 + mant / 2) * 2 ** (exp - 1) is the fp32 with exponent field exp + 126, mantissa bit 22.
    hi = em.call(aten.bitwise_left_shift.Tensor_Scalar, em.call(aten.add.Tensor, exp, 126), 23)
    normal = em.call(
        aten.view.dtype,
        em.call(aten.bitwise_or.Tensor, hi, em.call(aten.bitwise_left_shift.Tensor_Scalar, mant, 22)),
        torch.float32,
    )
    sub = em.call(aten.mul.Tensor, em.convert(mant, torch.float32), 0.5)
    val = em.call(aten.where.self, em.call(aten.eq.Scalar, exp, 0), sub, normal)
    return em.call(aten.where.self, em.call(aten.ge.Scalar, codes, 8), em.call(aten.neg.default, val), val)


def elements_f32(
    em: Emitter,
    src: fx.Node,
    layout: str,
    elem: str,
    k: int,
    device: torch.device,
    nibbles: str = "low_first",
    table: fx.Node | None = None,
) -> fx.Node:
    """Element values [rows, K] float32 from stored elements ([rows, K] or [rows, K / 2], or transposed);
    `nibbles`: which nibble of a packed e2m1 byte holds the even element (the record's); `table`: the graph's
    own 16-entry value table, gathered by code at run time (a module buffer the record was verified to read)."""
    q = src if layout == "NK" else em.transpose(src)
    if not fmt.packed(elem):
        return em.convert(q, torch.float32)
    b = em.convert(as_u8_copy(em, q), torch.int32)
    lo = em.call(aten.bitwise_and.Scalar, b, 15)
    hi = em.call(aten.bitwise_right_shift.Tensor_Scalar, b, 4)
    even_odd = (lo, hi) if nibbles == "low_first" else (hi, lo)
    pair = [em.call(aten.unsqueeze.default, t, -1) for t in even_odd]  # (stack is decomposed by now)
    codes = em.reshape(em.call(aten.cat.default, pair, -1), [-1, k])
    if table is not None:
        values = em.convert(em.reshape(table, [-1]), torch.float32)
        return em.call(aten.index.Tensor, values, [em.convert(codes, torch.int64)])
    return _e2m1_values(em, codes, device)


def dequant(
    em: Emitter,
    q: fx.Node,
    q_layout: str,
    elem: str,
    s_src: fx.Node,
    s_layout: str,
    s_codes: fx.Node,
    s_assoc: str,
    rows: Any,
    k: int,
    dtype: torch.dtype,
    device: torch.device,
    nibbles: str = "low_first",
    special: dict[int, float] | None = None,
    table: fx.Node | None = None,
) -> fx.Node:
    """elements * block scales as a [rows, K] tensor of `dtype` (exact for bf16: 3-bit mantissas).

    A partial last block (K % 32): each element's scale is gathered by its block index k // 32. Not a
    zero-padded [rows, blocks, 32] product sliced back to K, nor `repeat_interleave(32)[:, :K]`: stock
    Inductor's CPU code for either (fused into a consumer) is wrong past column 32
    (tests/patterns/test_mx_special_codes.py::test_upstream_repeat_interleave_slice_bug).
    """
    cols = fmt.blocks(k)
    x = elements_f32(em, q, q_layout, elem, k, device, nibbles, table)
    if k % fmt.BLOCK:
        s = scale_f32(em, s_src, s_layout, s_codes, s_assoc, rows, cols, device, special)
        # prims.iota, not aten.arange: the pass runs after Inductor's decompositions, and a CUDA compile asserts
        # on an aten.arange node it then meets ("both a fallback and a decomp for same op")
        kk = em.call(
            torch.ops.prims.iota.default,
            k,
            start=0,
            step=1,
            dtype=torch.int64,
            device=device,
            requires_grad=False,
        )
        block = em.call(aten.bitwise_right_shift.Tensor_Scalar, kk, fmt.BLOCK.bit_length() - 1)
        return em.convert(em.call(aten.mul.Tensor, x, em.call(aten.index.Tensor, s, [None, block])), dtype)
    x = em.reshape(x, [-1, cols, fmt.BLOCK])
    s = scale_f32(em, s_src, s_layout, s_codes, s_assoc, rows, cols, device, special)
    return em.convert(em.reshape(em.call(aten.mul.Tensor, x, em.reshape(s, [-1, cols, 1])), [-1, k]), dtype)


def weight_dequant(em: Emitter, rec: QuantLinear, dtype: torch.dtype) -> fx.Node:
    d = rec.weight_mx
    assert d is not None
    return dequant(
        em, rec.weight, rec.weight_layout, d.elem, rec.weight_scale, d.scale_layout, d.scale_codes,
        d.scale_assoc, rec.n, rec.k, dtype, rec.device, d.nibbles, d.scale_special, d.table,
    )  # fmt: skip


def act_dequant(em: Emitter, rec: QuantLinear, dtype: torch.dtype) -> fx.Node:
    aq = rec.act_quant
    assert aq is not None and aq.mx is not None
    d = aq.mx
    return dequant(
        em, aq.x_q, "NK", d.elem, aq.x_scale, d.scale_layout, d.scale_codes, d.scale_assoc,
        rec.m, rec.k, dtype, rec.device, d.nibbles, d.scale_special,
    )  # fmt: skip


# What a quantize does between a copy and its data: views, casts and the scaling arithmetic.
_VIEWS_AND_POINTWISE = {
    *VIEW_OPS,
    aten.clamp_min.default,
    aten.clamp_max.default,
    aten.mul.Tensor,
    aten.div.Tensor,
    aten.where.self,
    prims.convert_element_type.default,
}


def transposed_source(q: fx.Node, depth: int = 24) -> bool:
    """Whether MX data `q` is computed elementwise from a transposed copy `clone(permute(src, [1, 0]))` (a
    training recipe's dim-1 cast: `to_mx(x.t().contiguous())`), following views, casts and the quantize's
    arithmetic up to `depth` nodes back; anything else (a graph input, a reduction) ends the search."""
    seen, frontier = set(), [q]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            if n in seen or not isinstance(n, fx.Node):
                continue
            seen.add(n)
            if n.target is aten.clone.default:
                src = n.args[0]
                return (
                    isinstance(src, fx.Node)
                    and src.target is aten.permute.default
                    and list(src.args[1]) == [1, 0]
                )
            if n.target in _VIEWS_AND_POINTWISE:
                nxt.extend(a for a in n.args if isinstance(a, fx.Node))
        frontier = nxt
    return False


def _in_source_order(em: Emitter, q: fx.Node, q_layout: str, dq: fx.Node) -> fx.Node:
    """`dq` (the decoded [rows, K] operand of data `q`) stored in the order of the tensor `q` was cast from.

    Inductor fuses the cast and the decode into one pointwise kernel. Stored as [rows, K], that kernel reads
    the source across its rows (a transpose it cannot tile: the loop is [rows, K / 32, 32]); stored in the
    source's order it reads and writes along one dimension, and the matmul takes the transposed view. On the
    training benchmark this took the MX step from 53.2 to 49.9 ms (BENCHMARKS.md, "MX training").
    """
    if q_layout != "NK" or not transposed_source(q):
        return dq  # stored [K, rows] ("KN"), `dequant` already writes [rows, K]: the source's order
    return em.transpose(em.contiguous(em.transpose(dq)))


def emit_emulated(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """Dequantize both operands in fused pointwise kernels, then the float matmul of the matched graph."""
    em = Emitter(graph, rec.output)
    dtype = rec.compute_dtype
    w = _in_source_order(em, rec.weight, rec.weight_layout, weight_dequant(em, rec, dtype))
    aq = rec.act_quant
    x = rec.x if aq is None else _in_source_order(em, aq.x_q, "NK", act_dequant(em, rec, dtype))
    core = em.call(aten.mm.default, x, em.transpose(w))
    return finish(em, rec, core)


def _swizzle(em: Emitter, codes_u8: fx.Node, rows: Any, cols: int) -> fx.Node:
    """[rows, cols] uint8 codes -> flat 128x4-tiled tensor (padded rows/cols get code 0), as float8_e8m0fnu."""
    cpad = fmt.round_up(cols, 4) - cols
    if isinstance(rows, int):
        rpad: Any = fmt.round_up(rows, 128) - rows
    else:
        r = em.call(aten.sym_size.int, codes_u8, 0)
        rpad = em.call(operator.mod, em.call(operator.neg, r), 128)
    t = em.call(aten.constant_pad_nd.default, codes_u8, [0, cpad, 0, rpad], 0)
    ct = (cols + cpad) // 4
    t = em.reshape(t, [-1, 4, 32, ct, 4])
    t = em.contiguous(em.call(aten.permute.default, t, [0, 3, 2, 1, 4]))
    return em.call(aten.view.dtype, em.reshape(t, [-1]), torch.float8_e8m0fnu)


def _swizzled_e8m0(
    em: Emitter, src: fx.Node, layout: str, codes: fx.Node, assoc: str, rows: Any, cols: int
) -> fx.Node:
    if layout == "swizzled":
        return em.call(aten.view.dtype, em.reshape(as_u8_view(em, src), [-1]), torch.float8_e8m0fnu)
    plain, _ = scale_codes(em, src, layout, codes, assoc, cols)
    return _swizzle(em, em.contiguous(plain), rows, cols)


def emit_scaled_mm(
    graph: fx.Graph, rec: QuantLinear, preference: KernelPreference = KernelPreference.AUTO
) -> fx.Node:
    """`aten._scaled_mm` (v1) with swizzled e8m0 block scales: the MX tensor-core GEMM of capability >= 10.

    v1, not `F.scaled_mm`: Inductor 2.13's `_scaled_mm_v2` lowering asserts NO_SWIZZLE, which MX needs.
    """
    aq = rec.act_quant
    assert aq is not None
    em = Emitter(graph, rec.output)
    d, ad, cols = rec.weight_mx, aq.mx, rec.k // fmt.BLOCK
    assert d is not None and ad is not None
    elem = d.elem
    mm_dtype = torch.float4_e2m1fn_x2 if fmt.packed(elem) else fmt.FP8_DTYPE[elem]
    a = em.contiguous(em.call(aten.view.dtype, as_u8_view(em, aq.x_q), mm_dtype))
    w_nk = rec.weight if rec.weight_layout == "NK" else em.transpose(rec.weight)
    b = em.transpose(em.contiguous(em.call(aten.view.dtype, as_u8_view(em, w_nk), mm_dtype)))
    sa = _swizzled_e8m0(em, aq.x_scale, ad.scale_layout, ad.scale_codes, ad.scale_assoc, rec.m, cols)
    sb = _swizzled_e8m0(em, rec.weight_scale, d.scale_layout, d.scale_codes, d.scale_assoc, rec.n, cols)
    core = em.call(aten._scaled_mm.default, a, b, sa, sb, None, None, rec.compute_dtype)
    return finish(em, rec, core)


def block_scale_bits(em: Emitter, rec: QuantLinear) -> fx.Node:
    """The weight's block scales as qlower's CUTLASS MXFP4 GEMM reads them (`kernels/cutlass/mxfp4.py`):
    [K/128, N, 4] bf16, 2 ** (code - 127) built from its bits (`code << 7`: exact, no float arithmetic that could
    flush 2 ** -127), with the record's meaning of the codes 0 and 255 (the spec's 2 ** -127 and NaN, or the
    graph's own 0.0 and +inf, which are the bits `code << 7` already give). `decode_codes` is the float32 twin."""
    d = rec.weight_mx
    assert d is not None
    n, cols = int(rec.n), int(rec.k) // fmt.BLOCK
    codes, swizzled = scale_codes(em, rec.weight_scale, d.scale_layout, d.scale_codes, d.scale_assoc, cols)
    if swizzled:
        codes = unswizzle(em, codes, n, cols)
    c = em.convert(codes, torch.int32)
    bits = em.call(aten.bitwise_left_shift.Tensor_Scalar, c, 7)
    for code, spec_bits in ((0, 0x0040), (fmt.E8M0_NAN, 0x7FC0)):
        if code not in d.scale_special:
            value = em.call(aten.scalar_tensor.default, spec_bits, dtype=torch.int32, device=rec.device)
            bits = em.call(aten.where.self, em.call(aten.eq.Scalar, c, code), value, bits)
    scales = em.call(aten.view.dtype, em.convert(bits, torch.int16), torch.bfloat16)
    quads = em.reshape(scales, [n, cols // 4, 4])
    return em.contiguous(em.call(aten.permute.default, quads, [1, 0, 2]))
