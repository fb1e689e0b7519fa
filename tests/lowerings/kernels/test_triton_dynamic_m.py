"""A symbolic M through qlower's CUDA Triton kernels, checked on the CPU (CI).

The dynamic plan (every M covered once, by the kernel a static M there gets), the launches a symbolic M gets
against float64 at every bucket edge (Triton's interpreter, in a subprocess), and the graph a symbolic M's op
traces to: host-branched (`torch.cond`) or gated launches (CUDA graphs), taking each M's kernel, for the int8
kernels and MX weight-only. The numbers on a GPU: tests/end_to_end/test_dynamic_m_gpu.py.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from qlower.lowerings.devices import crossovers
from qlower.lowerings.kernels.triton import configs
from tests.helpers import run_python
from tests.helpers.triton_launches import kernel_launches, needs_triton

PLAN_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144), (4096, 28672), (1000, 520))
# and a few (K, N) the tables never saw, drawn once with a fixed seed (multiples of 8 and odd sizes alike)
_RNG = random.Random(18)
PLAN_SHAPES += tuple(
    (_RNG.choice((8, 1, 16)) * _RNG.randint(16, 2048), _RNG.randint(1, 40000)) for _ in range(4)
)


def _plans():
    for static, table, max_m in (
        (configs.woq_int8_config, configs.WOQ_INT8_TUNED, None),
        (configs.woq_int8_config, configs.WOQ_INT8_TUNED, crossovers.WOQ_INT8_TRITON_MAX_M),
        (configs.dynamic_int8_config, configs.DYNAMIC_INT8_TUNED, None),
    ):
        for k, n in PLAN_SHAPES:
            yield static, table, max_m, k, n, configs.dynamic_plan(static, table, k, n, max_m=max_m)


def test_dynamic_plan_covers_every_m_once_with_the_static_kernel():
    """A symbolic M's launch ranges tile 1..max_m (or 1..inf) with no gap and no overlap; each range runs the
    kernel a static M in it gets (the config of the bucket the device's table measured, split-K included), so
    a dynamic compile is the static compiles' kernels chosen at run time."""
    for static, table, max_m, k, n, plan in _plans():
        for m in range(1, 5000):
            hits = [cfg for lo, hi, cfg in plan if lo <= m and (hi is None or m <= hi)]
            assert len(hits) == (0 if max_m is not None and m > max_m else 1), (
                static.__name__,
                k,
                n,
                m,
                plan,
            )
            if not hits:
                continue
            want = static(m, k, n)
            if m == 1:  # never a larger bucket's tile, measured or not
                assert hits[0] == want, (static.__name__, k, n, str(hits[0]), str(want))
            if table.get((configs.m_bucket(m), k, n)) is not None:
                assert hits[0] == want, (static.__name__, k, n, m, str(hits[0]), str(want))
        assert plan[-1][1] == max_m, plan  # open-ended unless AUTO's crossover caps it


def test_dynamic_plan_keeps_the_static_split_k():
    """At 14336->4096, M 3..16 the static pick splits K in two; a symbolic M's range there runs the same split
    config (its own accumulator and a gated cast: `int8_ops._launch_all`), not an unsplit twin (7 % slower
    over a decoder step at b16 on the H200: BENCHMARKS.md, "Static and symbolic batch side by side")."""
    plan = configs.dynamic_plan(configs.woq_int8_config, configs.WOQ_INT8_TUNED, 14336, 4096)
    for m in (4, 16):
        (cfg,) = [c for lo, hi, c in plan if lo <= m <= (hi or 1 << 30)]
        assert cfg.split_k == 2 and cfg == configs.woq_int8_config(m, 14336, 4096), (m, str(cfg))


@needs_triton
def test_dynamic_m_launches_match_float64_at_bucket_edges():
    """Every M at a bucket boundary through the launches a symbolic M gets (gates evaluated at that M), woq-int8
    with and without AUTO's cuBLAS range above M = 256, and dynamic-int8, against float64 (interpreter, fp16)."""
    out = run_python(DYNAMIC_M_SCRIPT, env={"TRITON_INTERPRET": "1"})
    assert out.strip().endswith("ok"), out


DYNAMIC_M_SCRIPT = """
import torch
from qlower.lowerings.kernels.triton import configs
from qlower.lowerings.kernels.triton.int8 import ops

torch.manual_seed(0)
K, N = 64, 48
MS = (1, 2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 513)  # 513: the first M of the 513..1024 bucket
w = torch.randint(-128, 128, (N, K), dtype=torch.int8)
ws, b = torch.rand(N) + 0.5, torch.randn(N).to(torch.float16)

# every launch whose grid is not empty, by kernel name: each M must run exactly one range's kernel (every
# kernel is right at any M, so a launch that ignores its gate shows up here, not in the numbers)
launched = []
_wrap = ops.wrap_triton


def _recording(kernel):
    wrapped = _wrap(kernel)

    class Rec:
        def __getitem__(self, grid):
            if all(int(g) > 0 for g in grid):
                launched.append(getattr(kernel, "__name__", None) or kernel.fn.__name__)
            return wrapped[grid]

    return Rec()


ops.wrap_triton = _recording
HELPERS = ("x_limbs_kernel", "splitk_reduce_kernel")


def one_range(tag, m):
    main = [name for name in launched if name not in HELPERS]
    assert len(main) == 1, (tag, m, launched)
    launched.clear()


def check(tag):
    for dense in (0, 256):
        for m in MS:
            x = torch.randn(m, K, dtype=torch.float16)
            out = ops.launch_as_dynamic(x, w, ws, bias=b, dense_above=dense)
            one_range((tag, "woq", dense), m)
            r = x.double() @ w.double().T * ws.double() + b.double()
            err = ((out.double() - r).norm() / r.norm()).item()
            assert out.dtype == torch.float16 and out.shape == (m, N) and err < 3e-3, (tag, "woq", dense, m, err)
    for m in MS:
        xq, xs = torch.randint(-128, 128, (m, K), dtype=torch.int8), torch.rand(m, 1) / 127
        out = ops.launch_as_dynamic(xq, w, ws / 127, xs, b, torch.float16)
        one_range((tag, "dynamic_int8"), m)
        r = xq.double() @ w.double().T * xs.double() * (ws / 127).double() + b.double()
        err = ((out.double() - r).norm() / r.norm()).item()
        assert out.dtype == torch.float16 and out.shape == (m, N) and err < 3e-3, (tag, "dynamic_int8", m, err)


check("rules")
# M 2..16 split K in two (both families): the split range shares the output with the gated ranges around it
configs.WOQ_INT8_TABLE[(16, K, N)] = configs.mm(16, 32, 32, 4, 4, split_k=2, fast=2)
configs.DYNAMIC_INT8_TABLE[(16, K, N)] = configs.mm(16, 32, 32, 4, 4, split_k=2)
for static, table in ((configs.woq_int8_config, configs.WOQ_INT8_TUNED),
                      (configs.dynamic_int8_config, configs.DYNAMIC_INT8_TUNED)):
    plan = configs.dynamic_plan(static, table, K, N)
    assert [(lo, hi) for lo, hi, c in plan if c.split_k == 2] == [(2, 16)], plan
check("split-K")
# Every kind of launch as some range of a symbolic M (seeded random tables): each launcher must honour its
# gate, or a range that is off runs too (the int8-limb launch once ignored it: `one_range` catches that)
import random

C = configs
WOQ_POOL = [C.decode_fma(2, 16, 32), C.decode_dot(16, 16, 32), C.gemv(4, 16, 32), C.mm(16, 32, 32, 4, 4, fast=2),
            C.mm(32, 16, 32, 4, 4, swap=True, fast=3), C.mm(16, 32, 32, 4, 4, split_k=2, fast=2),
            C.limbs(16, 16, 32), C.tma(64, 64, 32, 4, 3, 2, fast=2)]
DYN_POOL = [C.mm(16, 32, 32, 4, 4), C.mm(32, 16, 32, 4, 4, swap=True), C.mm(16, 32, 32, 4, 4, split_k=2),
            C.tma(64, 64, 32, 4, 3, 2)]
kinds = set()
for seed in range(3):
    rng = random.Random(seed)
    for bucket in (1, 2, 4, 16, 64, 256, 1024):
        C.WOQ_INT8_TABLE[(bucket, K, N)] = rng.choice(WOQ_POOL)
        C.DYNAMIC_INT8_TABLE[(bucket, K, N)] = rng.choice(DYN_POOL)
    kinds |= {c.kernel + ("-split" if c.split_k > 1 else "")
              for lo, hi, c in C.dynamic_plan(C.woq_int8_config, C.WOQ_INT8_TUNED, K, N)}
    check(f"random table {seed}")
assert {"decode", "gemv", "mm", "mm-split", "limbs", "tma"} <= kinds, kinds
print("ok")
"""


def _traced_dynamic_m(fn, *args):
    """`fn` traced as qlower's emit traces it: M (args[0]'s dim 0) symbolic, every other size static."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())

    def ctx(a, first):
        dims = [DimDynamic.DYNAMIC if first and i == 0 else DimDynamic.STATIC for i in range(a.dim())]
        return StatelessSymbolicContext(dynamic_sizes=dims)

    fakes = [mode.from_tensor(a, symbolic_context=ctx(a, i == 0)) for i, a in enumerate(args)]
    with mode:
        return make_fx(dispatch_functionalize(fn, FunctionalTensorMode()), tracing_mode="real")(*fakes)


def _at(v, sym, m: int) -> int:
    """An int, or an fx node's SymInt value, at M = m."""
    val = v.meta["val"] if isinstance(v, torch.fx.Node) else v
    return int(val.node.expr.subs(sym, m)) if isinstance(val, torch.SymInt) else int(val)


def _leaf_at(gm, sym, m: int) -> list[tuple[str, dict]]:
    """The launches (kernel name, constant args) of the `torch.cond` leaf the graph runs at M = m."""
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    for node in gm.graph.nodes:
        if node.target is torch.ops.higher_order.cond:
            pred, true_gm, false_gm, _ = node.args
            taken = bool(pred.meta["val"].node.expr.subs(sym, m))
            return _leaf_at(getattr(gm, (true_gm if taken else false_gm).target), sym, m)
    return [
        (kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__,
         {**kernel_side_table.get_constant_args(n.kwargs["constant_args_idx"]), **n.kwargs["kwargs"],
          "grid": [_at(g, sym, m) for g in n.kwargs["grid"][0]]})
        for n in gm.graph.nodes if n.target is hop
    ]  # fmt: skip


@needs_triton
@pytest.mark.parametrize("family", ["woq_int8", "dynamic_int8"])
def test_host_branched_dynamic_m_takes_the_static_kernel_at_every_m(family):
    """The `torch.cond` form a symbolic M gets without CUDA graphs: at every M (bucket edges and between)
    the one leaf taken launches exactly the kernel and tile of M's range in the dynamic plan (the static
    compile's config where the table measured one: test_dynamic_plan_covers_every_m_once_...); woq-int8 under
    AUTO hands M > 256 to the dequantization + cuBLAS leaf. Its numbers are checked on the H200
    (tests/end_to_end/test_dynamic_m_gpu.py compiles in default mode) and each config's in the interpreter
    above."""
    from qlower.lowerings.kernels.triton.int8 import ops as int8_ops  # noqa: F401  (registers the triton_ops)
    from qlower.lowerings.kernels.triton.tuned import current_device_name

    k, n = 4096, 4096  # a tuned shape: the device table's entries, not only the rules
    device = current_device_name(torch.device("cpu"))
    w, ws = torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) + 0.5
    if family == "woq_int8":
        x = torch.randn(8, k, dtype=torch.bfloat16)
        gm = _traced_dynamic_m(
            lambda x, w, s: torch.ops.qlower.woq_int8_linear(x, w, s, None, 256, True), x, w, ws
        )
        plan = configs.dynamic_plan(configs.woq_int8_config, configs.WOQ_INT8_TUNED, k, n, device, 256)
    else:
        xq, xs = torch.randint(-128, 128, (8, k), dtype=torch.int8), torch.rand(8, 1)
        gm = _traced_dynamic_m(
            lambda xq, xs, w, s: torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, None, torch.bfloat16, True),
            xq, xs, w, ws,
        )  # fmt: skip
        plan = configs.dynamic_plan(configs.dynamic_int8_config, configs.DYNAMIC_INT8_TUNED, k, n, device)
    placeholder = next(nd for nd in gm.graph.nodes if nd.op == "placeholder")
    sym = placeholder.meta["val"].shape[0].node.expr
    names = {"decode": "woq_decode_kernel", "mm": "qlinear_mm_kernel", "gemv": "woq_int8_gemv_kernel",
             "tma": "_mm_tma_dev_kernel"}  # fmt: skip
    for m in (1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 128, 129, 255, 256, 257, 512, 513, 2000):
        leaf = _leaf_at(gm, sym, m)
        if family == "woq_int8" and m > 256:
            assert [name for name, _ in leaf] == ["woq_dequant_kernel"], (m, leaf)
            continue
        (cfg,) = [c for lo, hi, c in plan if lo <= m and (hi is None or m <= hi)]
        if cfg.kernel == "tma":  # CPU tensors: the launcher's fallback tile (TMA needs a CUDA device)
            cfg = configs.TMA_FALLBACK
        assert len(leaf) == 1 and leaf[0][0].endswith(names[cfg.kernel]), (m, cfg, leaf)
        consts = leaf[0][1]
        assert (consts["BLOCK_M"], consts["BLOCK_N"], consts["BLOCK_K"]) == (
            cfg.block_m, cfg.block_n, cfg.block_k), (m, cfg, consts)  # fmt: skip


