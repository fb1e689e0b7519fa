"""Graph canonicalization before matching: linears that reach the graph as a `bmm` become the `mm` they are.

Why: `torch.einsum("mk,nk->mn", x, w)` (or "bsk,nk->bsn") reaches the joint graph as a `bmm` with batch 1
between chains of unsqueeze / permute / view, and its output goes through another such chain. Every family's
recognizer starts from `mm` / `addmm` (`graph_utils.matmul_site`), so the quantized weight behind an einsum
was never seen. This rewrite turns such a `bmm` into `mm(x2d, w)` with plain views around it, which is the
same arithmetic (one 2-D product, batch 1) and the form the recognizers know; it only touches a `bmm` whose
second operand is computed in the graph (a dequantized weight), never one between two graph inputs.

The same holds for `F.linear` on a 3-D activation that is not viewable as [B*S, K] (transposed, or expanded
with stride 0): Inductor's decomposition then multiplies `bmm(x, w2d.expand(B, K, N))`, one 2-D weight shared by
every batch entry. That is `mm(x.reshape(B*S, K), w2d)` viewed back to [B, S, N] (`shared_weight_bmm_to_mm`).

On GPUs with `coordinate_descent_tuning` on (torchao's `quantize_` turns it on) Inductor's `bmm` decomposition
turns a batch-1 einsum at M = 1 into a 4-D matvec, `sum(a[..., None] * b[:, None], 2)`; it becomes the 2-D
matvec the `mm` decomposition leaves, the same fp32 products and sum (`batch1_matvec_to_matvec`).

Export's `aten._assert_tensor_metadata` checks go first (`drop_metadata_asserts`): no-ops to Inductor, but
extra users in the middle of the chains the recognizers walk.

A producer library's own op whose arithmetic is proven (`patterns/producers.py`: optimum-quanto's
`quanto::qbytes_mm`) becomes the aten form its family records (`decompose_producer_ops`), where that family
is enabled: the recognizers then lower it like any other linear.

Layout chains are followed through view / reshape / unsqueeze / squeeze and permutes. A chain is a pure
reshape when no permute reorders dimensions of size other than 1; the weight side may also swap its two
non-unit dimensions (the `nk` spelling: w transposed).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import torch
from torch import fx

from qlower.lowerings.graph.builder import Emitter
from qlower.patterns import FAMILIES, dynamic_int8, producers
from qlower.patterns.graph_utils import (
    MUL_OPS,
    aten,
    convert_target_dtype,
    is_call,
    is_static,
    known_eq,
    prims,
    tensor_val,
)

_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_UNIT_DIM_OPS = (aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
_PERMUTES = (aten.permute.default, aten.t.default, aten.transpose.int)
_LAYOUT = _VIEWS + _UNIT_DIM_OPS + _PERMUTES


def _shape(node: Any) -> list[Any] | None:
    v = tensor_val(node)
    return list(v.shape) if v is not None else None


def _nonunit(shape: list[Any]) -> list[int]:
    """Positions of the dimensions not statically of size 1."""
    return [i for i, s in enumerate(shape) if not known_eq(s, 1)]


def _perm_of(node: fx.Node, rank: int) -> list[int]:
    if node.target is aten.permute.default:
        return [d % rank for d in node.args[1]]
    if node.target is aten.t.default:
        return [1, 0][:rank]
    d0, d1 = (d % rank for d in node.args[1:3])
    perm = list(range(rank))
    perm[d0], perm[d1] = d1, d0
    return perm


def _labels_after(node: fx.Node, labels: list[int] | None) -> list[int] | None | bool:
    """How `node` maps its input's non-unit dimensions (labels, in order) to its output's.

    Returns the output's labels; None for "a pure reshape whose dimensions no longer match one to one"
    (only allowed while the order is still the identity); False when the op breaks the chain.
    """
    src, out = _shape(node.args[0]), _shape(node)
    if src is None or out is None:
        return False
    if node.target in _PERMUTES:
        perm = _perm_of(node, len(src))
        order = [perm[j] for j in _nonunit(out)]  # input positions of the output's non-unit dimensions
        positions = _nonunit(src)
        if sorted(order) != positions:
            return False
        if labels is None:
            return None if order == positions else False
        return [labels[positions.index(p)] for p in order]
    # view / reshape / unsqueeze / squeeze keep the element order: the labels survive if the non-unit sizes do
    before, after = [src[i] for i in _nonunit(src)], [out[i] for i in _nonunit(out)]
    same = len(before) == len(after) and all(known_eq(a, b) for a, b in zip(before, after, strict=True))
    if labels is not None and same:
        return labels
    if labels is None or labels == sorted(labels):
        return None
    return False


def _trace(operand: fx.Node) -> tuple[fx.Node, str] | None:
    """(source, "reshape" | "transpose") when `operand` is the source reshaped, or its 2-D transpose reshaped."""
    chain: list[fx.Node] = []
    cur = operand
    while isinstance(cur, fx.Node) and is_call(cur, _LAYOUT):
        chain.append(cur)
        cur = cur.args[0]
    src_shape = _shape(cur)
    if not isinstance(cur, fx.Node) or src_shape is None:
        return None
    labels: list[int] | None = list(range(len(_nonunit(src_shape))))
    for node in reversed(chain):
        nxt = _labels_after(node, labels)
        if nxt is False:
            return None
        labels = nxt  # type: ignore[assignment]
    if labels is None or labels == sorted(labels):
        return cur, "reshape"
    return (cur, "transpose") if labels == [1, 0] else None


def _tensor_users(node: fx.Node) -> list[fx.Node]:
    """Users other than `sym_size` reads (export keeps a chain node's size as such a node)."""
    return [u for u in node.users if u.target is not aten.sym_size.int]


def _pure_reshape_end(start: fx.Node) -> tuple[fx.Node, list[fx.Node]]:
    """The last node of the pure-reshape layout chain after `start` whose nodes have one tensor user each, and
    the chain (start first)."""
    end, labels, chain = start, None, [start]
    while len(_tensor_users(end)) == 1:
        (user,) = _tensor_users(end)
        if not is_call(user, _LAYOUT) or user.args[0] is not end:
            break
        nxt = _labels_after(user, labels)
        if nxt is False:
            break
        labels, end = nxt, user  # type: ignore[assignment]
        chain.append(end)
    return end, chain


def _redirect_size_reads(em: Emitter, chain: list[fx.Node], mm: fx.Node) -> None:
    """Point `sym_size` reads of the replaced chain at the equal dimension of `mm`, so the chain can die."""
    sizes = _shape(mm) or []
    for node in chain:
        for user in [u for u in node.users if u.target is aten.sym_size.int]:
            dims = [d for d, s in enumerate(sizes) if known_eq(s, user.meta.get("val"))]
            if dims:
                user.replace_all_uses_with(em.call(aten.sym_size.int, mm, dims[0]))


def _batch1_bmm(graph: fx.Graph, bmm: fx.Node) -> bool:
    a, b = bmm.args[:2]
    av, bv = _shape(a), _shape(b)
    if av is None or bv is None or len(av) != 3 or not known_eq(av[0], 1) or not known_eq(bv[0], 1):
        return False
    m, k, n = av[1], av[2], bv[2]
    operands = _batch1_operands(a, b, k, n)
    if operands is None:
        return False
    x_src, w_src, w_kind = operands
    em = Emitter(graph, bmm, mark=False)  # the recognizers must see these nodes
    x2d = _activation_2d(em, x_src, a, m, k)
    w2d = em.call(aten.permute.default, w_src, [1, 0]) if w_kind == "transpose" else w_src
    _replace_3d_result(graph, em, bmm, em.call(aten.mm.default, x2d, w2d), a, m, n)
    return True


def _batch1_operands(a: Any, b: Any, k: Any, n: Any) -> tuple[fx.Node, fx.Node, str] | None:
    """(x's source, the weight's 2-D source, "reshape" | "transpose") when `a` is a [1, M, K] view of the
    activation (its shape arguments are reused for x's 2-D view) and `b` [1, K, N] a 2-D weight computed in
    the graph, reshaped or transposed; else None."""
    if not (is_call(a, _VIEWS) and len(a.args[1]) == 3):
        return None
    ta, tb = _trace(a), _trace(b)
    if ta is None or tb is None or ta[1] != "reshape" or tb[0].op != "call_function":
        return None
    w_src, w_kind = tb
    if not _same_shape(_shape(w_src), [n, k] if w_kind == "transpose" else [k, n]):
        return None
    return ta[0], w_src, w_kind


def _activation_2d(em: Emitter, x_src: fx.Node, view3d: fx.Node, m: Any, k: Any) -> fx.Node:
    """x [M, K]: `x_src` itself when it has that shape, else its reshape to the 3-D view's last two sizes (a
    copy only if x is not viewable)."""
    xs = _shape(x_src)
    if xs is not None and len(xs) == 2 and known_eq(xs[0], m) and known_eq(xs[1], k):
        return x_src
    return em.call(aten.reshape.default, x_src, list(view3d.args[1])[1:])


def _replace_3d_result(
    graph: fx.Graph, em: Emitter, old: fx.Node, new2d: fx.Node, view3d: fx.Node, m: Any, n: Any
) -> None:
    """Replace `old` ([1, M, N]) and the pure-reshape chain after it by `new2d` ([M, N]): the chain's end when
    that is [M, N], a reshape with the end's own shape arguments, or else `old` alone by a [1, M, N] view."""
    end, chain = _pure_reshape_end(old)
    es = _shape(end)
    if es is not None and len(es) == 2 and known_eq(es[0], m) and known_eq(es[1], n):
        new_end = new2d
    elif end is not old and is_call(end, _VIEWS):  # emitted next to `end`: its shape arguments exist there
        new_end = Emitter(graph, end, mark=False).call(aten.reshape.default, new2d, list(end.args[1]))
    else:  # the chain ends in an op without shape arguments (squeeze, say): keep it, replace `old` alone
        end = old
        new_end = em.call(aten.reshape.default, new2d, [1, *list(view3d.args[1])[1:2], n])
    end.replace_all_uses_with(new_end)
    _redirect_size_reads(em, chain, new2d)


def _batch1_matvec(graph: fx.Graph, total: fx.Node) -> bool:
    """Inductor's `bmm` decomposition of a batch-1, M = 1 einsum under `coordinate_descent_tuning` (GPUs):
    `sum(a[..., None] * b[:, None], 2)` with a [1, 1, K], b [1, K, N], both upcast to fp32 when bf16 / fp16
    (`pw_cast_for_opmath`) and the sum cast back. Rewritten as the 2-D form the `mm` decomposition leaves,
    `sum(x[:, :, None] * w[None], 1)` over the same fp32 operands (the same products and sum over K), which
    `graph_utils.matmul_site` takes as a matvec. Only for a weight computed in the graph, as `_batch1_bmm`."""
    if list(total.args[1]) not in ([2], [-2]) or len(total.args) > 2 or total.kwargs:
        return False
    prod = total.args[0]
    if not is_call(prod, MUL_OPS) or len(prod.users) != 1:
        return False
    ua, ub = prod.args[:2]
    if not (is_call(ua, (aten.unsqueeze.default,)) and is_call(ub, (aten.unsqueeze.default,))):
        return False
    if ua.args[1] not in (-1, 3) or ub.args[1] != 1 or len(ua.users) != 1 or len(ub.users) != 1:
        return False
    a, b = ua.args[0], ub.args[0]
    av, bv = _shape(a), _shape(b)
    if av is None or bv is None or len(av) != 3 or len(bv) != 3:
        return False
    if not (known_eq(av[0], 1) and known_eq(bv[0], 1) and known_eq(av[1], 1) and known_eq(av[2], bv[1])):
        return False
    upcast = convert_target_dtype(a)
    if upcast != convert_target_dtype(b):
        return False
    a0, b0 = (a.args[0], b.args[0]) if upcast is not None else (a, b)
    k, n = av[2], bv[2]
    operands = _batch1_operands(a0, b0, k, n)
    if operands is None:
        return False
    x_src, w_src, w_kind = operands
    user = next(iter(total.users)) if len(total.users) == 1 else None
    out = user if convert_target_dtype(user) is not None else total  # the cast back to the operands' dtype
    em = Emitter(graph, total, mark=False)  # the recognizers must see these nodes
    x2d = _activation_2d(em, x_src, a0, 1, k)
    w2d = em.call(aten.permute.default, w_src, [1, 0]) if w_kind == "transpose" else w_src
    if upcast is not None:
        x2d = em.call(prims.convert_element_type.default, x2d, upcast)
        w2d = em.call(prims.convert_element_type.default, w2d, upcast)
    prod2d = em.call(
        aten.mul.Tensor, em.call(aten.unsqueeze.default, x2d, 2), em.call(aten.unsqueeze.default, w2d, 0)
    )
    new = em.call(aten.sum.dim_IntList, prod2d, [1])
    if out is not total:
        new = Emitter(graph, out, mark=False).call(prims.convert_element_type.default, new, out.args[1])
    _replace_3d_result(graph, em, out, new, a0, 1, n)
    return True


def batch1_matvec_to_matvec(graph: fx.Graph) -> int:
    """Rewrite every decomposed batch-1 matvec `bmm` (`_batch1_matvec`) as the decomposed 2-D `mm`; returns
    how many."""
    return _rewrite_each(graph, aten.sum.dim_IntList, _batch1_matvec)


def _expanded_2d(operand: Any) -> fx.Node | None:
    """w2d when `operand` is a 2-D tensor computed in the graph, expanded to [B, K, N] (views of that shape
    around the expand allowed), so that every batch entry multiplies the same matrix."""
    out = _shape(operand)
    cur = operand
    while is_call(cur, _VIEWS) and _same_shape(_shape(cur.args[0]), out):
        cur = cur.args[0]
    if not is_call(cur, (aten.expand.default,)) or out is None or len(out) != 3:
        return None
    src = cur.args[0]
    if is_call(src, (aten.unsqueeze.default,)) and src.args[1] == 0:
        src = src.args[0]
    ss, traced = _shape(src), _trace(src)
    if ss is None or len(ss) != 2 or not _same_shape(ss, out[1:]) or traced is None:
        return None
    return src if traced[0].op == "call_function" else None  # a float weight input stays a bmm


def _same_shape(a: list[Any] | None, b: list[Any] | None) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(map(known_eq, a, b))


def _shared_weight_bmm(graph: fx.Graph, bmm: fx.Node) -> bool:
    a, b = bmm.args[:2]
    av, bv = _shape(a), _shape(b)
    w2d = _expanded_2d(b)
    if w2d is None or av is None or bv is None or len(av) != 3:
        return False
    n = b.args[1][2] if is_call(b, _VIEWS) and len(b.args[1]) == 3 else bv[2]
    if not isinstance(n, (int, fx.Node)):
        return False
    em = Emitter(graph, bmm, mark=False)  # the recognizers must see these nodes
    # the activation's [B, S, K] shape arguments (symbols included) are reused for the 2-D and output views;
    # an activation without them (a graph input, say) has its sizes read where they are symbolic
    if is_call(a, _VIEWS) and len(a.args[1]) == 3:
        batch, rows, k = list(a.args[1])
    else:
        batch, rows, k = (s if is_static(s) else em.call(aten.sym_size.int, a, i) for i, s in enumerate(av))
    x2d = em.call(aten.reshape.default, a, [-1, k])  # a copy where x is not viewable (what bmm read)
    mm = em.call(aten.mm.default, x2d, w2d)
    bmm.replace_all_uses_with(em.call(aten.reshape.default, mm, [batch, rows, n]))
    return True


def _rewrite_each(graph: fx.Graph, target: Any, rewrite: Any) -> int:
    """Apply `rewrite(graph, node) -> bool` to every call of `target`; dead code goes; returns how many."""
    done = sum(bool(rewrite(graph, n)) for n in list(graph.nodes) if is_call(n, (target,)))
    if done:
        graph.eliminate_dead_code()
    return done


def shared_weight_bmm_to_mm(graph: fx.Graph) -> int:
    """Rewrite every `bmm` of a 3-D activation and one expanded in-graph 2-D weight as `mm`; returns how many."""
    return _rewrite_each(graph, aten.bmm.default, _shared_weight_bmm)


def converts_above_expands(graph: fx.Graph) -> int:
    """`convert(expand(s))` -> `expand(convert(s))`: the same values (a dtype convert is elementwise), but the
    expand now sits on top, where recognizers strip it to the small tensor whose meaning they prove (a
    per-channel scale written `s[:, None].expand(N, K).to(x.dtype)`). Returns how many."""
    return _rewrite_each(graph, prims.convert_element_type.default, _convert_above_expand)


def _convert_above_expand(graph: fx.Graph, node: fx.Node) -> bool:
    expand = node.args[0]
    if not is_call(expand, (aten.expand.default,)):
        return False
    em = Emitter(graph, node, mark=False)
    small = em.call(prims.convert_element_type.default, expand.args[0], node.args[1])
    node.replace_all_uses_with(em.call(aten.expand.default, small, list(expand.args[1])))
    return True


def drop_metadata_asserts(graph: fx.Graph) -> int:
    """Erase every `aten._assert_tensor_metadata` node; returns how many.

    `torch.export` keeps one after each `.to(...)` of the model (torchao's quantized linears have several),
    and there they are extra users of the matmul and its epilogue: a recognizer's single-user walk stops at
    them (torchao's dynamic int8 under export was left alone, "no per-token activation scale",
    tests/integrations/torchao/test_torchao_export.py). They check dtype / device / layout that the graph's
    fake values already fix, Inductor lowers them to nothing (`torch/_inductor/lowering.py`) and its post-grad
    `remove_assert_ops` erases them all anyway; doing it first changes no value.
    """
    asserts = list(graph.find_nodes(op="call_function", target=aten._assert_tensor_metadata.default))
    for node in asserts:
        graph.erase_node(node)
    return len(asserts)


def canonicalize(graph: fx.Graph, families: Collection[str] = tuple(FAMILIES)) -> int:
    """Every rewrite of this module, in order; returns how many `bmm`s became `mm` (or a 2-D matvec). Producer ops are
    decomposed for the enabled `families` only: a family that is off leaves the producer's kernel."""
    drop_metadata_asserts(graph)
    decompose_producer_ops(graph, families)
    converts_above_expands(graph)
    return einsum_to_mm(graph) + shared_weight_bmm_to_mm(graph) + batch1_matvec_to_matvec(graph)


class _Recording(Emitter):
    """An Emitter (unmarked: the recognizers must see its nodes) that keeps the nodes it made, to erase them
    when the family does not record what they compute."""

    def __init__(self, graph: fx.Graph, before: fx.Node) -> None:
        super().__init__(graph, before, mark=False)
        self.made: list[fx.Node] = []

    def call(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().call(target, *args, **kwargs)
        self.made.append(node)
        return node


def _size(em: Emitter, node: fx.Node, dim: int) -> Any:
    """Dimension `dim` of `node`: an int, or a `sym_size` node where it is symbolic (a graph argument)."""
    v = tensor_val(node)
    assert v is not None
    s = v.shape[dim]
    return s if is_static(s) else em.call(aten.sym_size.int, node, dim % v.dim())


def _rows_2d(em: Emitter, x: fx.Node) -> fx.Node:
    """x [..., K] as [M, K] (itself when 2-D)."""
    v = tensor_val(x)
    return x if v is not None and v.dim() == 2 else em.call(aten.reshape.default, x, [-1, _size(em, x, -1)])


def _rows_nd(em: Emitter, y: fx.Node, x: fx.Node) -> fx.Node:
    """y [M, N] as x's leading dims + [N] (itself when x is 2-D)."""
    v = tensor_val(x)
    assert v is not None
    if v.dim() == 2:
        return y
    return em.call(aten.reshape.default, y, [*(_size(em, x, i) for i in range(v.dim() - 1)), _size(em, y, 1)])


def _weight_only(em: Emitter, f: producers.ProducerLinear) -> fx.Node:
    """The op's definition for a float activation (patterns/producers.py `_qbytes_mm`):
    mm(x.to(dt), (w.to(dt) * s).t()), woq_int8's scale on the weight. The convert of int8 is exact and the
    product rounds once, as eager's `s * w` (a commuted multiply is the same value)."""
    x = em.convert(_rows_2d(em, f.x), f.out_dtype)
    w = em.call(aten.mul.Tensor, em.convert(f.weight, f.out_dtype), f.scale)
    return _rows_nd(em, em.call(aten.mm.default, x, em.transpose(w)), f.x)


def _int8_product(em: Emitter, f: producers.ProducerLinear) -> fx.Node:
    """int8 activation and weight: `_int_mm(x, w.t())` (exact int32), in fp32 times the activation's scale 1
    (quanto folded it into `s`: an exact multiply, the per-tensor scale dynamic_int8's record needs) and
    `s.t()`, rounded once to `s`'s dtype: the op's own int8 kernel, operation for operation."""
    x = _rows_2d(em, f.x)
    acc = em.call(
        prims.convert_element_type.default,
        em.call(aten._int_mm.default, x, em.transpose(f.weight)),
        torch.float32,
    )
    y = em.call(
        aten.mul.Tensor, em.call(aten.mul.Tensor, acc, 1.0), em.call(aten.reshape.default, f.scale, [1, -1])
    )
    return _rows_nd(em, em.convert(y, f.out_dtype), f.x)


# family -> (builder, whether that family records the built form at its matmul: checked before the producer's
# kernel is replaced, so a form the recognizer turns down keeps the producer's own kernel and its row)
_BUILDERS: dict[
    str, tuple[Callable[[Emitter, producers.ProducerLinear], fx.Node], Callable[[fx.Node], bool] | None]
] = {
    # the op's definition: correct on every device as aten, so Inductor may compute it if woq_int8 declines
    "woq_int8": (_weight_only, None),
    # `_int_mm` left to Inductor has shape rules of its own on some devices: only where dynamic_int8 records it
    "dynamic_int8": (_int8_product, dynamic_int8.describes),
}


def decompose_producer_ops(graph: fx.Graph, families: Collection[str] = tuple(FAMILIES)) -> int:
    """Replace every call of a known producer op (`producers.KNOWN`) whose form is proven, and whose family
    is in `families`, by that aten form; returns how many. The rest stay, and get a row naming the op
    (patterns/unclaimed.py)."""
    done = 0
    for node in list(graph.nodes):
        found = producers.known_linear(node)
        if not isinstance(found, producers.ProducerLinear) or found.family not in families:
            continue
        build, records = _BUILDERS[found.family]
        em = _Recording(graph, node)
        new = build(em, found)
        anchor = next((n for n in em.made if is_call(n, (aten.mm.default, aten._int_mm.default))), None)
        if records is not None and (anchor is None or not records(anchor)):
            for made in reversed(em.made):
                graph.erase_node(made)
            continue
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        done += 1
    return done


def einsum_to_mm(graph: fx.Graph) -> int:
    """Rewrite every batch-1 `bmm` of a (reshaped) activation and an in-graph weight as `mm`; returns how many."""
    return _rewrite_each(graph, aten.bmm.default, _batch1_bmm)
