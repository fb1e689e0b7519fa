"""Work-arounds for Inductor bugs that qlower's emitted graphs would otherwise hit.

Each fix is applied once per process and wraps (never replaces) Inductor's own code, so behaviour for
already-working inputs does not change: a fix for an op only qlower emits when a lowering first emits it, the
fixes that concern any graph the pass is installed on (`apply_graph_fixes`) when a QLowerPass is made.
"""

from __future__ import annotations

import functools
from typing import Any

import sympy
import torch

aten = torch.ops.aten

# ATen's CPU `_weight_int8pack_mm` runs bf16 activations only where K is a multiple of this (else wrong numbers
# or SIGSEGV): qlower's CPU rule (devices/cpu.py) and the lowering fix below both read it.
INT8PACK_BF16_K_MULTIPLE = 16


def apply_graph_fixes() -> None:
    """The fixes for what any graph compiled with qlower's pass may hold, lowered by qlower or not: the matmul
    operands' strides, the `torch.cond` operands' strides, the C++ loop split of fused groups of unequal loop
    sizes (MX backward), and `_weight_int8pack_mm` (which stock Inductor's own woq pattern emits for a subgraph
    qlower leaves alone). Idempotent; QLowerPass calls it when it is made (`qlower.inductor_options()` makes
    one), not per graph."""
    fix_matmul_unit_strides()
    fix_cond_operand_strides()
    fix_cpp_loop_split_sizes()
    fix_int8pack_lowering()


