"""MX on a CUDA GPU: the Triton kernels against a float64 reference, the compiled path through qlower, and the
capability rules (SM100 codegen under an overridden capability, ATEN preference refused below 10.0).

    pytest -m gpu tests/lowerings/kernels/test_mx_gpu.py    (skipped without CUDA; needs Triton, no torchao)
"""

from __future__ import annotations

import pytest
import torch

import qlower
from qlower.patterns import mx_format as fmt
from tests.forms.mx import MXLinear

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _data(rows: int, k: int, elem: str | None, scale: float = 1.0, seed: int = 0):
    """(kernel operand, codes or None, float64 reference [rows, k]) for one operand."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(rows, k, device=DEV, generator=g) * scale
    if elem is None:
        xb = x.to(torch.bfloat16)
        return xb, None, xb.double()
    q, e = fmt.quantize(x, elem)
    return q.view(torch.uint8), e, fmt.dequantize_f64(q, e, elem)


@pytest.fixture(autouse=True)
def _no_compile_caches():
    """A cached compile skips qlower's pass (and its report): every test compiles afresh."""
    from torch._inductor import config as inductor_config

    with inductor_config.patch(force_disable_caches=True):
        yield


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


KERNEL_CASES = [  # (activation format or None, weight format, kernel, swizzled scales)
    (None, "e4m3", "gemv", False),
    (None, "e2m1", "gemv", True),
    (None, "e5m2", "gemv", False),
    ("e4m3", "e4m3", "gemv", True),
    (None, "e4m3", "mm", False),
    (None, "e2m1", "mm", True),
    ("e4m3", "e4m3", "mm", True),
    ("e2m1", "e2m1", "mm", False),
    ("e4m3", "e2m1", "mm", False),
    ("e5m2", "e4m3", "mm", False),  # mixed fp8 types: the upcast path
]


@pytest.mark.parametrize("a_elem,w_elem,kernel,swizzled", KERNEL_CASES)
def test_kernel_matches_float64_reference(a_elem, w_elem, kernel, swizzled):
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE, MXConfig, launch_config

    m, n, k = (3 if kernel == "gemv" else 200), 200, 320  # N, M off the tiles; K off BLOCK_K
    a, a_e, a_ref = _data(m, k, a_elem, seed=1)
    w, w_e, w_ref = _data(n, k, w_elem, scale=0.05, seed=2)
    bias = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    sw = fmt.to_swizzled(w_e) if swizzled else w_e
    sa = None if a_e is None else (fmt.to_swizzled(a_e) if swizzled else a_e)
    cfg = (
        MXConfig("gemv", block_n=16, block_k=256, num_warps=4, num_stages=2)
        if kernel == "gemv"
        else MXConfig("mm", block_m=64, block_n=64, block_k=128, num_warps=4, num_stages=2)
    )
    y = launch_config(cfg, a, sa, w, sw, bias, ELEM_CODE[a_elem or "float"], ELEM_CODE[w_elem],
                      swizzled and sa is not None, swizzled)  # fmt: skip
    ref = a_ref @ w_ref.t() + bias.double()
    assert not y.isnan().any()
    assert _rel(y, ref) <= 1e-2


KERNEL_NAMES = {
    "hfma": "mx_hfma_gemv_kernel",
    "mm": "mx_decode_mm_kernel",
    "bf16mm": "mx_bf16_mm_kernel",
    "bf16dq": "mx_bf16_dequant_kernel",
}


def _model(a_elem: str | None, w_elem: str, n: int, k: int, e8m0: bool = False):
    m = MXLinear(a_elem, w_elem, n, k, e8m0, device=DEV)
    return m, (m.q, m.e)


def _compiled(f, dynamic=False, **opts):
    torch._dynamo.reset()
    qlower.clear_reports()
    return torch.compile(f, dynamic=dynamic, options=qlower.inductor_options(families=("mx",), **opts))


