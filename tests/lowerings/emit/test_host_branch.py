"""`branch_on_m` (lowerings/kernels/triton/launch_args.py) through qlower's emit route and Inductor, on CPU: the
`torch.cond` tree qlower emits for a symbolic M without CUDA graphs must lower (its branch graphs adopted by the
outer module, skipped by the joint passes that re-run on new subgraphs), generate a host `if` on the size, and
take the leaf of each M. The Triton leaves themselves run on the H200
(tests/end_to_end/test_dynamic_m_gpu.py); here each leaf is an aten matmul with its own offset, so a wrong
branch shows in the numbers."""

from __future__ import annotations

import re

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import run_and_get_code

from qlower.lowerings.graph.builder import EMITTED_BRANCH, Emitter
from qlower.lowerings.graph.triton_inline import emit_traced
from qlower.lowerings.kernels.triton.launch_args import branch_on_m

LEAVES = [(1, lambda x, w: x @ w + 1), (16, lambda x, w: x @ w + 2), (None, lambda x, w: x @ w + 3)]


def _offset(m: int) -> int:
    return 1 if m <= 1 else 2 if m <= 16 else 3


class _BranchEveryMM(CustomGraphPass):
    """Each aten.mm becomes the cond tree, emitted as qlower emits its Triton lowerings."""

    def __init__(self) -> None:
        self.graphs_seen = 0

    def __call__(self, graph: fx.Graph) -> None:
        self.graphs_seen += 1
        if graph.owning_module.meta.get(EMITTED_BRANCH):
            return
        for node in list(graph.nodes):
            if node.target is torch.ops.aten.mm.default and not node.meta.get("qlower"):
                out = emit_traced(
                    Emitter(graph, node), lambda x, w: branch_on_m(LEAVES, (x, w)), list(node.args)
                )
                node.replace_all_uses_with(out)
                graph.erase_node(node)

    def uuid(self) -> str:
        return "qlower-test-branch-every-mm"


def test_cond_tree_lowers_and_takes_each_ms_leaf():
    torch._dynamo.reset()
    hook = _BranchEveryMM()
    compiled = torch.compile(
        lambda x, w: torch.relu(x @ w), dynamic=True, options={"joint_custom_pre_pass": hook}
    )
    w = torch.randn(8, 4, dtype=torch.float64)
    x = torch.randn(5, 8, dtype=torch.float64)
    out, code = run_and_get_code(compiled, x, w)
    assert re.search(r"\bif [su]\d+ <= 16:", "\n".join(code)), code
    for m in (2, 5, 16, 17, 40, 5):
        x = torch.randn(m, 8, dtype=torch.float64)
        torch.testing.assert_close(compiled(x, w), torch.relu(x @ w + _offset(m)), rtol=0, atol=1e-12)
    assert hook.graphs_seen >= 3  # the outer graph, then the branch graphs it created, which it left alone
