"""Build new aten nodes into a post-AOT FX graph with correct fake values.

Every node qlower adds carries `meta["val"]` (computed by running the op on the fake values of its inputs),
so Inductor's later passes and lowering see a graph as good as a traced one. Emitters (`lowerings/emit/`) and
graph canonicalization (`passes/canonicalize.py`) build their nodes with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch.utils._pytree import tree_flatten, tree_map

from qlower.patterns.graph_utils import aten, prims, tensor_val

# GraphModule.meta key marking the `torch.cond` branch graphs qlower emitted (QLowerPass leaves them alone)
EMITTED_BRANCH = "qlower_emitted"


class Emitter:
    """Inserts nodes before an anchor node and fills in their fake values.

    `mark`: tag each node as qlower's (`meta["qlower"]`), so the recognizers never take a lowering's output
    for a new candidate; graph canonicalization, whose nodes the recognizers must see, passes False.
    """

    def __init__(self, graph: fx.Graph, before: fx.Node, mark: bool = True) -> None:
        self.graph = graph
        self.before = before
        self.mark = mark

    def call(self, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
        with self.graph.inserting_before(self.before):
            node = self.graph.call_function(target, args, kwargs)
        fake_args, fake_kwargs = tree_map(_fake_of, (args, kwargs))
        fake_mode = detect_fake_mode(tree_flatten((fake_args, fake_kwargs))[0])
        if fake_mode is None:  # no tensor input (scalar_tensor, full) and no tracing context (AOTInductor)
            fake_mode = detect_fake_mode([_fake_of(n) for n in (self.before, *self.before.all_input_nodes)])
        if fake_mode is None:
            raise RuntimeError(f"qlower: no fake mode found for inputs of {target}")
        with fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        if self.mark:
            node.meta["qlower"] = True
        return node

    # Small vocabulary shared by all lowerings.
    def convert(self, node: fx.Node, dtype: torch.dtype) -> fx.Node:
        v = tensor_val(node)
        if v is not None and v.dtype == dtype:
            return node
        return self.call(prims.convert_element_type.default, node, dtype)

    def reshape(self, node: fx.Node, shape: list[Any]) -> fx.Node:
        return self.call(aten.reshape.default, node, shape)

    def contiguous(self, node: fx.Node) -> fx.Node:
        v = tensor_val(node)
        if v is not None and v.is_contiguous():
            return node
        return self.call(aten.clone.default, node, memory_format=torch.contiguous_format)

    def transpose(self, node: fx.Node) -> fx.Node:
        return self.call(aten.permute.default, node, [1, 0])


def _fake_of(x: Any) -> Any:
    return x.meta["val"] if isinstance(x, fx.Node) else x