@pytest.mark.parametrize(
    "a_elem,w_elem,m,e8m0,pref,lowering",
    [
        (None, "e2m1", 1, False, "AUTO", "triton.mx_linear"),
        # Weight-only above the decode kernels' M range: AUTO emulates (the tile kernel measured slower).
        (None, "e4m3", 37, True, "AUTO", "mx_dequant_mm"),
        (None, "e4m3", 37, True, "TRITON", "triton.mx_linear"),
        ("e4m3", "e4m3", 2, False, "AUTO", "triton.mx_linear"),
        # Dynamic MX above the GEMV range: AUTO emulates (the tile kernel measured slow); TRITON forces it.
        ("e4m3", "e4m3", 64, False, "AUTO", "mx_dequant_mm"),
        ("e4m3", "e4m3", 64, False, "TRITON", "triton.mx_linear"),
        ("e2m1", "e2m1", 300, True, "TRITON", "triton.mx_linear"),
    ],
)
def test_compiled_model_lowering_and_numerics(a_elem, w_elem, m, e8m0, pref, lowering):
    n, k = 256, 512
    f, _ = _model(a_elem, w_elem, n, k, e8m0)
    x = torch.randn(1, m, k, device=DEV, dtype=torch.bfloat16)
    from torch._inductor.utils import run_and_get_code

    y, codes = run_and_get_code(_compiled(f, kernel_preference=pref), x)
    rep = qlower.last_report()
    assert [d.lowering for d in rep] == [lowering], rep.table()
    ref = f(x)  # eager: the same quantization and dequantization in torch ops
    assert _rel(y, ref.double()) <= 1e-2
    code = "\n".join(codes)
    mx_kernels = (
        "mx_gemv_kernel", "mx_mm_kernel", "mx_decode_mm_kernel", "mx_hfma_gemv_kernel"
    )  # fmt: skip
    assert any(name in code for name in mx_kernels) == lowering.startswith("triton")


