"""The structure of a small subgraph as a hashable key: what running it on given leaves depends on.

Why: the MX recognizer proves each decode's meaning by running its subgraph on probe codes
(`mx_verify.verify`), the costliest step of matching (BENCHMARKS.md, "compile seconds"). A model's linears
decode alike, so a verification is keyed by this structure and run once per graph
(`tests/patterns/test_mx_patterns.py::test_decode_verified_once_per_structure`). The key holds every input of
the run: each node's op, its arguments (other nodes by position, named leaves by name), its dtype and concrete
shape, and the values of the constants and sizes it reads from outside.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import fx

from qlower.patterns.graph_utils import tensor_val


class _Uncacheable(Exception):
    pass


def tensor_key(t: torch.Tensor) -> Hashable:
    """A host tensor by dtype, shape and bytes."""
    data = t.detach().reshape(-1).contiguous().view(torch.uint8)
    return ("tensor", t.dtype, tuple(t.shape), data.numpy().tobytes())


def structure_key(
    nodes: Sequence[fx.Node],
    leaves: dict[fx.Node, Hashable],
    outside: Callable[[fx.Node], Any],
    hint: Callable[[Any], Any],
) -> Hashable | None:
    """Key of running `nodes` (in order) with `leaves` bound; `outside(node)` is the value a run reads for any
    other node it meets (a host tensor, an int) or None where it has none (then no key: None). Shapes are
    `hint`ed (a symbolic size by its hint, as the run sees it)."""
    index = {n: i for i, n in enumerate(nodes)}

    def enc(a: Any) -> Hashable:
        if isinstance(a, fx.Node):
            if a in index:
                return ("node", index[a])
            if a in leaves:
                return ("leaf", leaves[a])
            v = outside(a)
            if isinstance(v, torch.Tensor):
                return tensor_key(v)
            if v is None:
                raise _Uncacheable(a.name)
            return ("value", type(v).__name__, repr(v))
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(enc(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple(sorted((k, enc(v)) for k, v in a.items())))
        if isinstance(a, torch.SymInt):
            return ("value", "int", repr(hint(a)))
        return ("value", type(a).__name__, repr(a))

    def meta(n: fx.Node) -> Hashable:
        v = tensor_val(n)
        return None if v is None else (v.dtype, tuple(int(hint(s)) for s in v.shape))

    try:
        return (
            tuple((str(n.target), enc(n.args), enc(n.kwargs), meta(n)) for n in nodes),
            tuple(sorted((str(name), meta(leaf)) for leaf, name in leaves.items())),
        )
    except _Uncacheable:
        return None
