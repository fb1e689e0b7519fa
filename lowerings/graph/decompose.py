"""Inline the Python implementation of `quantized_decomposed` ops that Inductor would run as fallbacks.

PT2E graphs quantize activations with `quantized_decomposed.choose_qparams_per_token*` and
`quantize_per_token`. Inductor has no lowering for them: they run as opaque Python kernels (no fusion, and
AOTInductor would need its proxy executor). Tracing their own implementation into aten ops keeps the
numerics bit-for-bit those of eager while letting Inductor fuse the quantize prologue.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode

from qlower.lowerings.graph.builder import Emitter


def _fallback_impl(node: fx.Node) -> Any:
    """The Python implementation of `node`'s op when it is a quantized_decomposed op Inductor cannot lower."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    if target.namespace != "quantized_decomposed":
        return None
    from torch._inductor import lowering

    # Inductor adds a fallback handler to `lowerings` the first time a compile meets an op it cannot lower: a
    # later compile in the process must still see that op as a fallback (else it runs the op opaquely, with
    # its meta function's dtypes: choose_qparams_per_token's says float64 where the kernel returns float32,
    # and the generated code read float32 scales as doubles;
    # tests/end_to_end/test_dynamic_int8_numerics.py::test_pt2e_inlined_after_a_stock_compile_met_its_ops).
    handler = lowering.lowerings.get(target)
    if handler is not None and not (
        getattr(handler, "_is_fallback_handler", False) or target in getattr(lowering, "fallbacks", ())
    ):
        return None
    from torch.ao.quantization.fx import _decomposed

    return getattr(_decomposed, target._schema.name.split("::")[-1], None)


def _splice(em: Emitter, gm: fx.GraphModule, inputs: list[fx.Node]) -> Any:
    """Copy a traced graph's nodes into `em`'s graph, placeholders bound to `inputs`; returns its outputs."""
    env: dict[fx.Node, Any] = {}
    it = iter(inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
            env[node] = em.call(node.target, *args, **kwargs)
        elif node.op == "output":
            return fx.node.map_arg(node.args[0], lambda n: env[n])
        else:
            raise RuntimeError(f"qlower: unexpected {node.op} in a traced decomposition")
    raise RuntimeError("qlower: traced decomposition has no output")


def materialize(em: Emitter, node: Any, memo: dict[fx.Node, Any] | None = None) -> Any:
    """`node`'s value computed by Inductor-lowerable ops: fallback quantized_decomposed producers are traced
    from their Python implementation (getitem of a tuple-returning one included); other nodes are kept."""
    if not isinstance(node, fx.Node):
        return node
    memo = {} if memo is None else memo
    if node in memo:
        return memo[node]
    if node.op == "call_function" and node.target is operator.getitem:
        parent = node.args[0]
        if isinstance(parent, fx.Node) and _fallback_impl(parent) is not None:
            memo[node] = materialize(em, parent, memo)[node.args[1]]
            return memo[node]
        return node
    impl = _fallback_impl(node)
    if impl is None:
        memo[node] = node
        return node
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    tensor_inputs = [a for a in node.args if isinstance(a, fx.Node)]
    new_inputs = [materialize(em, a, memo) for a in tensor_inputs]
    positions = [i for i, a in enumerate(node.args) if isinstance(a, fx.Node)]
    constants = list(node.args)

    def call(*tensors: torch.Tensor) -> Any:
        args = list(constants)
        for i, t in zip(positions, tensors, strict=True):
            args[i] = t
        return impl(*args, **node.kwargs)

    fakes = [n.meta["val"] for n in new_inputs]
    with detect_fake_mode(fakes) or contextlib.nullcontext():
        gm = make_fx(call, decomposition_table=select_decomp_table())(*fakes)
    memo[node] = _splice(em, gm, new_inputs)
    return memo[node]
