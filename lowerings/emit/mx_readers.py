"""What still reads MX decodes once the records are lowered: a training graph's grad_x through the weight's
dequantization, a linear left alone next to a lowered one, a bare e8m0 conversion. QLowerPass runs these after
every family: each reader gets qlower's own exact decode (`emit.mx`), so no e8m0 value and no miscompiled
decode spelling reaches Inductor (tests/end_to_end/test_mx_training.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from qlower.lowerings.emit.mx import act_dequant, as_u8_copy, decode_codes, weight_dequant
from qlower.lowerings.graph.builder import Emitter
from qlower.patterns.graph_utils import aten, graph_memo, is_static, prims, tensor_val
from qlower.patterns.record import QuantLinear

_LOWERED_DECODES = "mx_lowered_decodes"


def note_lowered(graph: fx.Graph, rec: QuantLinear) -> None:
    """Remember the verified decode multiplies of a lowered MX record, for `redecode_readers`."""
    memo = graph_memo(graph, _LOWERED_DECODES)
    aq = rec.act_quant
    for side, operand in (("weight", rec.weight_mx), ("act", aq.mx if aq is not None else None)):
        if operand is not None and operand.decoded is not None:
            memo[operand.decoded] = (rec, side)


def _shape_of(v: torch.Tensor) -> list[Any] | None:
    """`v`'s shape as a reshape argument: static sizes, -1 for one symbolic size; None for more than one."""
    shape = [int(s) if is_static(s) else -1 for s in v.shape]
    return shape if shape.count(-1) <= 1 else None


def redecode_readers(graph: fx.Graph) -> int:
    """Point what still reads a lowered record's decode multiply at qlower's own decode; returns how many.

    Those readers are what no recognizer lowered: a training graph's grad_x = grad_y @ dequant(w) (blocks along
    N), or a linear left alone next to a lowered one. The multiply's values are `dequant`'s (mx_verify ran it
    on every code, in the multiply's dtype), but its spelling may be miscompiled: torch 2.13 Inductor's C++
    loop split turns the partial block's `repeat_interleave(32)[:, :K]` into K // 32 whole blocks per row and
    never writes the rest, so fp16 grad_x read uninitialized columns (non-finite where eager is finite:
    tests/end_to_end/test_mx_training.py::test_backward_reads_the_exact_decode). The readers' own ops (a dtype
    convert after the multiply, the transpose) stay, so their rounding points are the graph's. Runs after
    every family: a weight two lowered linears share is read by none of them once both are lowered.
    """
    memo = graph_memo(graph, _LOWERED_DECODES)
    count = 0
    for mul, (rec, side) in list(memo.items()):
        mv = tensor_val(mul)
        if getattr(mul, "_erased", False) or not mul.users or mv is None or (shape := _shape_of(mv)) is None:
            continue
        em = Emitter(graph, mul)
        decode = weight_dequant if side == "weight" else act_dequant
        new = decode(em, rec, mv.dtype)
        nv = tensor_val(new)
        if nv is None or list(nv.shape) != list(mv.shape):
            new = em.reshape(new, shape)
        mul.replace_all_uses_with(new)
        _erase_unread(graph, [mul, *rec.nodes])
        count += 1
    memo.clear()
    return count


def _erase_unread(graph: fx.Graph, nodes: list[fx.Node]) -> None:
    """Erase those of `nodes` nothing reads any more, until none is left to erase."""
    pending = [
        n for n in dict.fromkeys(nodes) if n.op == "call_function" and not getattr(n, "_erased", False)
    ]
    while dead := [n for n in pending if not n.users]:
        for n in dead:
            graph.erase_node(n)
            pending.remove(n)


def legalize_e8m0(graph: fx.Graph) -> int:
    """Rewrite the e8m0 conversions left in a graph into `decode_codes` (exact); returns how many.

    What no recognizer lowered still reads e8m0 values: a backward's grad-input matmul through the weight's
    dequantization (its blocks run along N), or a decode a recognizer left alone. Inductor's C++ backend cannot
    even declare an e8m0 buffer (`KeyError: torch.float8_e8m0fnu`, stock `torch.compile` too), so such a graph
    would not compile (CPU graphs only). A float conversion becomes the bit decode of `qlower::mx_bytes`' copy (code 255 -> NaN,
    0 -> 2**-127: `c10::Float8_e8m0fnu`'s values) and a bitcast to uint8 / int8 becomes that copy
    (tests/end_to_end/test_mx_training.py).
    """
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        src, out = tensor_val(node.args[0]), tensor_val(node)
        if src is None or out is None or src.dtype != torch.float8_e8m0fnu or node.meta.get("qlower"):
            continue  # qlower's own emitters already spell e8m0 the way their device takes it
        # only the C++ backend is known to lack e8m0: other graphs stay as written
        if src.device.type != "cpu":
            continue
        em = Emitter(graph, node)
        converts = node.target in (prims.convert_element_type.default, aten._to_copy.default)
        if converts and out.dtype.is_floating_point and out.device == src.device:
            new = em.convert(decode_codes(em, node.args[0], src.device), out.dtype)
        elif node.target is aten.view.dtype and out.dtype in (torch.uint8, torch.int8):
            u8 = as_u8_copy(em, node.args[0])
            new = u8 if out.dtype == torch.uint8 else em.call(aten.view.dtype, u8, torch.int8)
        else:
            continue
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        count += 1
    return count
