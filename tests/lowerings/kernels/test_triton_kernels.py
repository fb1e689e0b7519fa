"""qlower's CUDA Triton kernels (woq-int8, dynamic-int8).

CPU (CI): the kernels' indexing and masking under TRITON_INTERPRET=1 in a subprocess (the variable must be set
before Triton is imported; bf16 is broken in the interpreter, so fp32/fp16/int8), the graph the lowering emits
(kernel launches, not an opaque op), and that qlower imports without Triton. GPU (`pytest -m gpu tests/`):
numerics vs float64 on shapes off the tile grid, and torch.compile / AOTInductor calling the kernels.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import subprocess
import sys
import textwrap

import pytest
import torch

import qlower
from qlower import testing
from qlower.lowerings.devices import crossovers
from qlower.lowerings.kernels.triton import configs
from qlower.lowerings.kernels.triton.configs import decode_dot, mm
from qlower.lowerings.preference import KernelPreference
from qlower.patterns import FAMILIES
from tests.forms.woq_int8 import WoqLinear
from tests.helpers import ROOT, SUBPROCESS_TIMEOUT_S
from tests.helpers.aoti_cuda import needs_cuda_package_load

HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
TESTS = ROOT / "tests"  # the subprocesses' working directory
KERNEL_NAMES = ("qlinear_mm_kernel", "woq_int8_gemv_kernel", "woq_decode_kernel")


def _run_python(script: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        cwd=TESTS,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


# ------------------------------------------------------------------------------------------------ CPU
INTERPRETER_SCRIPT = """
import torch
from qlower.lowerings.kernels.triton.int8 import ops
from qlower.lowerings.kernels.triton.configs import decode_dot, decode_fma, gemv, limbs, mm, tma

torch.manual_seed(0)

def ref(a, w, ws, xs, b):
    r = a.double() @ w.double().T * ws.double().reshape(1, -1)
    if xs is not None:
        r = r * xs.double().reshape(-1, 1)
    return r if b is None else r + b.double()

WOQ = [gemv(1, 16, 32), gemv(2, 8, 32, split_k=2), gemv(4, 16, 16, fast=0), mm(16, 16, 32, swap=True),
       mm(16, 32, 16), mm(32, 16, 32, split_k=3),
       # woq_decode_kernel: cvt 2 (inline PTX) runs as cvt 1 here (ops._conversion_here), the same kernel otherwise
       decode_fma(1, 16, 32), decode_fma(1, 8, 64, acc3=True), decode_fma(2, 16, 16), decode_dot(16, 16, 32),
       decode_dot(16, 32, 16, stages=1),
       # woq_limbs: x as three int8 digit planes (its row split and its int8 GEMM)
       limbs(16, 16, 32), limbs(16, 32, 16, 4, 2)]
DYN = [mm(16, 16, 32, swap=True), mm(16, 32, 16), mm(32, 16, 32, split_k=2)]
SHAPES = [(1, 40, 24), (3, 70, 33), (17, 64, 48)]  # K, N off the tile grid; M past one tile
for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
    for m, k, n in SHAPES:
        for cfg in WOQ:
            x = torch.randn(m, k, dtype=dt)
            w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
            w_kn = torch.randint(-128, 128, (k, n), dtype=torch.int8)
            ws, b = torch.rand(n) + 0.5, torch.randn(n).to(dt)
            for weight, bias, scale in ((w, None, ws), (w_kn.t(), b, ws[:1])):  # strided weight, per-tensor scale
                out = ops.launch_config(cfg, x, weight, scale, bias=bias)
                r = ref(x, weight, scale, None, bias)
                err = ((out.double() - r).norm() / r.norm()).item()
                assert out.dtype == dt and out.shape == (m, n) and err < tol, (dt, m, k, n, str(cfg), err)
for m, k, n in SHAPES:
    for cfg in DYN:
        xq = torch.randint(-128, 128, (m, k), dtype=torch.int8)
        xs, w, ws, b = torch.rand(m, 1) / 127, torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) / 127, torch.randn(n)
        out = ops.launch_config(cfg, xq, w, ws, xs, b, torch.float16)
        r = ref(xq, w, ws, xs, b)
        err = ((out.double() - r).norm() / r.norm()).item()
        assert out.dtype == torch.float16 and err < 2e-3, (m, k, n, str(cfg), err)
