"""How a symbolic M's per-range kernel choice runs: a fact of the record and the compile, read by both sides of a
lowering (the rules in `devices/` decide with it whether a lowering can run there, the emitters in `emit/` build
the branches or the gated launches), so no rule reads an emitter's module."""

from __future__ import annotations

import sympy
import torch

from qlower.patterns.graph_utils import is_static
from qlower.patterns.record import QuantLinear


def host_branches(rec: QuantLinear) -> bool:
    """Whether a symbolic M picks its kernel with a host `if` (`torch.cond`: one launch per call) rather than
    gated grids (one launch per M range, all but one empty). Inductor refuses CUDA graphs for a graph holding
    a `torch.cond` on CUDA tensors, so under CUDA graphs (`triton.cudagraphs`, which mode="reduce-overhead"
    sets) the gated form stays: a captured graph replays only the launch that ran. So does an M that is not
    one size symbol (a flattened [B, T, K] activation: M = B * T): a branch graph sees only its operands,
    whose sizes then do not define B and T (Inductor: "For 3*s77, expected [s77] to have been codegen-ed";
    tests/end_to_end/test_epilogue_forms.py's dynamic CUDA forms on sm_90)."""
    from torch._inductor import config as inductor_config

    if is_static(rec.m) or inductor_config.triton.cudagraphs:
        return False
    return isinstance(rec.m, torch.SymInt) and isinstance(rec.m.node.expr, sympy.Symbol)