@needs_triton
@pytest.mark.parametrize("host_branch", [False, True])
def test_a_batch_bounded_below_the_crossover_builds_no_cublas_range(host_branch):
    """An M known to stay <= 256 (an export `Dim(max=200)`; here `torch._check`) gets no dequantization +
    cuBLAS range: no dequant kernel, no GEMM, in either form (gated launches or the host `if`)."""
    from qlower.lowerings.kernels.triton.int8 import ops as int8_ops  # noqa: F401  (registers the triton_ops)

    k, n = 64, 48
    w, ws = torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) + 0.5

    def bounded(x, w, s):
        torch._check(x.shape[0] <= 200)
        return torch.ops.qlower.woq_int8_linear(x, w, s, None, 256, host_branch)

    gm = _traced_dynamic_m(bounded, torch.randn(8, k, dtype=torch.bfloat16), w, ws)
    graphs = [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    launched = [name for g in graphs for name in kernel_launches(g)]
    assert launched and "woq_dequant_kernel" not in launched, launched
    assert not any(nd.target in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
                   for g in graphs for nd in g.graph.nodes), gm.graph  # fmt: skip


@needs_triton
@pytest.mark.parametrize("k, n", [(4096, 4096), (4096, 14336), (14336, 4096), (1056, 4256)])
def test_gated_mx_weight_only_runs_one_bucket_at_every_m(k, n):
    """The CUDA-graph form of `qlower::mx_linear` (MXFP4 weight-only, bf16 x: gated launches into one output):
    at every M exactly one bucket's kernel has a non-empty grid (a split-K reduce aside), the one
    `mx_ops.pick_weight_only` names. Where N <= K two buckets (M 65-128, 129+) dequantize for cuBLAS; only the
    first one's gate used to reach that shared launch, and M > 128 got an all-zero output on the H200
    (tests/lowerings/kernels/test_mx_gpu.py::test_dynamic_m_matches_float64_at_every_bucket_edge). Those
    buckets run inside `qlower::mxfp4_dense` (dequantize + cuBLAS chosen at run time, the gate its argument):
    there the op's gate is 1 and no tile kernel runs."""
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    e2m1 = mx_ops.ELEM_CODE["e2m1"]
    w, codes = (
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
        torch.full((n, k // 32), 127, dtype=torch.uint8),
    )
    gm = _traced_dynamic_m(
        lambda x, w, s: torch.ops.qlower.mx_linear(x, None, w, s, None, 0, e2m1, False, False, torch.bfloat16, False),
        torch.randn(8, k, dtype=torch.bfloat16), w, codes,
    )  # fmt: skip
    assert not any(nd.target is torch.ops.higher_order.cond for nd in gm.graph.nodes), gm.graph
    sym = next(nd for nd in gm.graph.nodes if nd.op == "placeholder").meta["val"].shape[0].node.expr
    kernel = {"hfma": "mx_hfma", "bf16mm": "mx_bf16_mm_kernel", "bf16dq": "mx_bf16_dequant_kernel"}
    seen = set()
    for m in (1, 2, 3, 4, 5, 15, 16, 17, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000, 5000):
        running = [name for name, args in _leaf_at(gm, sym, m)
                   if math.prod(args["grid"]) > 0 and name != "splitk_reduce_kernel"]  # fmt: skip
        cfg = mx_ops.pick_weight_only(m, e2m1, k, n, torch.bfloat16)
        seen.add(cfg.kernel)
        dense_gates = [_at(nd.args[-1], sym, m) for nd in gm.graph.nodes
                       if nd.target is torch.ops.qlower.mxfp4_dense.default]  # fmt: skip
        if cfg.kernel == "bf16dq":
            assert running == [] and dense_gates == [1], (k, n, m, running, dense_gates)
            continue
        assert all(g == 0 for g in dense_gates), (k, n, m, dense_gates)
        assert len(running) == 1 and kernel[cfg.kernel] in running[0], (k, n, m, cfg.kernel, running)
    assert {"hfma", "bf16mm", "bf16dq"} <= seen, seen


@needs_triton
def test_host_branched_mx_weight_only_takes_the_static_kernel_at_every_m():
    """The same for `qlower::mx_linear` (MXFP4 weight-only, bf16 x): each M's leaf is its bucket's config
    (`mx_ops.pick_weight_only`: the f16x2 GEMV to M = 2, `mx_bf16`'s tiles above, split-K with its reduce,
    then its dequantize kernel before cuBLAS), and the M = 1 leaf also serves M = 0 with an empty grid."""
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    k, n, e2m1 = 4096, 4096, mx_ops.ELEM_CODE["e2m1"]
    w, codes = (
        torch.randint(0, 256, (n, k // 2), dtype=torch.uint8),
        torch.full((n, k // 32), 127, dtype=torch.uint8),
    )
    x = torch.randn(8, k, dtype=torch.bfloat16)
    gm = _traced_dynamic_m(
        lambda x, w, s: torch.ops.qlower.mx_linear(x, None, w, s, None, 0, e2m1, False, False, torch.bfloat16, True),
        x, w, codes,
    )  # fmt: skip
    sym = next(nd for nd in gm.graph.nodes if nd.op == "placeholder").meta["val"].shape[0].node.expr
    assert mx_ops.bf16_decodes(torch.bfloat16, e2m1)  # compiled Triton: not the interpreter
    seen = set()
    for m in (0, 1, 2, 3, 4, 5, 16, 17, 32, 33, 64, 65, 128, 129, 300):
        launches = _leaf_at(gm, sym, m)
        cfg = mx_ops.pick_weight_only(max(m, 1), e2m1, k, n, torch.bfloat16)
        seen.add(cfg.kernel)
        kernel = {"hfma": "mx_hfma", "bf16mm": "mx_bf16_mm_kernel", "bf16dq": "mx_bf16_dequant_kernel"}
        name, args = launches[0]
        assert kernel[cfg.kernel] in name, (m, name)
        if cfg.kernel != "bf16dq":
            assert (args["BLOCK_M"], args["BLOCK_N"]) == (cfg.block_m, cfg.block_n), (m, name)
            assert (args["grid"][0] * args["grid"][1] * args["grid"][2] == 0) == (m == 0), (m, args["grid"])
        reduce = [nm for nm, _ in launches[1:]]
        assert reduce == (["splitk_reduce_kernel"] if cfg.split_k > 1 else []), (m, reduce)
    assert seen == {"hfma", "bf16mm", "bf16dq"}