# the persistent TMA kernel (K % 16 == 0, as TMA needs): ragged M and N, more tiles than programs
for m, k, n, cfg in ((40, 80, 56, tma(16, 16, 32)), (17, 64, 48, tma(16, 32, 16, progs_per_sm=2))):
    xq = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    xs, w, ws, b = torch.rand(m, 1) / 127, torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) / 127, torch.randn(n)
    out = torch.empty(m, n)
    ops._launch_tma(cfg, xq, w, ws, xs, b, out)
    r = ref(xq, w, ws, xs, b)
    assert ((out.double() - r).norm() / r.norm()).item() < 1e-6, (m, k, n, str(cfg))
# woq-int8 on the TMA kernel (the PTX conversion runs as fp32 magic here): ragged M and N, persistent programs
for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
    for m, k, n, cfg in ((40, 80, 56, tma(16, 16, 32, fast=2)), (17, 64, 48, tma(16, 32, 16, progs_per_sm=2)),
                         (5, 48, 40, tma(16, 16, 16, fast=0))):
        x, w = torch.randn(m, k, dtype=dt), torch.randint(-128, 128, (n, k), dtype=torch.int8)
        ws, b = torch.rand(n) + 0.5, torch.randn(n).to(dt)
        out = torch.empty(m, n, dtype=dt)
        ops._launch_tma(cfg, x, w, ws, None, b, out)
        r = ref(x, w, ws, None, b)
        assert ((out.double() - r).norm() / r.norm()).item() < tol, (dt, m, k, n, str(cfg))
# woq_limbs: rows far from 1 in magnitude, a zero row, and rows holding NaN / inf (those give NaN rows)
w, ws = torch.randint(-127, 128, (24, 64), dtype=torch.int8), torch.rand(24) + 0.5
x = torch.randn(5, 64, dtype=torch.float16) * torch.tensor([[1e4], [1e-3], [0.0], [1.0], [1.0]], dtype=torch.float16)
x[3, 7], x[4, 9] = float("nan"), float("inf")
out = ops.launch_config(limbs(16, 16, 32), x, w, ws, out_dtype=torch.float32)
r = ref(x[:3], w, ws, None, None)
assert all(((out[i].double() - r[i]).norm() <= 1e-6 * r[i].norm()).item() for i in range(3)), out[:3]
assert torch.isnan(out[3:]).all()
print("ok")
"""


@needs_triton
def test_kernel_indexing_under_interpreter():
    out = _run_python(INTERPRETER_SCRIPT, env={"TRITON_INTERPRET": "1"})
    assert out.strip().endswith("ok")


def _lowered_cpu_graph(
    dynamic: bool, form: str = "gpt_fast", bias: bool = True, k: int = 64, n: int = 48, m: int = 10
):
    """Trace a woq linear on CPU and apply the Triton lowering's emit directly (supports() needs CUDA)."""
    from qlower.lowerings.devices import cuda as cuda_rules

    model = WoqLinear(k, n, torch.bfloat16, form=form, bias=bias)
    x = torch.randn(2, 5, k, dtype=torch.bfloat16) if m == 10 else torch.randn(1, m, k, dtype=torch.bfloat16)
    gm = testing.trace_for_inductor(model, x, dynamic=dynamic)
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        (rec,) = FAMILIES["woq_int8"](gm.graph)
        assert cuda_rules.WOQ_INT8_TRITON.supports(rec) is not None  # declines off CUDA, with a reason
        new = cuda_rules.WOQ_INT8_TRITON.emit(gm.graph, rec, KernelPreference.AUTO)
        rec.output.replace_all_uses_with(new)
        gm.graph.eliminate_dead_code()
    gm.graph.lint()
    return gm


def _launches(gm) -> list[str]:
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    hop = torch.ops.higher_order.triton_kernel_wrapper_functional
    return [
        kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
        for n in gm.graph.nodes
        if n.target is hop
    ]


def _branch_leaves(gm) -> list[list[str]]:
    """The kernels each leaf of the graph's `torch.cond` tree launches (the graph itself if it has no cond)."""
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    if not conds:
        return [_launches(gm)]
    assert len(conds) == 1 and not _launches(gm), gm.graph
    _, true_gm, false_gm, _ = (getattr(gm, a.target) if getattr(a, "op", None) == "get_attr" else a
                               for a in conds[0].args)  # fmt: skip
    return _branch_leaves(true_gm) + _branch_leaves(false_gm)


