"""Small helpers for walking aten FX graphs: which node is a view, a transpose, a dtype convert.

Recognizers stay readable when the graph vocabulary lives here, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten
prims = torch.ops.prims

# Where recognizers evaluate small probe subgraphs on real values (the host running the compiler). This
# is the only device patterns/ may name: it says where the *compiler* computes, never what a device supports.
HOST_DEVICE = torch.device("cpu")  # qlower: host-device

VIEW_OPS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
MUL_OPS = (aten.mul.Tensor,)
# Ops that only view, move or copy elements, never change a value: the layout steps between stored data and
# the matmul operand it becomes.
LAYOUT_OPS = (
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.permute.default,
    aten.t.default,
    aten.transpose.int,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.expand.default,
    aten.clone.default,
)
ADD_OPS = (aten.add.Tensor,)
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def val(node: Any) -> Any:
    """The fake value Inductor recorded for a node (None for non-nodes or missing meta)."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def tensor_val(node: Any) -> torch.Tensor | None:
    v = val(node)
    return v if isinstance(v, torch.Tensor) else None


def is_call(node: Any, targets: Iterable[Any]) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in tuple(targets)


def is_transpose_2d(node: Any) -> bool:
    """t(x), permute(x, [1, 0]) or transpose(x, 0, 1) on a 2-D tensor."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    v = tensor_val(node)
    if v is None or v.dim() != 2:
        return False
    if node.target is aten.t.default:
        return True
    if node.target is aten.permute.default:
        return list(node.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0])
    if node.target is aten.transpose.int:
        return sorted(d % 2 for d in node.args[1:3]) == [0, 1]
    return False


def convert_target_dtype(node: Any) -> torch.dtype | None:
    """The dtype a pure dtype-conversion node produces, or None if the node is not one."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    if node.target is prims.convert_element_type.default:
        return node.args[1]
    if node.target is aten._to_copy.default:
        extra = set(node.kwargs) - {"dtype", "layout", "device", "memory_format"}
        src, out = tensor_val(node.args[0]), tensor_val(node)
        if extra or src is None or out is None or src.device != out.device:
            return None
        return node.kwargs.get("dtype")
    return None


def has_single_user(node: fx.Node) -> bool:
    return len(node.users) == 1


EXPAND_OPS = (aten.expand.default,)


def strip_expand(x: Any) -> Any:
    """The tensor under any `expand`s: an expand only broadcasts, so its source carries the same meaning
    in far fewer elements (what a record stores and an emitter reshapes)."""
    while is_call(x, EXPAND_OPS):
        x = x.args[0]
    return x


@dataclass(frozen=True)
class Factor:
    """A scale, zero point or bias whose meaning against a [..., C] value is proven.

    kind: "one" (a scalar), "col" (one value per last-dim index, numel C), "row" (one value per leading
    index, last dim 1). `source` is the un-expanded node (or Python number) holding exactly those values.
    """

    kind: str
    source: Any


def factor_kind(factor: Any, like: torch.Tensor, rows: Any = None) -> Factor | None:
    """How `factor` broadcasts against `like` [..., C] (eager's right-aligned broadcasting), or None.

    A "row" factor must match every leading dim of `like` (and have numel `rows` when given): a [B, 1, 1]
    factor against [B, S, C] varies along B only, which is neither per row nor per channel.
    """
    if isinstance(factor, (int, float)) and not isinstance(factor, bool):
        return Factor("one", factor)
    source = strip_expand(factor)
    v = tensor_val(source)
    if v is None or v.dim() > like.dim():
        return None
    shape = [1] * (like.dim() - v.dim()) + list(v.shape)
    if not all(known_eq(s, 1) or known_eq(s, d) for s, d in zip(shape, like.shape, strict=True)):
        return None
    if known_eq(v.numel(), 1):
        return Factor("one", source)
    lead, last = shape[:-1], shape[-1]
    if known_eq(last, like.shape[-1]) and all(known_eq(s, 1) for s in lead):
        return Factor("col", source)
    same_rows = all(known_eq(s, d) for s, d in zip(lead, like.shape[:-1], strict=True))
    if known_eq(last, 1) and same_rows and (rows is None or known_eq(v.numel(), rows)):
        return Factor("row", source)
    return None


