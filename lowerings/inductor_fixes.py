"""Work-arounds for Inductor bugs that qlower's emitted graphs would otherwise hit.

Each fix is applied lazily, once, only when a lowering emits the op it concerns, and wraps (never replaces)
Inductor's own lowering so behaviour for already-working inputs does not change.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten


@functools.cache
def fix_int8pack_lowering() -> None:
    """torch 2.11-2.13: Inductor's `_weight_int8pack_mm` lowering binds `scale` without realizing it.

    A computed scale (e.g. `s.to(bf16)`) is still a Pointwise there and the extern call asserts
    (`unwrap_storage_for_input: AssertionError: <class 'torch._inductor.ir.Pointwise'>`). Realize it first.
    The lowering also sets no layout constraint on the weight, so a transposed-and-cloned weight can reach
    the kernel non-contiguous ("expect B to be contiguous"): require a contiguous weight.
    """
    from torch._inductor import ir, lowering
    from torch._inductor.select_algorithm import realize_inputs

    op = aten._weight_int8pack_mm.default
    original = lowering.lowerings.get(op)
    if original is None or getattr(original, "_qlower_wrapped", False):
        return

    def as_tensor_box(node):  # the CPP GEMM template's epilogue calls `expand` on the scale: TensorBox only
        return node if isinstance(node, ir.TensorBox) else ir.TensorBox(node)

    @functools.wraps(original)
    def lowering_with_realized_scale(x, w, scale, *args, **kwargs):
        w, scale = ir.ExternKernel.require_contiguous(w), realize_inputs(scale)
        return original(x, as_tensor_box(w), as_tensor_box(scale), *args, **kwargs)

    lowering_with_realized_scale._qlower_wrapped = True  # type: ignore[attr-defined]
    lowering.lowerings[op] = lowering_with_realized_scale


@functools.cache
def fake_qlinear_prepack() -> None:
    """torch 2.13: `onednn::qlinear_prepack` has no fake implementation. Freezing runs a fake-tensor
    propagation over the graph before it constant-folds the prepack, so a prepack emitted before freezing
    (qlower's pass runs there) fails with UnsupportedOperatorException. Describe its output (the packed
    weight, [K, N] int8) so propagation passes; constant folding then runs the real op once."""
    op = torch.ops.onednn.qlinear_prepack.default
    if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
        return
    try:
        torch.library.register_fake("onednn::qlinear_prepack")(_qlinear_prepack_fake)
    except RuntimeError:  # registered already (by a newer torch or another library)
        pass


def _qlinear_prepack_fake(weight: torch.Tensor, x_shape: list[int] | None = None) -> torch.Tensor:
    return weight.new_empty((weight.shape[1], weight.shape[0]))