@needs_triton
@pytest.mark.parametrize("mode", ["static", "dynamic", "dynamic_cudagraphs", "dynamic_flattened"])
def test_emits_kernel_launches_not_an_opaque_op(mode):
    """Static M=10: one launch from the table. Symbolic M: per range of the plan up to AUTO's crossover
    (M = 256) the static kernel, then the dequantization + cuBLAS range above it; without CUDA graphs as a tree
    of `torch.cond` on M (one launch per call), under CUDA graphs as gated launches (Inductor refuses to
    capture a cond), and gated too where M is a product of sizes ([B, T, K] flattened: a branch graph could not
    define B and T from its operands)."""
    # [1, 7, K]: M is one size symbol (the leading 1 specializes); [2, 5, K]: M = B * T
    m = 10 if mode in ("static", "dynamic_flattened") else 7
    with torch._inductor.config.patch({"triton.cudagraphs": mode == "dynamic_cudagraphs"}):
        gm = _lowered_cpu_graph(mode != "static", form="kn_weight", m=m)
    summary = testing.graph_summary(gm)
    assert "qlower.woq_int8_linear" not in summary and "_weight_int8pack_mm" not in summary
    if mode == "static":
        launches = _launches(gm)
        assert len(launches) == 1 and set(launches) <= set(KERNEL_NAMES), launches
        return
    plan = configs.dynamic_plan(configs.woq_int8_config, configs.WOQ_INT8_TUNED, 64, 48, max_m=256)
    kernels = {"decode": "woq_decode_kernel", "mm": "qlinear_mm_kernel", "gemv": "woq_int8_gemv_kernel"}
    want = [[kernels[cfg.kernel]] for _, _, cfg in plan] + [["woq_dequant_kernel"]]
    assert len(plan) >= 3, plan
    if mode == "dynamic":
        assert _branch_leaves(gm) == want, gm.graph
        assert "sym_min" not in summary, summary
        return
    assert not any(n.target is torch.ops.higher_order.cond for n in gm.graph.nodes), gm.graph
    launches = _launches(gm)
    assert len(launches) == len(plan) + 1, (plan, launches)
    assert set(launches) == {"woq_decode_kernel", "qlinear_mm_kernel", "woq_dequant_kernel"}, launches
    assert "sym_min" in summary and "sym_max" in summary and "aten.addmm(" in summary, summary  # bias


@needs_triton
@pytest.mark.parametrize(
    "k, n, m, kernel, flags",
    [
        (64, 48, 1, "woq_decode_kernel", ("'USE_DOT': False", "'ACC3': True", "'BLOCK_K': 1024", "'CVT': 1")),
        (48, 64, 1, "woq_decode_kernel", ("'USE_DOT': False", "'ACC3': False", "'BLOCK_N': 16", "'CVT': 1")),
        # M 2..16: the 16-row tile, 32 columns where K >= N, 64 where N > K
        (
            64,
            48,
            10,
            "qlinear_mm_kernel",
            ("'SWAP_AB': False", "'BLOCK_M': 16", "'BLOCK_N': 32", "'FAST_CVT': 1"),
        ),
        (
            48,
            64,
            10,
            "qlinear_mm_kernel",
            ("'SWAP_AB': False", "'BLOCK_M': 16", "'BLOCK_N': 64", "'FAST_CVT': 1"),
        ),
    ],
)
def test_decode_size_configs_by_rule(k, n, m, kernel, flags):
    """Static M <= 16 off the table takes the configs' rules, launched through wrap_triton (so the graph holds
    the kernel's functional wrapper, not an opaque op); off CUDA the inline-PTX conversions (CVT 2, FAST_CVT 2)
    become their Triton-ops form (1), which gives the same values."""
    gm = _lowered_cpu_graph(False, k=k, n=n, m=m)
    summary = testing.graph_summary(gm)
    assert _launches(gm) == [kernel], summary
    assert "qlower.woq_int8_linear" not in summary
    for flag in flags:
        assert flag in summary, (flag, summary)


@needs_triton
def test_split_k_emits_decomposed_zeros(monkeypatch):
    """A split-K tile accumulates into a zeroed fp32 buffer; the emitted post-grad graph must hold Inductor's
    decomposition of that allocation (aten.full), not aten.zeros, which Inductor refuses there ("both a
    fallback and a decomp"; seen on the H200 compiling the M=16 14336->4096 split-K entry)."""
    from qlower.lowerings.kernels.triton import configs as cfgs

    monkeypatch.setitem(cfgs.WOQ_INT8_TABLE, (16, 64, 48), mm(16, 32, 32, 4, 4, split_k=2, fast=2))
    gm = _lowered_cpu_graph(False, k=64, n=48, m=10)
    summary = testing.graph_summary(gm)
    assert _launches(gm) == ["qlinear_mm_kernel"] and "'SPLIT_K': 2" in summary, summary
    assert "aten.full(" in summary and "aten.zeros" not in summary, summary