def keeps_rows(view: Any, n: Any) -> bool:
    """A view of the [M, N] matmul output (or of such a view) that keeps N as its last dim: it only regroups
    the M rows into leading dims, so per-row and per-channel factors after it keep their 2-D meaning. A view
    that splits N into heads ([B, S, H, D]) changes what a factor over its last dim means."""
    v = tensor_val(view)
    return is_call(view, VIEW_OPS) and v is not None and v.dim() >= 1 and known_eq(v.shape[-1], n)


def epilogue_factor(user: Any, cur: fx.Node, rows: Any) -> Factor | None:
    """The factor of `user` = cur * f or cur + f (alpha 1) when its meaning on the 2-D [M, N] matmul output is
    proven: `cur` is that output up to `keeps_rows` views, `user` has cur's shape (f does not broadcast it
    up), and f is a scalar, a per-channel (numel N) or a per-row (numel `rows`) factor."""
    if not is_call(user, (*MUL_OPS, *ADD_OPS)) or user.kwargs.get("alpha", 1) != 1 or len(user.args) != 2:
        return None
    a, b = user.args
    cv = tensor_val(cur)
    if (a is cur) == (b is cur) or cv is None:
        return None
    return factor_kind(b if a is cur else a, cv, rows)  # a factor never broadcasts cur up: same shape


def known_eq(a: Any, b: Any) -> bool:
    """a == b without adding shape guards (a pass after Dynamo must not specialize symbols)."""
    return bool(statically_known_true(a == b))


def is_static(x: Any) -> bool:
    return isinstance(x, int) or (isinstance(x, torch.SymInt) and x.node.is_constant())


def tensor_devices(*nodes: Any) -> set[torch.device]:
    """Devices of the non-scalar tensors among `nodes` (0-d tensors may live anywhere, as in eager)."""
    out = set()
    for n in nodes:
        v = tensor_val(n)
        if v is not None and v.dim() > 0:
            out.add(v.device)
    return out


@dataclass(frozen=True)
class MatmulSite:
    """A 2-D matmul in any of the spellings Inductor's decompositions leave: y [M, N] = x [M, K] @ w [K, N].

    `output` is the node producing y in the matmul's dtype; `nodes` are the nodes that make up the matmul.
    """

    kind: str  # "mm" | "addmm" | "matvec"
    output: fx.Node
    x: fx.Node
    operand: fx.Node
    bias: fx.Node | None
    nodes: tuple[fx.Node, ...]


def matmul_site(node: Any) -> MatmulSite | None:
    """`mm`, `addmm` (beta = alpha = 1), or the matrix-vector form `(x[:, :, None] * w[None]).sum(1)`.

    The last one is what Inductor's `mm` decomposition (torch/_inductor/decomposition.py, torch 2.11 and
    2.13 alike) emits for a statically known M == 1 (or N == 1) on the devices that decomposition names when
    `coordinate_descent_tuning` is on, which torchao's `quantize_` switches on process-wide; it is
    `pw_cast_for_opmath`, so with bf16/fp16 inputs both operands are upcast to fp32 and the sum is cast back.
    """
    if is_call(node, (aten.mm.default,)):
        x, w = node.args[:2]
        return MatmulSite("mm", node, x, w, None, (node,)) if isinstance(w, fx.Node) else None
    if is_call(node, (aten.addmm.default,)):
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return None
        bias, x, w = node.args[:3]
        return MatmulSite("addmm", node, x, w, bias, (node,)) if isinstance(w, fx.Node) else None
    if is_call(node, (aten.sum.dim_IntList,)) and has_single_user(node):
        if _decomposed_matvec(next(iter(node.users))) is not None:
            return None  # the sum of an upcast matvec: the convert after it is the site (one record, not two)
    return _decomposed_matvec(node)


_OPMATH = torch.float32  # what `pw_cast_for_opmath` computes bf16 / fp16 in
_WIDE = (torch.float32, torch.float64)  # product dtypes whose matvec is an mm: no product rounded to 16 bits
_UPCAST_EXACT = (torch.bfloat16, torch.float16)  # every value, inf / nan / subnormals too, is an fp32 value


