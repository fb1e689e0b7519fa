"""What every family's recognizer does around a matmul: orient the stored weight, check an `addmm`'s bias, and
walk the epilogue after the product. One walk, so the families agree on what a view, a bias or a scale after
the matmul means (`graph_utils.epilogue_factor`); each family says only what it absorbs beyond the views.

Stopping early is always correct: what the walk does not consume stays in the graph, applied to the lowered
value. A node other nodes also read (a training graph's backward reads the matmul's product) ends the walk
too, unless the family still needs a factor after it (`walk_epilogue`'s `through_shared`): the walk then goes
on, and the rewrite leaves that node, and what it reads, in the graph for its other readers, so they read
exactly the values they read before (tests/end_to_end/test_dynamic_int8_training.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import (
    Factor,
    epilogue_factor,
    factor_kind,
    keeps_rows,
    tensor_val,
)


def stored_nk(weight: torch.Tensor, flips: int) -> tuple[Any, Any]:
    """(N, K) of a 2-D weight reached through `flips` transposes from the [K, N] matmul operand: an odd count
    means it is stored [N, K] (F.linear's layout, `weight_layout(flips)`)."""
    return (weight.shape[0], weight.shape[1]) if flips % 2 == 1 else (weight.shape[1], weight.shape[0])


def weight_layout(flips: int) -> str:
    """The record's `weight_layout` of an int8 weight `flips` transposes away from the [K, N] operand."""
    return "NK" if flips % 2 == 1 else "KN"


def site_bias(bias: Any, product: torch.Tensor, kinds: tuple[str, ...] = ("one", "col")) -> Any:
    """The source of the bias an `addmm` adds (None without one) when it is a node of kind `kinds` against
    the [M, N] product; else why not (`addmm(residual [M, N], x, w)` is not a bias)."""
    if bias is None:
        return None
    factor = factor_kind(bias, product)
    if factor is None or factor.kind not in kinds or not isinstance(factor.source, fx.Node):
        v = tensor_val(bias)
        return f"addmm adds a {list(v.shape) if v is not None else '?'} tensor, not a per-channel bias"
    return factor.source


@dataclass
class Epilogue:
    """What the walk after a matmul consumed; a family starts it with the facts its operands already gave."""

    output: fx.Node | None = None  # the last consumed node: the value a lowering replaces
    chain: list[fx.Node] = field(default_factory=list)  # consumed nodes, in walk order
    out_shape: list[Any] | None = None  # shape argument of the last view that keeps N
    bias: fx.Node | None = None
    row_scale: Any = None  # per-token (or per-tensor) factor
    col_scale: Any = None  # per-output-channel (or per-tensor) factor
    scale_operand: Any = None  # the multiply's operand that `col_scale` is (expands not stripped)
    cancelled_shift: bool = False  # dynamic_int8: the u8s8 compensation was consumed
    blocker: fx.Node | None = None  # the user a family named as what stopped it
    # consumed-through nodes (the matmul included) that other nodes also read: the rewrite keeps them
    shared: list[fx.Node] = field(default_factory=list)


Absorb = Callable[[fx.Node, fx.Node, Factor | None, Epilogue], list[fx.Node] | None]
"""A family's step: given the single user of the current node, that node, the user's proven factor (or None)
and the walk so far, record what the user means and return the nodes it consumes, or None to stop."""


def walk_epilogue(
    mm: fx.Node,
    m: Any,
    n: Any,
    absorb: Absorb,
    ep: Epilogue | None = None,
    through_shared: Callable[[Epilogue], bool] | None = None,
) -> Epilogue:
    """Walk the chain of users after `mm`: views that keep N (the N-D result's shape) for every family,
    anything else as `absorb` decides. `m` is the product's rows (per-row factors), `n` its last dim.

    A node with several users ends the walk unless `through_shared(ep)` says the family still needs a factor
    after it; then the walk takes its first user (in graph order) that `absorb` consumes, and records the
    node in `ep.shared`. Any choice is exact: the record describes what its output computes, and every
    other reader keeps reading the original node."""
    ep = ep if ep is not None else Epilogue()
    cur = mm
    while cur.users:
        shared = len(cur.users) > 1
        if shared and (through_shared is None or not through_shared(ep)):
            break
        step = _step(cur, m, n, absorb, ep)
        if step is None:
            break
        user, ep = step
        if shared:
            ep.shared.append(cur)
        cur = user
    ep.output = cur
    return ep


def _step(cur: fx.Node, m: Any, n: Any, absorb: Absorb, ep: Epilogue) -> tuple[fx.Node, Epilogue] | None:
    """The first user of `cur` (graph order) the walk consumes and the walk after it, or None (`ep.blocker`
    then names the first user `absorb` refused). A single user is tried on `ep` itself; several, each on a
    copy, since `absorb` records what it consumes."""
    users = sorted(cur.users)
    blocker = None
    for user in users:
        trial = ep if len(users) == 1 else replace(ep, chain=list(ep.chain), shared=list(ep.shared))
        factor = epilogue_factor(user, cur, m)
        if keeps_rows(user, n) and user.args[0] is cur:
            trial.out_shape = list(user.args[1])
            consumed: list[fx.Node] | None = [user]
        else:
            consumed = absorb(user, cur, factor, trial)
        if consumed is not None:
            trial.chain += consumed
            return user, trial
        blocker = blocker or trial.blocker
    ep.blocker = blocker
    return None