@needs_triton
@pytest.mark.parametrize("cudagraphs", [False, True])
def test_dynamic_m_split_k_range_gets_its_own_accumulator(monkeypatch, cudagraphs):
    """A symbolic M whose range 2..16 splits K: under CUDA graphs (gated launches sharing one output) the
    split-K launch gets a zeroed fp32 buffer of M * gate rows and a reduce launch gated alike writes the
    output; in the host-branched form its leaf is the static split-K launch (one buffer, one cast)."""
    from qlower.lowerings.kernels.triton import configs as cfgs

    monkeypatch.setitem(cfgs.WOQ_INT8_TABLE, (16, 64, 48), mm(16, 32, 32, 4, 4, split_k=2, fast=2))
    with torch._inductor.config.patch({"triton.cudagraphs": cudagraphs}):
        gm = _lowered_cpu_graph(True, form="kn_weight", m=7)
    summary = "\n".join(  # the branches' graphs too
        testing.graph_summary(sub) for _, sub in gm.named_modules() if isinstance(sub, torch.fx.GraphModule)
    )
    assert "'SPLIT_K': 2" in summary and "aten.zeros" not in summary, summary
    if not cudagraphs:
        split_leaves = [leaf for leaf in _branch_leaves(gm) if leaf == ["qlinear_mm_kernel"]]
        assert split_leaves and "splitk_reduce_kernel" not in summary, summary
        return
    launches = _launches(gm)
    assert launches.count("splitk_reduce_kernel") == 1, launches
    i = launches.index("splitk_reduce_kernel")
    assert launches[i - 1] == "qlinear_mm_kernel", launches
    assert "sym_min" in summary and "aten.full(" in summary, summary  # the gate, the gated zeros


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
    out = _run_python(DYNAMIC_M_SCRIPT, env={"TRITON_INTERPRET": "1"})
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
    launched = [name for g in graphs for name in _launches(g)]
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
    (tests/lowerings/kernels/test_mx_gpu.py::test_dynamic_m_matches_float64_at_every_bucket_edge)."""
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


@needs_triton
def test_swap_ab_on_eight_warps_is_refused_and_never_picked():
    """Triton 3.6 computed wrong rows (and NaN) for the 8-warp swap-AB tile on the H200 (`mm 128x128x64 w8 s4
    swap`, M > 128, N = 14336; `git show lab-archive:BENCHMARKS.md`, "Two defects found and fixed"): the launcher
    refuses such a config with the reason, and no table entry or rule picks one."""
    from qlower.lowerings.kernels.triton.int8 import ops

    x, w = torch.randn(3, 64, dtype=torch.bfloat16), torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    with pytest.raises(ValueError, match="swap-AB tiles on more than 4 warps"):
        ops.launch_config(mm(128, 128, 64, 8, 4, swap=True), x, w, torch.rand(32, dtype=torch.bfloat16))
    picks = [*configs.WOQ_INT8_TABLE.values(), *configs.DYNAMIC_INT8_TABLE.values()]
    picks += [f(m, k, n) for f in (configs.woq_int8_config, configs.dynamic_int8_config)
              for m in configs.M_BUCKETS for k, n in ((4096, 4096), (4096, 14336), (2048, 5120))]  # fmt: skip
    assert not [c for c in picks if c.swap_ab and c.num_warps > 4]


def test_woq_large_m_takes_the_tma_tile():
    """Static M above 256 (and M=256 at N=14336): the TMA tile that won the H200 sweep behind `configs.WOQ_TMA`;
    a symbolic M's launch takes it too (its persistent grid is min(programs, tiles) times the M gate)."""
    assert configs.woq_int8_config(4096, 4096, 4096) == configs.WOQ_TMA
    assert configs.woq_int8_config(700, 2048, 5120) == configs.WOQ_TMA  # off the table: the rule
    assert configs.woq_int8_config(256, 4096, 14336).kernel == "tma"
    plan = configs.dynamic_plan(configs.woq_int8_config, configs.WOQ_INT8_TUNED, 4096, 4096)
    assert plan[-1][1:] == (None, configs.WOQ_TMA), plan


