"""qlower's Triton kernels as `torch.library.triton_op`s.

A triton_op is traceable: under functionalization it decomposes into `triton_kernel_wrapper_functional`
nodes, which Inductor compiles into the generated code (torch.compile) or the .so (AOTInductor): no Python
and no proxy executor at run time. In eager mode the same function launches the kernels directly.

Not using `from __future__ import annotations`: `triton_op` infers the schema from the live annotations.
"""

from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from qlower.lowerings.kernels.triton import configs, interpreted
from qlower.lowerings.kernels.triton.configs import KernelConfig
from qlower.lowerings.kernels.triton.int8.hopper import int8_mm_tma_dev_kernel, woq_mm_tma_dev_kernel
from qlower.lowerings.kernels.triton.int8.kernels import (
    qlinear_mm_kernel,
    woq_dequant_kernel,
    woq_int8_gemv_kernel,
)
from qlower.lowerings.kernels.triton.int8.woq_decode import woq_decode_kernel
from qlower.lowerings.kernels.triton.int8.woq_limbs import MAX_K as LIMBS_MAX_K
from qlower.lowerings.kernels.triton.int8.woq_limbs import woq_limb_mm_kernel, x_limbs_kernel
from qlower.lowerings.kernels.triton.launch_args import (
    Leaf,
    branch_on_m,
    cdiv,
    flat,
    is_static,
    m_range_gate,
    python_wrapper,
)
from qlower.lowerings.kernels.triton.splitk import reduce_into
from qlower.lowerings.kernels.triton.tuned import current_device_name


def round_code(dtype: torch.dtype, round_scale: bool) -> int:
    """The kernels' ROUND_WS (`kernels.load_scale`): 0 takes the scale as it is; 1 / 2 round an fp32
    scale to bf16 / fp16 first, as the graph's cast of torchao's fp32 scale did
    (`patterns.record.ScaleCast`)."""
    if not round_scale:
        return 0
    codes = {torch.bfloat16: 1, torch.float16: 2}
    if dtype not in codes:
        raise ValueError(f"qlower: a weight scale is rounded to bf16 or fp16 only, not {dtype}")
    return codes[dtype]


def _launch(
    cfg: KernelConfig,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    gate: Any,
    round_ws: int = 0,
) -> None:
    """One kernel launch; `gate` (1, 0, or a 0/1 SymInt) multiplies the grid so a dynamic-M branch can be off;
    `round_ws` is the kernels' ROUND_WS (`round_code`)."""
    m = a.shape[0]
    n, k = w.shape  # static (supports() requires it); a's K equals it
    if cfg.kernel == "tma":
        if _tma_unsupported(a, w, out, gate) is None:
            _launch_tma(cfg, a, w, ws, xs, bias, out, gate, round_ws)
            return
        cfg = configs.TMA_FALLBACK if a.dtype == torch.int8 else configs.WOQ_TMA_FALLBACK
    ws1, s_ws = flat(ws)
    b1, s_b = flat(bias) if bias is not None else (ws1, 0)
    even_k = k % cfg.block_k == 0
    common = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.kernel == "decode":
        assert a.dtype != torch.int8 and xs is None and cfg.split_k == 1, "decode: woq-int8, no split-K"
        # grid (N tiles, M tiles, 1): one program covers the whole K
        grid = (cdiv(n, cfg.block_n) * gate, cdiv(m, cfg.block_m), 1)
        wrap_triton(woq_decode_kernel)[grid](
            a, w, ws1, b1, out, m, n, k,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), s_ws, s_b, out.stride(0), out.stride(1),
            HAS_BIAS=bias is not None, USE_DOT=cfg.swap_ab, EVEN_K=even_k,
            CVT=_conversion_here(cfg.cvt, a), EVICT="evict_first", ACC3=cfg.acc3, PREFETCH=False,
            ROUND_WS=round_ws, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, **common,
        )  # fmt: skip
        return
    if cfg.kernel == "limbs":
        _launch_limbs(cfg, a, w, ws, bias, out, round_ws, gate)
        return
    if cfg.kernel == "gemv":
        grid = (cdiv(n, cfg.block_n) * gate, cdiv(m, cfg.block_m), cfg.split_k)
        wrap_triton(woq_int8_gemv_kernel)[grid](
            a, w, ws1, b1, out, m, n, k,
            a.stride(0), a.stride(1), w.stride(0), w.stride(1), s_ws, s_b, out.stride(0), out.stride(1),
            HAS_BIAS=bias is not None, SPLIT_K=cfg.split_k, EVEN_K=even_k, FAST_CVT=cfg.fast_cvt,
            ROUND_WS=round_ws, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, **common,
        )  # fmt: skip
        return
    if cfg.swap_ab and cfg.num_warps > 4:
        raise ValueError(
            f"qlower: swap-AB tiles on more than 4 warps are refused ({cfg}): on sm_90 (Triton 3.6) "
            "mm 128x128x64 w8 swap gave NaN or wrong rows at M > 128, N = 14336, with every int8 conversion"
        )
    xs1, s_xs = flat(xs) if xs is not None else (ws1, 0)
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * gate, cfg.split_k, 1)
    wrap_triton(qlinear_mm_kernel)[grid](
        a, w, ws1, xs1, b1, out, m, n, k,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), s_ws, s_xs, s_b, out.stride(0), out.stride(1),
        INT8_A=a.dtype == torch.int8, HAS_XS=xs is not None, HAS_BIAS=bias is not None, SWAP_AB=cfg.swap_ab,
        SPLIT_K=cfg.split_k, EVEN_K=even_k, FAST_CVT=_conversion_here(int(cfg.fast_cvt), a),
        ROUND_WS=round_ws, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        **common,
    )  # fmt: skip


