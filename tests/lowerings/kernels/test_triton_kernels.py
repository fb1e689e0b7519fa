"""qlower's CUDA Triton kernels (woq-int8, dynamic-int8), checked on the CPU (CI).

The kernels' indexing and masking under TRITON_INTERPRET=1 in a subprocess (the variable must be set before
Triton is imported; bf16 is broken in the interpreter, so fp32/fp16/int8), the graph the lowering emits (kernel
launches, not an opaque op), the configs' rules, and that qlower imports without Triton. A symbolic M:
test_triton_dynamic_m.py; on a GPU (`pytest -m gpu tests/`), numerics vs float64 on shapes off the tile grid
and torch.compile / AOTInductor calling the kernels: test_triton_kernels_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from qlower import testing
from qlower.lowerings.devices import crossovers
from qlower.lowerings.kernels.triton import configs
from qlower.lowerings.kernels.triton.configs import mm
from qlower.lowerings.preference import KernelPreference
from qlower.patterns import FAMILIES
from tests.forms.woq_int8 import WoqLinear
from tests.helpers import run_python
from tests.helpers.triton_launches import KERNEL_NAMES, kernel_launches, needs_triton

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
# woq_int8_dense_gated at gate 1 (the dequantize kernel + torch.mm, the op a symbolic M's top range runs under
# CUDA graphs), K and N off the dequantize tile; the weight strided with a per-tensor scale too
for dt, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
    x, w = torch.randn(7, 300, dtype=dt), torch.randint(-128, 128, (40, 300), dtype=torch.int8)
    w_kn = torch.randint(-128, 128, (300, 40), dtype=torch.int8)
    ws, b = torch.rand(40) + 0.5, torch.randn(40).to(dt)
    for weight, bias, scale in ((w, b, ws), (w_kn.t(), None, ws[:1])):
        out = torch.ops.qlower.woq_int8_dense_gated(x, weight, scale, bias, 1, 0, False)
        r = ref(x, weight, scale, None, bias)
        assert out.dtype == dt and ((out.double() - r).norm() / r.norm()).item() < tol, dt
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
    out = run_python(INTERPRETER_SCRIPT, env={"TRITON_INTERPRET": "1"})
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


def _branch_leaves(gm) -> list[list[str]]:
    """The kernels each leaf of the graph's `torch.cond` tree launches (the graph itself if it has no cond)."""
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    if not conds:
        return [kernel_launches(gm)]
    assert len(conds) == 1 and not kernel_launches(gm), gm.graph
    _, true_gm, false_gm, _ = (getattr(gm, a.target) if getattr(a, "op", None) == "get_attr" else a
                               for a in conds[0].args)  # fmt: skip
    return _branch_leaves(true_gm) + _branch_leaves(false_gm)


@needs_triton
@pytest.mark.parametrize("mode", ["static", "dynamic", "dynamic_cudagraphs", "dynamic_flattened"])
def test_emits_kernel_launches_not_an_opaque_op(mode):
    """Static M=10: one launch from the table. Symbolic M: per range of the plan up to AUTO's crossover
    (M = 256) the static kernel, then the dequantization + cuBLAS range above it; without CUDA graphs as a tree
    of `torch.cond` on M (one launch per call), under CUDA graphs as gated launches (Inductor refuses to
    capture a cond) with the dequantization range in `qlower::woq_int8_dense_gated`, and gated too where M is a
    product of sizes ([B, T, K] flattened: a branch graph could not define B and T from its operands)."""
    # [1, 7, K]: M is one size symbol (the leading 1 specializes); [2, 5, K]: M = B * T
    m = 10 if mode in ("static", "dynamic_flattened") else 7
    with torch._inductor.config.patch({"triton.cudagraphs": mode == "dynamic_cudagraphs"}):
        gm = _lowered_cpu_graph(mode != "static", form="kn_weight", m=m)
    summary = testing.graph_summary(gm)
    assert "qlower.woq_int8_linear" not in summary and "_weight_int8pack_mm" not in summary
    if mode == "static":
        launches = kernel_launches(gm)
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
    launches = kernel_launches(gm)
    assert len(launches) == len(plan), (plan, launches)
    assert set(launches) == {"woq_decode_kernel", "qlinear_mm_kernel"}, launches
    # the dequantization + cuBLAS range: one opaque op with the gate as an argument (no operand sized by it)
    (dense,) = [n for n in gm.graph.nodes if n.target is torch.ops.qlower.woq_int8_dense_gated.default]
    assert dense.args[3] is not None, dense  # the bias goes in with it
    assert "sym_min" in summary and "sym_max" in summary, summary


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
    assert kernel_launches(gm) == [kernel], summary
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
    assert kernel_launches(gm) == ["qlinear_mm_kernel"] and "'SPLIT_K': 2" in summary, summary
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
    launches = kernel_launches(gm)
    assert launches.count("splitk_reduce_kernel") == 1, launches
    i = launches.index("splitk_reduce_kernel")
    assert launches[i - 1] == "qlinear_mm_kernel", launches
    assert "sym_min" in summary and "aten.full(" in summary, summary  # the gate, the gated zeros


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
    assert kernel_launches(gm) == ["qlinear_mm_kernel"]
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
    assert run_python(script).strip().endswith("ok")