@needs_triton
def test_tma_is_refused_off_nvidia_sm90(monkeypatch):
    """TMA kernels run on NVIDIA sm_90 only: a CPU tensor, and a ROCm "cuda" device (MI300 reports 9.x), take
    the pointer fallback."""
    from types import SimpleNamespace

    from qlower.lowerings.kernels.triton.int8 import ops

    x, w = torch.randn(32, 64, dtype=torch.bfloat16), torch.randint(-127, 128, (32, 64), dtype=torch.int8)
    assert ops._tma_unsupported(x, w, torch.empty(32, 32, dtype=torch.bfloat16), 1) == "not an NVIDIA GPU"
    monkeypatch.setattr(torch.version, "hip", "6.2")
    rocm = SimpleNamespace(device=torch.device("cuda"))
    assert ops._tma_unsupported(rocm, rocm, rocm, 1) == "not an NVIDIA GPU"


def test_woq_mid_m_rule_and_crossover():
    """M 33..256 (AUTO's Triton range, `crossovers.WOQ_INT8_TRITON_MAX_M`, from the H200 M = 32..256 sweep): swap-AB tiles
    off the measured shapes too (3 stages where N > K, K split 4 ways where K > N), and the crossover to dequant +
    mm right above the last measured win."""
    from qlower.lowerings.kernels.triton import configs

    assert crossovers.WOQ_INT8_TRITON_MAX_M == 256
    for m, k, n, tile, stages, split in [
        (100, 2048, 5120, (128, 64, 128), 3, 1),
        (128, 2048, 11008, (128, 64, 128), 3, 1),
        (200, 2048, 5120, (128, 64, 128), 3, 1),
        (100, 2048, 2048, (64, 64, 128), 4, 1),
        (100, 11008, 2048, (128, 64, 128), 3, 4),
        (50, 11008, 2048, (64, 64, 128), 4, 4),
    ]:
        cfg = configs.woq_int8_config(m, k, n)
        got = (cfg.kernel, cfg.swap_ab, (cfg.block_m, cfg.block_n, cfg.block_k), cfg.num_stages, cfg.split_k)
        assert got == ("mm", True, tile, stages, split), (m, k, n, str(cfg))
        assert cfg.fast_cvt == 3  # the 2-element PTX conversion on the swap-AB register operand
    assert configs.woq_int8_config(20, 11008, 2048).split_k == 4  # M 17..32 with K > N: split too
    assert not configs.woq_int8_config(256, 2048, 11008).swap_ab  # wide N at 256: the 128x128 tile won
    assert configs.woq_int8_config(128, 4096, 4096) == configs.WOQ_INT8_TABLE[(128, 4096, 4096)]


@needs_triton
def test_dynamic_int8_emits_one_fused_launch():
    """A torchao-style dynamic int8 linear (N-D input, bias) becomes one int8 kernel launch with x_scale inside."""
    from qlower.lowerings.devices import cuda as cuda_rules
    from qlower.lowerings.emit import triton_int8 as lowering

    def model(x, w, s, b):
        xs = x.abs().amax(-1, keepdim=True).float().clamp_min(1e-6) / 127
        xq = torch.round(x.float() / xs).clamp(-128, 127).to(torch.int8)
        y = torch._int_mm(xq.reshape(-1, 64), w.t()).float() * xs.reshape(-1, 1)
        return (y.to(torch.bfloat16) * s + b).reshape(2, -1, 48)

    args = (
        torch.randn(2, 9, 64, dtype=torch.bfloat16),
        torch.randint(-127, 128, (48, 64), dtype=torch.int8),
        torch.rand(48, dtype=torch.bfloat16),
        torch.randn(48, dtype=torch.bfloat16),
    )
    gm = testing.trace_for_inductor(model, *args)
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])
    with torch._guards.tracing(torch._guards.TracingContext(fake_mode)):
        (rec,) = FAMILIES["dynamic_int8"](gm.graph)
        assert "not CUDA" in cuda_rules.DYNAMIC_INT8_TRITON.supports(rec)
        rec.output.replace_all_uses_with(lowering.emit_dynamic_int8(gm.graph, rec, KernelPreference.AUTO))
        gm.graph.eliminate_dead_code()
    assert _launches(gm) == ["qlinear_mm_kernel"]
    summary = testing.graph_summary(gm)
    assert "_int_mm" not in summary and "'INT8_A': True" in summary and "'HAS_XS': True" in summary