def _launch_limbs(
    cfg: KernelConfig,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    round_ws: int = 0,
    gate: Any = 1,
) -> None:
    """woq-int8 on int8 tensor cores (woq_limbs.py): x -> three int8 digit planes and row scales, then one GEMM.
    Both launches and the scratch are gated like every other launch here (a dynamic-M range off: no work)."""
    m = a.shape[0]
    n, k = w.shape
    if k > LIMBS_MAX_K:  # no table entry or rule picks this kernel now; a sweep must not pass more
        raise ValueError(f"the int8-limb kernel keeps int32 sums exact for K <= {LIMBS_MAX_K}, got K={k}")
    limbs = torch.empty((3, m * gate, k), dtype=torch.int8, device=a.device)
    rs = torch.empty((m * gate,), dtype=torch.float32, device=a.device)
    wrap_triton(x_limbs_kernel)[(m * gate,)](
        a, limbs, rs, m, k, a.stride(0), a.stride(1), BLOCK=1024, num_warps=4
    )  # fmt: skip
    ws1, s_ws = flat(ws)
    b1, s_b = flat(bias) if bias is not None else (ws1, 0)
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n) * gate, 1, 1)
    wrap_triton(woq_limb_mm_kernel)[grid](
        limbs, rs, w, ws1, b1, out, m, n, k, w.stride(0), w.stride(1), s_ws, s_b, out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, EVEN_K=k % cfg.block_k == 0, ROUND_WS=round_ws, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip


def _conversion_here(cvt: int, a: torch.Tensor) -> int:
    """The int8 conversion a kernel gets (`woq_decode_kernel`'s CVT, `qlinear_mm_kernel`'s FAST_CVT): inline
    PTX (2, 3) only on an NVIDIA GPU outside the interpreter; elsewhere (TRITON_INTERPRET on CPU tensors,
    ROCm) the magic-number form (1) in Triton ops, which gives the same values (all are exact)."""
    ptx_runs = a.device.type == "cuda" and torch.version.hip is None and not interpreted()
    return cvt if cvt < 2 or ptx_runs else 1


def _aligned(x: Any) -> bool:
    return is_static(x) and int(x) % 16 == 0


def _tma_unsupported(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, gate: Any) -> str | None:
    """Why the TMA kernel cannot serve this launch (None: it can). TMA needs sm_90, 16-byte aligned bases and
    row strides, unit inner strides. A symbolic M is fine: the persistent grid is min(programs, tiles) * gate."""
    if a.device.type != "cuda" or torch.version.hip is not None:  # ROCm reports capability 9.x for gfx94x
        return "not an NVIDIA GPU"
    if torch.cuda.get_device_capability(a.device)[0] != 9:
        return "not an sm_90 GPU"
    if w.dtype != torch.int8 or a.dtype not in (torch.int8, torch.bfloat16, torch.float16):
        return "an int8 weight and int8, bf16 or fp16 activations only"
    if a.stride(1) != 1 or w.stride(1) != 1 or out.stride(1) != 1:
        return "inner strides must be 1"
    for t in (a, w, out):
        if not (_aligned(t.stride(0) * t.element_size()) and _aligned(t.storage_offset() * t.element_size())):
            return "rows and bases must be 16-byte aligned"
    return None


def _ensure_allocator() -> None:
    """Device-built TMA descriptors need Triton's scratch allocator. Inductor's launcher provides one; eager
    launches get a torch one, unless the user has set their own."""
    import triton

    try:
        from triton.runtime import _allocation

        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())
    )