def _upcast_source(node: Any, dtype: torch.dtype) -> fx.Node | None:
    """The `dtype` tensor that `node` upcasts to fp32 exactly, or None."""
    if dtype not in _UPCAST_EXACT or convert_target_dtype(node) != _OPMATH:
        return None
    src = node.args[0]
    v = tensor_val(src)
    return src if v is not None and v.dtype == dtype else None


def _decomposed_matvec(node: Any) -> MatmulSite | None:
    out = node
    total = node
    if convert_target_dtype(node) is not None:
        total = node.args[0]
    if not is_call(total, (aten.sum.dim_IntList,)) or list(total.args[1]) not in ([1], [-2]):
        return None
    if len(total.args) > 2 and total.args[2] or total.kwargs.get("keepdim") or total.kwargs.get("dtype"):
        return None
    prod = total.args[0]
    if not is_call(prod, MUL_OPS) or not has_single_user(prod):
        return None
    a, b = prod.args[:2]
    if not (is_call(a, (aten.unsqueeze.default,)) and is_call(b, (aten.unsqueeze.default,))):
        return None
    if a.args[1] == 0 and b.args[1] in (2, -1):
        a, b = b, a
    if a.args[1] not in (2, -1) or b.args[1] != 0:
        return None
    xa, wb = a.args[0], b.args[0]
    xv, wv, tv, ov = tensor_val(xa), tensor_val(wb), tensor_val(total), tensor_val(out)
    if xv is None or wv is None or tv is None or ov is None or not xv.dim() == wv.dim() == ov.dim() == 2:
        return None
    if not xv.dtype == wv.dtype == tv.dtype or tv.dtype not in _WIDE:
        return None  # mixed operands, or products rounded to 16 bits: no mm (Inductor's matvec is fp32)
    nodes = [out, total, prod, a, b] if out is not total else [total, prod, a, b]
    x = xa
    if xv.dtype != ov.dtype:
        # `pw_cast_for_opmath` of a bf16/fp16 mm: x and w exactly upcast from ov's dtype, the fp32 sum cast back.
        # That is the mm of the un-cast operands: fp32 products of bf16/fp16 values are exact (fp16 always;
        # bf16 within fp32's exponent range, which is also where an mm multiplies), and the fp32 accumulation
        # and one rounding are what mm does. So the site's x is the activation itself. Anything else (an fp32
        # matvec whose result the model casts down, say) is the site of its `sum`.
        x = _upcast_source(xa, ov.dtype)
        if x is None or _upcast_source(wb, ov.dtype) is None:
            return None
        nodes.append(xa)
    return MatmulSite("matvec", out, x, wb, None, tuple(nodes))


def bias_label(bias: Any) -> str:
    """The form's name for an absorbed add: "bias" for a vector (numel N, one dim), "residual" for a tensor of
    more dims whose rows are one because M is 1 (a decoder's residual stream at batch 1 is per channel by
    shape: absorbing it is exact, and the report says it was not a bias); "" for no add."""
    if bias is None:
        return ""
    v = tensor_val(bias)
    return "residual" if v is not None and v.dim() >= 2 else "bias"


def graph_memo(graph: fx.Graph, name: str) -> dict[Any, Any]:
    """A dict that lives as long as `graph` (an attribute on it): work memoized per graph, so nothing a compile
    learned (a preference, a device, a table) reaches another compile."""
    attr = f"_qlower_memo_{name}"
    memo = getattr(graph, attr, None)
    if memo is None:
        memo = {}
        setattr(graph, attr, memo)
    return memo


def differentiates(graph: fx.Graph) -> bool:
    """Whether `graph` is a training compile's joint graph: AOTAutograd tags the nodes it traced for the
    backward `partitioner_tag="is_backward"` (an inference graph has none). Memoized per graph."""
    memo = graph_memo(graph, "differentiates")
    if "answer" not in memo:
        memo["answer"] = any(n.meta.get("partitioner_tag") == "is_backward" for n in graph.nodes)
    return memo["answer"]