def test_qlower_imports_and_declines_without_triton():
    script = """
    import sys
    class NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError("triton blocked for this test")
    sys.meta_path.insert(0, NoTriton())
    import qlower
    from qlower.lowerings import backends
    from qlower.lowerings.kernels.triton import triton_unavailable
    names = [lw.name for lw in backends()["cuda"].lowerings]
    assert names.index("triton.woq_int8_linear") < names.index("dequant_mm"), names
    assert "not importable" in triton_unavailable()
    assert "triton" not in sys.modules
    print("ok")
    """
    assert _run_python(script).strip().endswith("ok")


# ------------------------------------------------------------------------------------------------ GPU
GPU_SHAPES = [(100, 72), (1000, 520), (4096, 4096)]  # (K, N): the first two are off every tile grid
GPU_M = [1, 3, 17, 200, 1000]  # 200: AUTO's Triton range above 64 (swap-AB tile), 1000: dequant + mm


def _woq_inputs(m, k, n, dtype, bias, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    w = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
    s = (torch.rand(n, device="cuda", generator=g) * 0.02 + 0.005).to(dtype)
    b = torch.randn(n, device="cuda", dtype=dtype, generator=g) if bias else None
    ref = x.double() @ (w.double() * s.double()[:, None]).t()
    return x, w, s, b, (ref if b is None else ref + b.double())


def _rel(out, ref):
    assert torch.isfinite(out).all()
    return ((out.double() - ref).norm() / ref.norm()).item()


TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


# (M, K, N) where the table picks woq_decode_kernel (inline-PTX conversion): M = 1 fma on the three model
# shapes, M = 16 swap-AB dot on 14336->4096
DECODE_POINTS = [(1, 4096, 4096), (1, 4096, 14336), (1, 14336, 4096), (16, 14336, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("key", sorted(configs.WOQ_INT8_TABLE), ids=lambda t: "x".join(map(str, t)))
def test_woq_table_config_at_its_shape(key):
    """Each tuned entry at the shape it was tuned for, and one row fewer (a partial row tile), against float64."""
    from qlower.lowerings.kernels.triton.int8 import ops

    bucket, k, n = key
    cfg = configs.WOQ_INT8_TABLE[key]
    for m in sorted({bucket, max(bucket - 1, 1)}):
        x, w, s, b, ref = _woq_inputs(m, k, n, torch.bfloat16, bias=True, seed=m + n)
        assert _rel(ops.launch_config(cfg, x, w, s, bias=b), ref) < 1e-2, (m, k, n, str(cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "m,k,n", [(m, k, n) for m in GPU_M for k, n in GPU_SHAPES] + DECODE_POINTS[1:]
)  # DECODE_POINTS[0] is already in the grid
def test_woq_op_matches_float64(m, k, n, dtype):
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    x, w, s, b, ref = _woq_inputs(m, k, n, dtype, bias=m % 2 == 1, seed=m + k)
    out = torch.ops.qlower.woq_int8_linear(x, w, s, b)
    assert out.dtype == dtype and _rel(out, ref) < TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg_name", ["gemv", "gemv_splitk", "mm_swap", "mm", "mm_splitk", "mm_i2f", "limbs", "limbs_wide"]
)
def test_woq_every_kernel_shape(cfg_name):
    from qlower.lowerings.kernels.triton.configs import gemv, limbs, mm
    from qlower.lowerings.kernels.triton.int8 import ops

    cfg = {
        "gemv": gemv(1, 16, 512),
        "gemv_splitk": gemv(2, 16, 256, split_k=3),
        "mm_swap": mm(16, 64, 256, 4, 4, swap=True),
        "mm": mm(64, 128, 64, 4, 3),
        "mm_splitk": mm(32, 64, 128, 4, 3, split_k=2),
        "mm_i2f": mm(128, 128, 64, 8, 3, fast=0),
        "limbs": limbs(16, 64, 256, 4, 4),
        "limbs_wide": limbs(128, 128, 128, 8, 3),
    }[cfg_name]
    for m in GPU_M:
        x, w, s, b, ref = _woq_inputs(m, 1000, 520, torch.bfloat16, bias=True, seed=m)
        assert _rel(ops.launch_config(cfg, x, w, s, bias=b), ref) < 1e-2, (m, cfg_name)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "fp32_cfg,ptx_cfg",
    [
        (mm(16, 64, 256, 4, 4), mm(16, 64, 256, 4, 4, fast=2)),  # mma.sync, the weight as B
        (mm(64, 64, 128, 4, 4, swap=True), mm(64, 64, 128, 4, 4, swap=True, fast=2)),  # wgmma, register A
        (mm(64, 64, 128, 4, 4, swap=True), mm(64, 64, 128, 4, 4, swap=True, fast=3)),  # 2 per asm call
        (mm(16, 64, 256, 4, 4), mm(16, 64, 256, 4, 4, fast=3)),
        (mm(128, 128, 64, 8, 3), mm(128, 128, 64, 8, 3, fast=2)),  # wgmma, converted B through shared memory
        (decode_dot(16, 32, 256, cvt=2), decode_dot(16, 32, 256, cvt=3)),
    ],
    ids=str,
)
def test_ptx_int8_to_half_matches_fp32_path_bitwise(fp32_cfg, ptx_cfg, dtype):
    """The inline-PTX int8 -> bf16/fp16 conversion is exact, so the tensor cores see the same operands as
    through fp32: outputs must be bit-identical, for every byte value (each column of the weight walks all
    256) and a K off the tile grid (masked tail)."""
    from qlower.lowerings.kernels.triton.int8 import ops

    m, k, n = 17, 1000, 200
    x, _, s, b, _ = _woq_inputs(m, k, n, dtype, bias=True, seed=7)
    w = (torch.arange(n * k, device="cuda").reshape(n, k) * 37 % 256 - 128).to(torch.int8)
    assert w.unique().numel() == 256
    ref = ops.launch_config(fp32_cfg, x, w, s, bias=b)
    out = ops.launch_config(ptx_cfg, x, w, s, bias=b)
    assert torch.equal(out, ref)
    exact = x.double() @ (w.double() * s.double()[:, None]).t() + b.double()
    assert _rel(out, exact) < TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("k,n", GPU_SHAPES)
@pytest.mark.parametrize("m", GPU_M)
def test_dynamic_int8_op_matches_float64(m, k, n):
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    x, w, s, b, _ = _woq_inputs(m, k, n, torch.bfloat16, bias=True, seed=m + n)
    xs = x.abs().amax(-1, keepdim=True).float() / 127
    xq = torch.round(x.float() / xs).clamp(-128, 127).to(torch.int8)
    ref = (xq.double() @ w.double().t()) * xs.double() * s.double() + b.double()
    out = torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, b, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and _rel(out, ref) < 1e-2


def _compiled_code(model, xs, dynamic=None, **opts):
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(model, options=qlower.inductor_options(**opts), dynamic=dynamic)
    with torch.no_grad():
        out, code = run_and_get_code(compiled, xs[0])
        rest = [compiled(x) for x in xs[1:]]
    return [out, *rest], "\n".join(code)


KERNEL_OF_KIND = {
    "decode": "woq_decode_kernel",
    "gemv": "woq_int8_gemv_kernel",
    "mm": "qlinear_mm_kernel",
    "limbs": "woq_limb_mm_kernel",
    "tma": "woq_mm_tma_dev_kernel",
}


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["gpt_fast", "kn_weight", "scale_first"])
@pytest.mark.parametrize("m,k,n", [(m, 1000, 520) for m in GPU_M] + DECODE_POINTS + [(4, 4096, 14336)])
def test_compile_calls_triton_kernel(form, m, k, n):
    from qlower.lowerings.kernels.triton import configs
    from qlower.lowerings.kernels.triton.int8 import ops

    bias = (k, n) == (1000, 520) or m % 2 == 1  # the decode points: M 1 with bias, M 16 without
    model = WoqLinear(k, n, torch.bfloat16, form=form, bias=bias).cuda()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    (out,), code = _compiled_code(model, [x])
    # AUTO takes the Triton kernel up to the measured crossover, the fused dequant + mm above it.
    expected = "triton.woq_int8_linear" if m <= crossovers.WOQ_INT8_TRITON_MAX_M else "dequant_mm"
    assert [d.lowering for d in qlower.last_report()] == [expected], qlower.last_report().table()
    if expected.startswith("triton"):
        cfg = configs.woq_int8_config(m, k, n)
        assert KERNEL_OF_KIND[cfg.kernel] in code, str(cfg)  # the table's / rule's kernel for this shape
        if (m, k, n) in DECODE_POINTS:  # inline PTX on the GPU: the fp32 decode (M = 1) or the bf16 tile
            cvt = cfg.cvt if cfg.kernel == "decode" else cfg.fast_cvt
            assert cvt >= 2 and ops._conversion_here(cvt, x) == cvt, str(cfg)
    assert "torch.ops.qlower" not in code  # compiled in, not a Python fallback
    assert _rel(out, model.reference(x)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n, kernel",
    [(1024, 4096, 1024, "woq_mm_tma_dev_kernel"), (600, 1000, 520, "qlinear_mm_kernel")],
)  # K = 1000: rows not 16-byte aligned, so the TMA tile falls back to its pointer twin
def test_compile_large_m_woq_on_the_tma_kernel(m, k, n, kernel):
    """Under the TRITON preference a static M above AUTO's crossover takes the TMA tile (`configs.WOQ_TMA`)."""
    model = WoqLinear(k, n, torch.bfloat16, bias=True).cuda()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    (out,), code = _compiled_code(model, [x], kernel_preference="triton")
    # the explicit preference's lowering, past AUTO's crossover (WOQ_INT8_MAX_M)
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    assert kernel in code and "torch.ops.qlower" not in code
    assert _rel(out, model.reference(x)) < 1e-2


@pytest.mark.gpu
def test_compile_dynamic_m_one_graph_every_bucket():
    model = WoqLinear(1000, 520, torch.bfloat16, bias=True).cuda()
    xs = [torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16) for m in (3, 17, 1000, 5)]
    torch._dynamo.mark_dynamic(xs[0], 0)
    outs, code = _compiled_code(model, xs, kernel_preference="triton")
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    assert "qlinear_mm_kernel" in code
    for out, x in zip(outs, xs, strict=True):
        assert _rel(out, model.reference(x)) < 1e-2