def _launch_tma(
    cfg: KernelConfig,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    gate: Any = 1,
    round_ws: int = 0,
) -> None:
    """The persistent TMA GEMM: min(programs per SM x #SMs, #tiles) programs walk the output tiles (none at M = 0
    or with the dynamic-M gate off)."""
    _ensure_allocator()
    m = a.shape[0]
    n, k = w.shape
    ws1, s_ws = flat(ws)
    xs1, s_xs = flat(xs) if xs is not None else (ws1, 0)
    b1, s_b = flat(bias) if bias is not None else (ws1, 0)
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    # 4 SMs in the interpreter
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    programs = (
        min(cfg.progs_per_sm * sms, tiles)
        if is_static(tiles)
        else torch.sym_min(cfg.progs_per_sm * sms, tiles)
    )
    grid = (programs * gate, 1, 1)
    if a.dtype != torch.int8:
        assert xs is None, "woq-int8 has no activation scale"
        if cfg.swap_ab:
            raise ValueError(
                f"qlower: the TMA woq kernel has no swap-AB variant ({cfg}; it lost every point)"
            )
        wrap_triton(woq_mm_tma_dev_kernel)[grid](
            a, w, out, ws1, b1, m, n, k, a.stride(0), w.stride(0), out.stride(0), s_ws, s_b,
            HAS_BIAS=bias is not None, FAST_CVT=_conversion_here(int(cfg.fast_cvt), a),
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, FLATTEN=True,
            ROUND_WS=round_ws, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        return
    wrap_triton(int8_mm_tma_dev_kernel)[grid](
        a, w, out, ws1, xs1, b1, m, n, k, a.stride(0), w.stride(0), out.stride(0), s_ws, s_xs, s_b,
        HAS_XS=xs is not None, HAS_BIAS=bias is not None, EPI_TMA=True, EPI_SPLIT=2,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, FLATTEN=True,
        WARP_SPEC=False, ROUND_WS=round_ws, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _run(
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    static_cfg: Any,
    table: Any,
    dense_above: int = 0,
    as_dynamic: bool = False,
    host_branch: bool = False,
    round_ws: int = 0,
    dense_cutlass: bool = False,
) -> torch.Tensor:
    """Static M: the device table's config for M. Symbolic M: per M range of `configs.dynamic_plan` the kernel
    a static M there gets, chosen on the host from the size without a guard or a device sync, in one of two
    forms. `host_branch` (no CUDA graphs, AOTInductor): `torch.cond` on M, which Inductor generates as an `if`
    in the wrapper, so one call launches one kernel. Otherwise one launch per range, its grid gated by M to 0
    or 1 programs' worth (CUDA graphs capture only the launch that runs; Inductor refuses to capture a graph
    holding a `torch.cond` on CUDA tensors). `dense_above` > 0 (woq-int8 under AUTO): M above it takes dequant
    + cuBLAS instead, as the static lowering does there, or with `dense_cutlass` qlower's CUTLASS GEMM
    (`kernels/cutlass/w8a16.py`; the scale and bias then of x's dtype, `round_ws` 0). `as_dynamic`: a concrete M takes the gated path (its
    gates are then 0/1 ints; tests check every bucket that way). `round_ws`: every launch's ROUND_WS
    (`round_code`)."""
    m = a.shape[0]
    n, k = w.shape
    device = current_device_name(a.device)
    if is_static(m) and not as_dynamic:
        return _launch_all(
            [(static_cfg(int(m), k, n, device), 1)], a, w, ws, xs, bias, out_dtype, None, round_ws
        )
    plan = configs.dynamic_plan(static_cfg, table, k, n, device, max_m=dense_above or None)
    if host_branch and not as_dynamic:
        return _branch_on_m(plan, dense_above, a, w, ws, xs, bias, out_dtype, round_ws, dense_cutlass)
    launches = [(cfg, g) for lo, hi, cfg in plan if (g := m_range_gate(m, lo, hi)) is not None]
    dense = (
        _dense_above(a, w, ws, bias, out_dtype, dense_above, round_ws, dense_cutlass) if dense_above else None
    )
    return _launch_all(launches, a, w, ws, xs, bias, out_dtype, dense, round_ws)


def _branch_on_m(
    plan: list[tuple[int, int | None, KernelConfig]],
    dense_above: int,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    round_ws: int = 0,
    dense_cutlass: bool = False,
) -> torch.Tensor:
    """Per range of the plan M can reach (`m_range_gate`: never pruning M = 1) one ungated launch of its
    kernel, then dequant + cuBLAS above `dense_above`, chosen by `branch_on_m`'s host `if`s."""
    m = a.shape[0]

    def leaf(cfg: KernelConfig | None) -> Any:
        def run(a_: Any, w_: Any, ws_: Any, xs_: Any, b_: Any) -> torch.Tensor:
            if cfg is None:
                return _dense(a_, w_, ws_, b_, out_dtype, round_ws=round_ws, cutlass=dense_cutlass)
            return _launch_all([(cfg, 1)], a_, w_, ws_, xs_, b_, out_dtype, None, round_ws)

        return run

    leaves: list[Leaf] = [(hi, leaf(cfg)) for lo, hi, cfg in plan if m_range_gate(m, lo, hi) is not None]
    if dense_above and m_range_gate(m, dense_above + 1, None) is not None:
        leaves.append((None, leaf(None)))
    return branch_on_m(leaves, (a, w, ws, xs, bias))


def _dense_above(
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    above: int,
    round_ws: int = 0,
    cutlass: bool = False,
) -> torch.Tensor | None:
    """The output of cuBLAS on the dequantized weight where M > `above`; where M <= above, the same GEMM with K
    gated to 0 (no weight built, no GEMM: cuBLAS only fills the output, which the Triton launches then write).
    None where M > above is impossible (an export `Dim` whose max is <= above): nothing to build."""
    g = m_range_gate(a.shape[0], above + 1, None)
    if g is None:
        return None
    return _dense(a, w, ws, bias, out_dtype, g, round_ws, cutlass)


# The dequantize kernel's tile (N rows x K columns, 4 warps): 46.3 / 46.5 us for a 4096->14336 / 14336->4096
# weight on sm_90, against 49.0 / 49.0 for 32 x 128 and an HBM bound of 36.7 (read int8, write bf16); nine
# tiles timed (BENCHMARKS.md, "CUDA, woq_int8", large M).
DEQUANT_TILE = (32, 256)


def _dense(
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    gate: Any = 1,
    round_ws: int = 0,
    cutlass: bool = False,
) -> torch.Tensor:
    """Dequantize the weight (the scale folded in: one rounding of w * s per element) and run cuBLAS, or with
    `cutlass` run qlower's CUTLASS W8A16 GEMM on the int8 weight; `gate` (1, or a 0/1 SymInt) multiplies K
    (and the dequantization grid): with K = 0 either only fills the output."""
    n, k = w.shape
    ungated = isinstance(gate, int) and gate == 1
    if not ungated and python_wrapper():  # the gate as an argument: no operand sized by it
        out = torch.ops.qlower.woq_int8_dense_gated(a, w, ws, bias, gate, round_ws, cutlass)
        return out if out.dtype == out_dtype else out.to(out_dtype)
    kg = k if ungated else k * gate  # a C++ wrapper (no Python op there): K gated to 0 below the range
    if cutlass:
        from qlower.lowerings.kernels.cutlass import w8a16  # noqa: F401  (registers qlower::woq_int8_cutlass)

        assert round_ws == 0, "the CUTLASS GEMM takes the scale in x's dtype as the graph has it"
        a_k, w_k = (a, w) if ungated else (a.narrow(1, 0, kg), w.narrow(1, 0, kg))
        b = bias.to(a.dtype) if bias is not None else None
        out = torch.ops.qlower.woq_int8_cutlass(a_k, w_k, ws.reshape(-1).to(a.dtype), b)
        return out if out.dtype == out_dtype else out.to(out_dtype)
    wd = torch.empty((n, kg), dtype=a.dtype, device=a.device)
    ws1, s_ws = flat(ws)
    bn, bk = DEQUANT_TILE
    wrap_triton(woq_dequant_kernel)[(cdiv(n, bn) * gate, cdiv(k, bk), 1)](
        w, ws1, wd, n, k, w.stride(0), w.stride(1), s_ws, k, 1, ROUND_WS=round_ws, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=4,
    )  # fmt: skip
    a_k = a if ungated else a.narrow(1, 0, kg)
    out = torch.mm(a_k, wd.t()) if bias is None else torch.addmm(bias.to(a.dtype), a_k, wd.t())
    return out if out.dtype == out_dtype else out.to(out_dtype)


@torch.library.custom_op("qlower::woq_int8_dense_gated", mutates_args=())
def woq_int8_dense_gated(
    x: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    gate: int,
    round_ws: int,
    cutlass: bool,
) -> torch.Tensor:
    """`_dense` (dequantize + cuBLAS, or with `cutlass` qlower's CUTLASS GEMM) in x's dtype where `gate` is 1;
    where it is 0 (a symbolic M outside the range: a 0/1 SymInt at trace time) only the bias, or zeros, for the
    Triton launches to overwrite. Opaque to the compiler, so no operand is sized by the gate: Inductor's
    post-grad passes re-evaluate the sizes of x and the weight narrowed to K * gate, and of a weight buffer of
    N x K * gate, and each was a guard on M there (a recompile per M range; tests/lowerings/emit/
    test_no_guards_on_m.py). Emitted only where the wrapper is Python (custom_ops.PYTHON_RUNTIME_ONLY)."""
    m, n = x.shape[0], w.shape[0]
    if gate == 0 or m == 0:
        out = torch.zeros((m, n), dtype=x.dtype, device=x.device)
        return out if bias is None else out.add_(bias.to(x.dtype))
    return _dense(x, w, ws, bias, x.dtype, 1, round_ws, cutlass)


@woq_int8_dense_gated.register_fake
def _(
    x: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    bias: torch.Tensor | None,
    gate: int,
    round_ws: int,
    cutlass: bool,
) -> torch.Tensor:
    return x.new_empty((x.shape[0], w.shape[0]))


def _launch_all(
    launches: list[tuple[KernelConfig, Any]],
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
    round_ws: int = 0,
) -> torch.Tensor:
    """Run the launches into `out` (None: a new [M, N] buffer). A split-K launch adds its K slices by fp32
    atomics into zeros: alone (a static M), into its own buffer, cast as a whole; gated (one range of a
    symbolic M), into a buffer of M * gate rows, cast into `out` by a reduce launch gated alike, so that it
    shares `out` with the other ranges and costs nothing where its range does not run."""
    m = a.shape[0]
    n = w.shape[0]
    alone = out is None and len(launches) == 1 and is_static(launches[0][1]) and int(launches[0][1]) == 1
    if alone and launches[0][0].split_k > 1:
        acc = torch.zeros((m, n), dtype=torch.float32, device=a.device)
        _launch(launches[0][0], a, w, ws, xs, bias, acc, 1, round_ws)
        return acc.to(out_dtype)
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    for cfg, gate in launches:
        if cfg.split_k == 1:
            _launch(cfg, a, w, ws, xs, bias, out, gate, round_ws)
            continue
        # at least two rows: a size that M's range lets be 0 or 1 becomes a guard on M where Inductor's post-grad
        # passes re-run the kernel wrapper's fake (its clone of the mutated buffer asks whether the size is 0, and
        # whether it is 1), as a symbolic M itself is taken to be at least 2 (tests/lowerings/emit/
        # test_no_guards_on_m.py); the rows beyond M are never read
        acc = torch.zeros((torch.sym_max(2, m * gate), n), dtype=torch.float32, device=a.device)
        _launch(cfg, a, w, ws, xs, bias, acc, gate, round_ws)
        reduce_into(out, acc, gate, launch=wrap_triton, rows=m)
    return out


@triton_op("qlower::woq_int8_linear", mutates_args=())
def woq_int8_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    dense_above: int = 0,
    host_branch: bool = False,
    round_scale: bool = False,
    dense_cutlass: bool = False,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16) @ (w [N, K] int8 * w_scale [N] or [1]).T + bias [N] -> [M, N] in x's dtype.
    `dense_above` > 0: a symbolic M above it runs dequant + cuBLAS (AUTO's crossover), not the Triton kernels;
    with `dense_cutlass` it runs qlower's CUTLASS GEMM there instead.
    `host_branch`: a symbolic M picks its kernel with `torch.cond`, not gated grids (`_run`).
    `round_scale`: w_scale (fp32) is rounded to x's dtype before use, as the graph's own cast of it did."""
    return _run(
        x, w, w_scale, None, bias, x.dtype, configs.woq_int8_config, configs.WOQ_INT8_TUNED, dense_above,
        host_branch=host_branch, round_ws=round_code(x.dtype, round_scale), dense_cutlass=dense_cutlass,
    )  # fmt: skip


@triton_op("qlower::int8_dynamic_linear", mutates_args=())
def int8_dynamic_linear(
    x_q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    host_branch: bool = False,
) -> torch.Tensor:
    """(x_q [M, K] int8 @ w [N, K].T int8 -> int32) * x_scale [M] * w_scale [N] + bias -> [M, N] out_dtype.
    `host_branch`: a symbolic M picks its kernel with `torch.cond`, not gated grids (`_run`)."""
    return _run(
        x_q, w, w_scale, x_scale, bias, out_dtype, configs.dynamic_int8_config, configs.DYNAMIC_INT8_TUNED,
        host_branch=host_branch,
    )  # fmt: skip


def launch_config(
    cfg: KernelConfig,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    round_scale: bool = False,
) -> torch.Tensor:
    """Eager launch with an explicit config (tuning sweeps and kernel tests)."""
    round_ws = round_code(a.dtype, round_scale)
    return _launch_all([(cfg, 1)], a, w, ws, xs, bias, out_dtype or a.dtype, None, round_ws)


def launch_as_dynamic(
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    dense_above: int = 0,
    round_scale: bool = False,
    dense_cutlass: bool = False,
) -> torch.Tensor:
    """Eager run of the launches a symbolic M gets (woq-int8 for float `a`, dynamic-int8 for int8 `a`), at
    this concrete M: every gate is 0 or 1, so tests can check that each M meets exactly one right kernel."""
    if a.dtype == torch.int8:
        static_cfg, table = configs.dynamic_int8_config, configs.DYNAMIC_INT8_TUNED
    else:
        static_cfg, table = configs.woq_int8_config, configs.WOQ_INT8_TUNED
    round_ws = round_code(a.dtype, round_scale)
    return _run(
        a, w, ws, xs, bias, out_dtype or a.dtype, static_cfg, table, dense_above, as_dynamic=True,
        round_ws=round_ws, dense_cutlass=dense_cutlass,
    )  # fmt: skip