def test_triton_kernel_clones_no_input():
    """The kernel HOP must say only the output is written, else Inductor copies weights every call."""
    from qlower.testing import apply_pass, trace_for_inductor

    f, _ = _model(None, "e2m1", 256, 512)
    gm = trace_for_inductor(f, torch.randn(4, 512, device=DEV, dtype=torch.bfloat16))
    apply_pass(gm, families=("mx",))
    hops = [n for n in gm.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert hops and all(list(n.kwargs["tensors_to_clone"]) == ["out_ptr"] for n in hops)


def test_dynamic_m_gates_both_kernels():
    f, _ = _model(None, "e2m1", 256, 512)
    cf = _compiled(f, dynamic=True)
    for m in (1, 3, 40, 129):
        x = torch.randn(m, 512, device=DEV, dtype=torch.bfloat16)
        assert _rel(cf(x), f(x).double()) <= 1e-2


def test_sm100_path_generates_scaled_mm_code():
    """No SM100 here: with capability pinned to 10.0 the generated code calls cuBLAS' _scaled_mm (not run)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import get_code

    from qlower.lowerings.devices.cuda import override_cuda_capability

    f, _ = _model("e4m3", "e4m3", 256, 512)
    x = torch.randn(128, 512, device=DEV, dtype=torch.bfloat16)
    with override_cuda_capability((10, 0)), inductor_config.patch(force_disable_caches=True):
        code = "\n".join(get_code(_compiled(f), x))
    assert [d.lowering for d in qlower.last_report()] == ["aten._scaled_mm.mx"]
    assert "_scaled_mm" in code and "mx_mm_kernel" not in code


def test_aten_preference_is_refused_at_compile_time_on_this_gpu():
    if torch.cuda.get_device_capability() >= (10, 0):
        pytest.skip("this GPU runs MX _scaled_mm")
    f, _ = _model("e4m3", "e4m3", 256, 512)
    x = torch.randn(64, 512, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(Exception, match="capability >= 10.0"):
        _compiled(f, kernel_preference="ATEN")(x)


@pytest.mark.parametrize("w_elem", ["e2m1", "e4m3"])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("k,n", [(4096, 14336), (4096, 4256)])  # 4256: N off the decode tiles
def test_compiled_weight_only_uses_decode_kernels(w_elem, m, k, n):
    """Weight-only MX at decode sizes: the kernel mx_ops.pick_weight_only names (the f16x2 GEMV, the mx_decode
    dot kernel, or MXFP4's `mx_bf16` tiles), against float64."""
    from torch._inductor.utils import run_and_get_code

    f, _ = _model(None, w_elem, n, k)
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    y, codes = run_and_get_code(_compiled(f), x)
    assert [d.lowering for d in qlower.last_report()] == ["triton.mx_linear"]
    code = "\n".join(codes)
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    cfg = mx_ops.pick_weight_only(m, mx_ops.ELEM_CODE[w_elem], k, n, x.dtype)
    assert KERNEL_NAMES[cfg.kernel] in code
    w_ref = fmt.dequantize_f64(f.q, f.e, w_elem)
    ref = x.double() @ w_ref.t()
    assert not y.isnan().any()
    assert _rel(y, ref) <= 1e-2


def test_dynamic_m_decode_buckets():
    """A symbolic M takes per M bucket its kernel (`mx_ops.buckets`): all are in the code (default mode: the
    branches of a host `if` on M), and every M computes the float64 result."""
    from torch._inductor.utils import run_and_get_code

    # M 1-2 -> hfma, 3-64 -> mx_bf16 tiles, above: its dequantize (N < K)
    f, _ = _model(None, "e2m1", 1056, 4256)
    cf = _compiled(f, dynamic=True)
    for m in (2, 3, 9, 16, 17, 40, 64, 65, 130, 300):
        x = torch.randn(m, 4256, device=DEV, dtype=torch.bfloat16)
        y, codes = run_and_get_code(cf, x) if m == 2 else (cf(x), None)
        if codes is not None:
            code = "\n".join(codes)
            assert all(KERNEL_NAMES[c] in code for c in ("hfma", "bf16mm", "bf16dq")), code
        ref = x.double() @ fmt.dequantize_f64(f.q, f.e, "e2m1").t()
        assert _rel(y, ref) <= 1e-2


BUCKET_EDGES = (1, 2, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000)


@pytest.mark.parametrize("w_elem", ["e2m1", "e4m3"])
@pytest.mark.parametrize("cudagraphs", [False, True])
def test_dynamic_m_matches_float64_at_every_bucket_edge(w_elem, cudagraphs):
    """MX weight-only with a symbolic M, at each M bucket edge (`BUCKET_EDGES`), in default mode (host `if`s
    on M) and under CUDA graphs (gated launches, no skipped graph), against float64."""
    from torch._dynamo.utils import counters

    counters.clear()
    f, _ = _model(None, w_elem, 4096, 4096)
    cf = _compiled(f, dynamic=True, mode="reduce-overhead" if cudagraphs else None)
    w_ref = fmt.dequantize_f64(f.q, f.e, w_elem)
    with torch.no_grad():
        for m in BUCKET_EDGES:
            x = torch.randn(m, 4096, device=DEV, dtype=torch.bfloat16)
            for _ in range(3 if cudagraphs else 1):  # under CUDA graphs: record, then replay
                y = cf(x)
            assert _rel(y, x.double() @ w_ref.t()) <= 1e-2, (w_elem, m)
    decisions = [d for r in qlower.all_reports() for d in r]  # none at all: the pass never ran, a failure
    assert decisions and all(d.lowered for d in decisions), [r.table() for r in qlower.all_reports()]
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


@pytest.mark.parametrize("elem", ["e4m3", "e5m2"])
@pytest.mark.parametrize("m", [1, 3, 9, 64])
def test_every_fp8_code_decodes_as_torch(elem, m):
    """Row n of the weight holds fp8 code n, then zeros; x = 1: out[:, n] is code n's value (NaN, Inf too),
    through whichever kernel `qlower::mx_linear` picks at this M (BITS / CVT decoders, the fp8 casts)."""
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE

    dtype = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[elem]
    n, k = 256, 256
    wq = torch.zeros(n, k, dtype=torch.uint8, device=DEV)
    wq[:, 0] = torch.arange(256, dtype=torch.uint8, device=DEV)
    want = wq[:, 0].view(dtype).float().expand(m, n)
    wc = torch.full((n, k // 32), 127, dtype=torch.uint8, device=DEV)
    x = torch.ones(m, k, dtype=torch.bfloat16, device=DEV)
    out = torch.ops.qlower.mx_linear(
        x, None, wq, fmt.to_swizzled(wc), None, 0, ELEM_CODE[elem], False, True, torch.float32
    )
    assert torch.equal(out.isnan(), want.isnan())
    assert torch.equal(out.nan_to_num(), want.nan_to_num())


@pytest.mark.parametrize("m", [1, 3, 9, 40, 300])
def test_mx_bf16_decodes_every_code_pair_exactly(m):
    """`mx_bf16`'s PTX decode, for every (e8m0 code, e2m1 code) pair: row r of the weight has scale code r,
    its bytes run through all 256 (every element code at every nibble). x = a one-hot row per K position
    reads weights back exactly (bf16 products with one 1.0, fp32 sums of zeros), so each M's kernel (tiles,
    split-K, dequantize + cuBLAS) must return the float64 dequantization rounded to bf16, subnormals included. Code
    255 is NaN (OCP MX spec) and codes 253-254 overflow some elements to inf, which a one-hot dot turns into
    NaN for the whole output row (0 * inf), so rows 0-252 are compared."""
    n, k = 253, 512
    q = torch.arange(256, dtype=torch.uint8, device=DEV).repeat(n, 1)
    e = torch.arange(n, dtype=torch.uint8, device=DEV)[:, None].repeat(1, k // 32).contiguous()
    want = fmt.dequantize_f64(q, e, "e2m1").to(torch.bfloat16)
    x = torch.eye(k, device=DEV, dtype=torch.bfloat16).repeat(cdiv_rows(m, k), 1)[:m]
    y = torch.ops.qlower.mx_linear(x, None, q, e, None, 0, 3, False, False, torch.bfloat16)
    assert torch.equal(y.float(), want.t()[torch.arange(m, device=DEV) % k].float())  # -0.0 sums to +0.0


def _lowering_at(a_elem: str | None, w_elem: str, m: int, pref: str, n: int, k: int) -> str:
    """What AUTO picks for a static M: qlower's CUTLASS MXFP4 GEMM in its M range where it is built for this
    GPU (weight-only MXFP4, `devices/crossovers.py: CUTLASS_MXFP4_M_RANGE`), else the Triton MX op."""
    from qlower.lowerings.devices.crossovers import CUTLASS_MXFP4_M_RANGE
    from qlower.lowerings.kernels.cutlass import build as cutlass_build
    from qlower.lowerings.kernels.cutlass.configs import MXFP4_K_MULTIPLE, MXFP4_N_MULTIPLE

    lo, hi = CUTLASS_MXFP4_M_RANGE or (1, 0)
    in_range = lo <= m and (hi is None or m <= hi)
    cutlass = (
        pref == "AUTO"
        and a_elem is None
        and w_elem == "e2m1"
        and in_range
        and k % MXFP4_K_MULTIPLE == 0
        and n % MXFP4_N_MULTIPLE == 0
        and torch.cuda.get_device_capability() == (9, 0)
        and not isinstance(cutlass_build.library(), str)
    )
    return "cutlass.mxfp4_weight_only" if cutlass else "triton.mx_linear"


def cdiv_rows(m: int, k: int) -> int:
    return (m + k - 1) // k


@pytest.mark.parametrize(
    "a_elem,w_elem,m,pref",
    [
        (None, "e2m1", 1, "AUTO"),  # the f16x2 GEMV
        (None, "e2m1", 9, "AUTO"),  # `mx_bf16` tiles (M 3-16, then 33-64 below)
        (None, "e2m1", 40, "AUTO"),  # the CUTLASS MXFP4 GEMM where it is built (sm_90), else `mx_bf16` tiles
        (None, "e2m1", 300, "AUTO"),  # `mx_bf16` dequantize + cuBLAS
        (None, "e4m3", 1, "AUTO"),  # the f16x2 GEMV, fp8 weights
        (None, "e4m3", 9, "AUTO"),  # the mx_decode dot kernel
        ("e4m3", "e4m3", 2, "AUTO"),  # the byte-wise GEMV (MX activations)
        ("e4m3", "e4m3", 64, "TRITON"),  # fp8 tensor-core tiles (scales per 32-chunk sum)
    ],
)
def test_special_scale_codes_match_the_eager_model(a_elem, w_elem, m, pref):
    """The hand-written form's fp32 `exp2(code - 127)` is +inf at e8m0 code 255 (and 2**-127 at code 0); qlower
    records it and each kernel family must give the eager model's NaN and +-inf positions. Row 7's block 0 is
    all 1.0 under a positive x block: +inf in the graph (NaN with the spec's decode). Row 3's block 1 holds a
    zero element: NaN in the graph (0 * inf), where a kernel multiplying block sums by the scale gives +-inf.
    Row 5's block 2 has code 0. Row 6's block 0 has the finite code 250 (2**123) over one 0.5 element: its
    products are finite, and a kernel folding a factor > 1 into that scale made them inf (or 0 * inf NaN)."""
    n, k = 256, 512
    f, _ = _model(a_elem, w_elem, n, k)
    qb = f.q.view(torch.uint8)
    per = 16 if w_elem == "e2m1" else 32  # bytes per 32-element block
    f.e[3, 1], f.e[7, 0], f.e[5, 2], f.e[6, 0] = 255, 255, 0, 250
    qb[3, per] = 0
    qb[7, :per] = 0x22 if w_elem == "e2m1" else 0x38
    qb[6, :per] = 0
    qb[6, 0] = 0x01 if w_elem == "e2m1" else 0x30  # element 0 is 0.5
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    x[:, :32] = x[:, :32].abs() + 0.5
    ref = f(x)
    assert ref[:, 7].isposinf().all() and ref[:, 3].isnan().all()
    y = _compiled(f, kernel_preference=pref)(x)
    assert [d.lowering for d in qlower.last_report()] == [_lowering_at(a_elem, w_elem, m, pref, n, k)]
    assert torch.equal(y.isnan(), ref.isnan())
    assert torch.equal(y == float("inf"), ref == float("inf"))
    assert torch.equal(y == float("-inf"), ref == float("-inf"))
    assert ref[:, 6].isfinite().all() and y[:, 6].isfinite().all()
    assert _rel(y[:, 6], ref[:, 6].double()) <= 1e-2
    fin = ref.isfinite()
    fin[:, 6] = False  # 2**122-sized: the rest's error would not show next to it
    assert _rel(y[fin], ref[fin].double()) <= 1e-2