@pytest.mark.gpu
def test_auto_takes_dynamic_m_and_declines_a_large_static_m():
    """AUTO: a symbolic M gets the Triton op (its ranges up to M = 256, dequant + cuBLAS above, inside the op);
    a static M above the crossover gets dequant_mm."""
    model = WoqLinear(1000, 520, torch.bfloat16).cuda()
    xs = [torch.randn(m, 1000, device="cuda", dtype=torch.bfloat16) for m in (17, 3, 300)]
    torch._dynamo.mark_dynamic(xs[0], 0)
    outs, code = _compiled_code(model, xs)
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    assert "woq_dequant_kernel" in code and "qlinear_mm_kernel" in code and "extern_kernels.mm" in code
    for out, x in zip(outs, xs, strict=True):
        assert _rel(out, model.reference(x)) < 1e-2
    _compiled_code(model, [torch.randn(1000, 1000, device="cuda", dtype=torch.bfloat16)])
    assert [d.lowering for d in qlower.last_report()] == ["dequant_mm"]


@pytest.mark.gpu
@needs_cuda_package_load
def test_aot_inductor_embeds_kernel():
    import zipfile

    model = WoqLinear(1000, 520, torch.bfloat16, bias=True).cuda()
    x = torch.randn(17, 1000, device="cuda", dtype=torch.bfloat16)
    ep = torch.export.export(model, (x,))
    path = torch._inductor.aoti_compile_and_package(ep, inductor_configs=qlower.inductor_options())
    assert [d.lowering for d in qlower.last_report()] == ["triton.woq_int8_linear"]
    with zipfile.ZipFile(path) as zf:
        sources = "".join(
            zf.read(n).decode(errors="ignore") for n in zf.namelist() if n.endswith((".cpp", ".h"))
        )
    assert any(name in sources for name in KERNEL_NAMES)
    assert "proxy_executor_call_function" not in sources
    runner = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        assert _rel(runner(x), model.reference(x)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k, n, kernel",
    [(m, 1000, 520, "qlinear_mm_kernel") for m in GPU_M]
    + [(1000, 1000, 520, "qlinear_mm_kernel"), (1000, 4096, 1024, "int8_mm_tma_dev_kernel")],
)  # K = 1000: rows not 16-byte aligned, so the TMA config falls back to the pointer kernel
def test_dynamic_int8_under_compile(m, k, n, kernel):
    from qlower.lowerings.kernels.triton.int8 import ops  # noqa: F401

    def model(x, w, s):
        xs = x.abs().amax(-1, keepdim=True).float().clamp_min(1e-6) / 127
        xq = torch.round(x.float() / xs).clamp(-128, 127).to(torch.int8)
        return torch.ops.qlower.int8_dynamic_linear(xq, xs, w, s, None, x.dtype)

    x, w, s, _, _ = _woq_inputs(m, k, n, torch.bfloat16, bias=False)
    from torch._inductor.utils import run_and_get_code

    out, code = run_and_get_code(torch.compile(model), x, w, s)
    assert kernel in "\n".join(code)
    xs = x.abs().amax(-1, keepdim=True).double() / 127
    ref = (torch.round(x.double() / xs).clamp(-128, 127) @ w.double().t()) * xs * s.double()
    assert _rel(out, ref) < 1e-2
