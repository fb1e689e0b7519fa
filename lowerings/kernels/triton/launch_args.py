"""Host-side helpers every Triton launcher here shares: grid arithmetic that works on SymInts, and scale or
bias vectors flattened for a kernel that reads them with one stride."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._higher_order_ops.cond import cond_op
from torch.fx.experimental.symbolic_shapes import statically_known_true


def cdiv(a: Any, b: int) -> Any:
    """ceil(a / b) for ints and SymInts (no guard: plain integer arithmetic)."""
    return (a + b - 1) // b


def is_static(x: Any) -> bool:
    """An int, or a SymInt that tracing has specialized to a constant."""
    return isinstance(x, int) or (isinstance(x, torch.SymInt) and x.node.is_constant())


def python_wrapper() -> bool:
    """Whether the compile generates Python's wrapper (not AOTInductor's or `cpp_wrapper`'s C++), where ops
    without a C shim (`custom_ops.PYTHON_RUNTIME_ONLY`) can run."""
    from torch._inductor import config as inductor_config
    from torch._inductor.virtualized import V

    return not (inductor_config.cpp_wrapper or getattr(V, "aot_compilation", False))


def m_range_gate(m: Any, lo: int, hi: int | None) -> Any:
    """1 iff lo <= m <= hi (hi None: no upper end), as SymInt arithmetic (no guard); None: provably 0.

    A dynamic-M launcher multiplies one launch's grid by it, so exactly one bucket's kernel runs, chosen on the
    host from the size (no device sync; capturable in CUDA graphs). "m > 1" is never taken as proof: tracing
    assumes a symbolic size >= 2 (0/1 specialization), yet the graph also runs at M = 1 where nothing recompiles
    (AOTInductor). Pruning the M == 1 bucket on that assumption left M = 1 with no launch at all (an unwritten
    output, seen on sm_90 through AOTInductor;
    tests/lowerings/kernels/test_mx_triton_interp.py::test_dynamic_m_buckets_cover_m1_under_the_size_assumption).
    """
    if statically_known_true(m < lo) or (hi is not None and hi >= 2 and statically_known_true(m > hi)):
        return None
    g = torch.sym_max(0, torch.sym_min(1, m - lo + 1))
    if hi is not None:
        g = g * torch.sym_max(0, torch.sym_min(1, hi + 1 - m))
    return g


# One M range of a host-branched launch: its largest M (None: no upper end) and what runs there, called with the
# operands as `branch_on_m` got them (None where an optional operand is absent)
Leaf = tuple[int | None, Callable[..., torch.Tensor]]


def branch_on_m(leaves: Sequence[Leaf], operands: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
    """Run the leaf whose M range holds M = operands[0].shape[0], chosen on the host: a balanced tree of
    `torch.cond(M <= split, ...)`, which Inductor generates as an `if` in the wrapper (Python or AOTInductor's
    C++), so a call launches only its leaf's kernels. Leaves are in increasing M order. A split the size
    assumptions decide is taken at trace time; every leaf must compute the right result at any M, so such a
    decision could only cost speed, never a wrong number. "M > 1" is not taken as proof (see `m_range_gate`):
    the M = 1 leaf stays for AOTInductor packages run at M = 1. `torch.cond` passes only tensors to a branch:
    the absent (None) operands are dropped for it and put back for the leaves.

    The HOP itself, not `torch.cond`: outside torch.compile, `torch.cond` traces its branches with Dynamo, which
    cannot trace Triton's launcher; under make_fx (qlower's emit) the HOP traces them with make_fx."""
    present = [i for i, t in enumerate(operands) if t is not None]

    def with_absent(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor | None, ...]:
        full: list[torch.Tensor | None] = [None] * len(operands)
        for i, t in zip(present, tensors, strict=True):
            full[i] = t
        return tuple(full)

    return _tree(leaves, tuple(operands[i] for i in present), with_absent)


def _tree(leaves: Sequence[Leaf], tensors: tuple[torch.Tensor, ...], with_absent: Callable) -> torch.Tensor:
    if len(leaves) == 1:
        return leaves[0][1](*with_absent(tensors))
    mid = len(leaves) // 2
    split = leaves[mid - 1][0]
    assert split is not None, "only the last leaf may have no upper end"
    m = tensors[0].shape[0]
    pred = m <= split
    if statically_known_true(pred):
        return _tree(leaves[:mid], tensors, with_absent)
    if split >= 2 and statically_known_true(m > split):
        return _tree(leaves[mid:], tensors, with_absent)
    # branches return 1-tuples, as `torch.cond` hands them to the HOP: Inductor zips a cond node's outputs
    # with its value (a bare tensor there was zipped row by row: an assertion in Conditional.create)
    (out,) = cond_op(
        pred,
        lambda *o: (_tree(leaves[:mid], o, with_absent),),
        lambda *o: (_tree(leaves[mid:], o, with_absent),),
        tensors,
    )
    return out


def flat(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A 1-D view and its stride: 0 for a per-tensor value, so the kernel reads one element for all."""
    v = t.reshape(-1)
    return v, (0 if v.numel() == 1 else v.stride(0))