@functools.cache
def fix_cond_operand_strides() -> None:
    """torch 2.11-2.13: Inductor's `torch.cond` lowering realizes its operands without fixing their layouts,
    while it lowers each branch with the operands' fake tensors as example inputs, and the branch function
    asserts its inputs have those strides. A computed operand (a pointwise result, a `clone` of a permuted
    view) takes whatever layout Inductor decides, which need not be its fake's: MXFP4's CUTLASS block scales,
    `permute(...).contiguous()` in the graph, reached a host branch as the permuted view ("expected size
    4==4, stride 4==1024"; tests/end_to_end/test_cond_operand_strides.py reproduces it with stock ops).
    Each tensor operand is required to have its fake's exact strides first, as the lowering already does for
    the branches' outputs."""
    from torch._inductor import ir, lowering
    from torch._inductor.virtualized import V

    op = torch.ops.higher_order.cond
    original = lowering.lowerings.get(op)
    if original is None or getattr(original, "_qlower_wrapped", False):
        return
    if not hasattr(ir.ExternKernel, "require_exact_strides"):
        return

    @functools.wraps(original)
    def cond_with_exact_operand_strides(pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> Any:
        fx_operands = V.graph.current_node.args[-1]
        if not isinstance(fx_operands, (list, tuple)) or len(fx_operands) != len(operands):
            return original(pred, true_fn, false_fn, operands)
        fixed = []
        for x, fx_x in zip(operands, fx_operands, strict=True):
            fake = fx_x.meta.get("val") if isinstance(fx_x, torch.fx.Node) else None
            if isinstance(x, ir.TensorBox) and isinstance(fake, torch.Tensor):
                x = ir.ExternKernel.require_exact_strides(x, fake.stride(), allow_padding=False)
            fixed.append(x)
        return original(pred, true_fn, false_fn, fixed)

    cond_with_exact_operand_strides._qlower_wrapped = True  # type: ignore[attr-defined]
    lowering.lowerings[op] = cond_with_exact_operand_strides


@functools.cache
def fix_int8pack_lowering() -> None:
    """torch 2.11-2.13: Inductor's `_weight_int8pack_mm` lowering binds `scale` without realizing it.

    A computed scale (e.g. `s.to(bf16)`) is still a Pointwise there and the extern call asserts
    (`unwrap_storage_for_input: AssertionError: <class 'torch._inductor.ir.Pointwise'>`). Realize it first.
    The lowering also sets no layout constraint on the weight, so a transposed-and-cloned weight can reach
    the kernel non-contiguous ("expect B to be contiguous"): require a contiguous weight.

    ATen's CPU kernel crashes (SIGSEGV) on bf16 activations with K % 16 != 0 (torch 2.13, an AVX512-BF16 CPU:
    K = 8, 24, 33, 40, 100; fp16 and fp32 run). qlower's own CPU rule never emits it there, but stock Inductor's
    woq pattern does, for `F.linear(x, w.to(bf16)) * s` with any K (`scripts/fuzz` seed 1579268955: a stock
    compile beside qlower's took the fuzz process down). Such a call runs as that formula instead: the int8
    weight converted, a matmul, the scale (`_int8pack_as_formula`).
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
        if _int8pack_crashes(x, w):
            return _int8pack_as_formula(x, w, scale)
        x, w, scale = dense_unit_strides(x), ir.ExternKernel.require_contiguous(w), realize_inputs(scale)
        return original(x, as_tensor_box(w), as_tensor_box(scale), *args, **kwargs)

    lowering_with_realized_scale._qlower_wrapped = True  # type: ignore[attr-defined]
    lowering.lowerings[op] = lowering_with_realized_scale


def _int8pack_crashes(x: Any, w: Any) -> bool:
    """Whether ATen's CPU `_weight_int8pack_mm` crashes on these operands: bf16 x on CPU, K not a known
    multiple of 16 (`fix_int8pack_lowering`)."""
    from torch._inductor.virtualized import V

    device = x.get_device()
    k = w.get_size()[-1]
    return (
        device is not None
        and device.type == "cpu"
        and x.get_dtype() == torch.bfloat16
        and not V.graph.sizevars.statically_known_true(sympy.Eq(sympy.Mod(k, INT8PACK_BF16_K_MULTIPLE), 0))
    )


def _int8pack_as_formula(x: Any, w: Any, scale: Any) -> Any:
    """`(x @ w.to(x.dtype).T) * scale` through Inductor's own lowerings: the formula stock's woq pattern matched."""
    from torch._inductor.lowering import lowerings

    convert = lowerings[torch.ops.prims.convert_element_type.default]
    wd = convert(w, x.get_dtype())
    mm = lowerings[aten.mm.default](x, lowerings[aten.permute.default](wd, [1, 0]))
    out = lowerings[aten.mul.Tensor](mm, scale)
    return out if out.get_dtype() == x.get_dtype() else convert(out, x.get_dtype())


def dense_unit_strides(x):
    """A 2-D operand whose size-1 dim has a stride below the other dim's size, re-viewed with that size.

    Inductor views a [1, 1, K] buffer as [1, K] with strides (0, 1). The memory it names is the same for any
    stride of a size-1 dim, but oneDNN takes that stride as the leading dimension: `_int_mm` read garbage
    there on an AVX512 Xeon (torch 2.11; rel err ~1e4 on torchao dynamic int8 at x
    [1, 1, K];
    tests/integrations/torchao/test_torchao_dynamic_int8.py::test_int_mm_operands_have_dense_leading_dims). A
    new view of the same storage (never a copy) with leading dimension K is what a dense [1, K] tensor has.
    """
    from torch._inductor import ir

    x = ir.ExternKernel.realize_input(x)
    return _restrided(x) or x


def _restrided(x: Any) -> Any:
    """`dense_unit_strides`'s new view of a realized operand, or None where its strides are already dense."""
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    if not isinstance(x, ir.ReinterpretView) or len(x.get_size()) != 2:
        return None
    known = V.graph.sizevars.statically_known_equals
    size, stride = list(x.get_size()), list(x.get_stride())
    for i, j in ((0, 1), (1, 0)):
        if known(size[i], 1) and known(stride[j], 1) and not known(stride[i], size[j]):
            stride[i] = size[j]
            layout = ir.FixedLayout(x.get_device(), x.get_dtype(), size, stride, x.layout.offset)
            return ir.ReinterpretView(data=x.data, layout=layout)
    return None


# The 2-D matmuls whose operands `fix_matmul_unit_strides` re-views, and the positions of their two matrices.
# `_int_mm` read garbage from a stride-0 leading dimension on AVX512 CPUs; the float GEMMs read such views right
# where measured (x86 CPUs), but hand the same leading dimension to oneDNN, MKL and cuBLAS(Lt), which document
# lda >= K: no matmul of a graph compiled with qlower gets one (scripts/fuzz/run.py `short_leading_dims`).
MATMUL_OPERANDS: dict[torch._ops.OpOverload, tuple[int, int]] = {
    aten._int_mm.default: (0, 1),
    aten.mm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten._scaled_mm.default: (0, 1),
}


@functools.cache
def fix_matmul_unit_strides() -> None:
    """Give the matrices of every 2-D matmul lowering (`MATMUL_OPERANDS`) dense leading dimensions
    (`dense_unit_strides`) on every device. Inductor's matmul lowerings realize their operands anyway, except
    `triton.native_matmul`'s, which fuses them as loads: left as it is."""
    from torch._inductor import lowering

    for op, positions in MATMUL_OPERANDS.items():
        original = lowering.lowerings.get(op)
        if original is not None and not getattr(original, "_qlower_wrapped", False):
            lowering.lowerings[op] = _with_dense_operands(original, positions)


def _with_dense_operands(original: Any, positions: tuple[int, int]) -> Any:
    """`original` with the operands at `positions` realized (as the matmul lowerings do first) and, where
    `_restrided` finds a short stride, replaced by the dense view; every other operand is passed as it came."""
    from torch._inductor import config as inductor_config
    from torch._inductor import ir

    def dense(x: Any) -> Any:
        view = _restrided(ir.ExternKernel.realize_input(x))
        return x if view is None else ir.TensorBox(view)

    @functools.wraps(original)
    def lowering_with_dense_operands(*args: Any, **kwargs: Any) -> Any:
        if not getattr(inductor_config.triton, "native_matmul", False):
            args = tuple(dense(a) if i in positions else a for i, a in enumerate(args))
        return original(*args, **kwargs)

    lowering_with_dense_operands._qlower_wrapped = True  # type: ignore[attr-defined]
    return lowering_with_dense_operands


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


@functools.cache
def fix_cpp_loop_split_sizes() -> None:
    """torch 2.11-2.13: the C++ backend's `try_loop_split` asserts on a fused group whose nodes have the
    same number of loop dims but different sizes (`AssertionError: ({y0: 128, y1: 2, y2: 32}, {y0: 64, y1: 4,
    y2: 32})`): it checks only the dims' count. torchao's MX training backward, lowered by qlower, fuses
    the decodes of its dgrad and wgrad operands (blocks along different dims) into such a group. The split is an optional vectorization aid: a group whose nodes disagree on their sizes is generated unsplit,
    as Inductor already does for the other incompatible groups (tests/end_to_end/test_mx_training.py)."""
    from torch._inductor.codegen.cpp import CppScheduling

    original = CppScheduling.try_loop_split
    if getattr(original, "_qlower_wrapped", False):
        return

    @functools.wraps(original)
    def try_loop_split_same_sizes(self, nodes):
        sizes = {tuple(node.node.get_default_sizes_body()[0][0]) for node in nodes}
        return nodes if len(sizes) > 1 else original(self, nodes)

    try_loop_split_same_sizes._qlower_wrapped = True  # type: ignore[attr-defined]
    CppScheduling.try_loop_split = try_loop_split_same_sizes
