"""GPU experiment: Hopper TMA / persistent int8 GEMM variants against qlower's current dynamic-int8 kernel.

    cd /work/main-copy && python -m pip install -q --no-deps --no-build-isolation . \
        && python -P scripts/gpu_exp_int8.py            # writes $OUT/int8_exp.json (OUT defaults to ./out)

What it answers, in one run of <= 4 minutes on one H200:
1. Which of the kernels in `qlower.lowerings.triton_kernels.int8_hopper` (device- or host-built TMA
   descriptors, persistent or not, tiles, stages, epilogue form) compile on sm_90 with this Triton, are
   correct (float64 reference, rel err <= 1e-2), and how fast they are next to bf16 F.linear, cuBLAS
   `torch._int_mm` (+ rescale) and `qlinear_mm_kernel` with its table config, at four (M, K, N).
2. Whether Inductor accepts them: a small model calling a `triton_op` built on each kernel kind, and
   qlower's own dynamic-int8 lowering with `ops._launch` patched to launch the new kernel (the inline path),
   each under `torch.compile`: runs, matches, the generated code launches the kernel, which arguments
   functionalization thinks are written (a wrongly written input costs a full copy per call).
3. The whole compiled model (Inductor's per-token quantize prologue + kernel) with the stock kernel and the
   best new one, and the prologue alone.

Compiles happen first in child processes, several at once and each alone: a variant that crashes the
compiler (an LLVM fatal error aborts the process), hangs, or faults on the GPU costs only its child, and
the parent then loads the compiled kernels from Triton's on-disk cache. Children compile at small shapes
with the same specialization (every size and stride a multiple of 16) as the timed ones.

Timing: `gpu_time_us`, copied from scripts/bench_cuda_kernels.py: median over CUDA-graph replays of 8 calls
that rotate over 8 weight sets (weights come from HBM, activations stay hot), per call.

Fields of int8_exp.json:
- env: versions, GPU, #SMs, SHAPES, the variant definitions (tile bm x bn x bk, warps, stages, persistent,
  progs_per_sm, flatten, ws = warp_specialize, epi = ptr | tma | tma2, group_m).
- children["variant:NAME" | "existing:CFG"]: ok, compile_s (first launch incl. compile), rel_err at SMALL,
  ragged_bias_rel_err (ragged M/K + bias, some variants), error / log_tail (crash or timeout), child_wall_s.
- children["inductor:KIND:ROUTE"] (KIND dev | host; ROUTE qlower | direct_triton_op): ok (compiled, launches
  the kernel from generated code, no Python fallback, rel_err <= 1e-2), launches_kernel, python_fallback,
  host_descriptors_in_wrapper, clone_calls (in generated code), error_without_allocator (dev kernels: what
  failed before an allocator was set), lowering (qlower's report), functional_trace.tensors_to_clone (the
  kernel args functionalization treats as written: only the output should be there), error.
- kernels[]: per (m, k, n): bf16_us (F.linear, bf16 weight), int_mm_us (cuBLAS `_int_mm` alone),
  int_mm_rescale_us (+ eager rescale to bf16), existing_us / existing_cfg (qlinear_mm_kernel, table config),
  *_tops (2MNK / time), variants[NAME] = {us, tops, rel_err, vs_bf16, vs_existing} or {skipped | error},
  best / best_dev / best_host (fastest correct variant overall / per descriptor kind).
- prologue[]: compiled per-token quantize alone, us per (m, k).
- compiled[]: whole model (prologue + GEMM) under torch.compile + qlower: stock_* (qlinear_mm_kernel),
  dev_* / host_* (best variant of that kind patched into ops._launch): *_us, *_vs_bf16, *_err,
  *_launches_kernel, *_python_fallback, *_clone_calls, *_compile_s, *_variant, *_error / *_skipped.
- wall_s; phase_errors; watchdog (set when the time budget ran out).

`--cpu-check` runs the kernels in Triton's interpreter (TRITON_INTERPRET=1) at tiny shapes, fp32 output.

No `from __future__ import annotations`: `triton_op` reads the live annotations of the ops defined here.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

T0 = time.time()  # before importing torch: the 4-minute budget counts that import
if "--cpu-check" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.library import triton_op, wrap_triton  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python -P` leaves scripts/ off the path
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from cuda_timing import gpu_time_us  # noqa: E402

from qlower.lowerings.triton_kernels.int8_hopper import _mm_tiles  # noqa: E402
from qlower.lowerings.triton_kernels.launch_args import flat  # noqa: E402


@triton.jit
def int8_mm_tma_host_kernel(
    a_desc,
    w_desc,
    o,
    ws_ptr,
    xs_ptr,
    b_ptr,
    M,
    N,
    K,
    stride_om,
    stride_ws,
    stride_xs,
    stride_b,
    HAS_XS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EPI_TMA: tl.constexpr,
    EPI_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
    WARP_SPEC: tl.constexpr,
):
    """Same GEMM with host-built descriptors: a_desc block [BM, BK], w_desc [BN, BK], and `o` the output's
    descriptor (block [BM, BN // EPI_SPLIT]) when EPI_TMA, else the output pointer (stride_om used).

    Passing the output once (descriptor or pointer, never both) keeps Inductor's mutation analysis and
    re-inplacing simple: one argument is written, and it is a fresh buffer.
    """
    _mm_tiles(
        a_desc, w_desc, o, ws_ptr, xs_ptr, b_ptr, M, N, K, stride_om, stride_ws, stride_xs, stride_b,
        HAS_XS, HAS_BIAS, EPI_TMA, EPI_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, FLATTEN, WARP_SPEC,
    )  # fmt: skip


BUDGET_S = 228.0  # the parent stops starting work here; the watchdog ends it at BUDGET_S + 8
N_WEIGHTS = 8
SHAPES = ((4096, 4096, 14336), (4096, 4096, 4096), (1024, 4096, 14336), (256, 4096, 14336))
SMALL = (512, 512, 768)  # child compile shape: same specialization as SHAPES (all multiples of 16)
RAGGED = (200, 272, 520)  # M, K not multiples of the tiles, N % 8 == 0 (TMA store needs 16-byte rows)
PROBE_SHAPE = (256, 512, 768)
MAX_REL_ERR = 1e-2
CHILD_TIMEOUT_S = 90.0
KERNEL_NAMES = ("int8_mm_tma_dev_kernel", "int8_mm_tma_host_kernel")


def log(*a: Any) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def left_s() -> float:
    return BUDGET_S - (time.time() - T0)


# ---------------------------------------------------------------- variants
@dataclass(frozen=True)
class Variant:
    """One launch of an int8_hopper kernel: descriptor kind, tile, warps/stages, schedule, epilogue."""

    name: str
    desc: str  # "dev": tl.make_tensor_descriptor in the kernel; "host": TensorDescriptor arguments
    bm: int = 128
    bn: int = 256
    bk: int = 128
    warps: int = 8
    stages: int = 3
    persistent: bool = True  # grid = min(progs_per_sm * #SMs, #tiles), else one program per tile
    # 2: two resident programs per SM (small tiles), one's epilogue under the other's main loop
    progs_per_sm: int = 1
    flatten: bool = True
    ws: bool = False  # tl.range(warp_specialize=True)
    epi: str = "tma2"  # "ptr" (masked tl.store), "tma" (one TMA store), "tma2" (two N halves)
    group_m: int = 8
    ragged_check: bool = False  # children also check a ragged shape with bias (a second compile)


VARIANTS = [
    Variant("d_128x256_s3_fl_t2", "dev", ragged_check=True),
    Variant("d_128x256_s4_fl_t2", "dev", stages=4),
    Variant("d_128x256_s4_fl_ptr", "dev", stages=4, epi="ptr", ragged_check=True),
    Variant("d_128x256_s3_fl_t1", "dev", epi="tma"),
    Variant("d_128x256_s3_t2", "dev", flatten=False),
    Variant("d_128x256_s4_np_t2", "dev", stages=4, persistent=False, flatten=False),
    Variant("d_128x256_s3_fl_t2_g16", "dev", group_m=16),
    Variant("d_256x128_s4_fl_t2", "dev", bm=256, bn=128, stages=4),
    Variant("d_256x128_s3_fl_t2", "dev", bm=256, bn=128),
    Variant("d_256x128_s4_fl_ptr", "dev", bm=256, bn=128, stages=4, epi="ptr"),
    Variant("d_128x128_s4_fl_t2", "dev", bn=128, stages=4),
    Variant("d_128x128_w4_s3_fl_t2_x2", "dev", bn=128, warps=4, progs_per_sm=2),
    Variant(
        "d_128x128_w4_s4_np_ptr", "dev", bn=128, warps=4, stages=4, persistent=False, flatten=False, epi="ptr"
    ),
    Variant("d_64x256_w4_s4_fl_t2", "dev", bm=64, warps=4, stages=4),
    Variant("d_128x256x64_s6_fl_t2", "dev", bk=64, stages=6),
    Variant("d_128x256_s3_ws_t2", "dev", ws=True),
    Variant("h_128x256_s3_fl_t2", "host", ragged_check=True),
    Variant("h_128x256_s4_fl_t2", "host", stages=4),
    Variant("h_128x256_s4_fl_ptr", "host", stages=4, epi="ptr"),
]
VARIANT_BY_NAME = {v.name: v for v in VARIANTS}
# what the Inductor probes launch (conservative: no flatten, the most common tile)
PROBE_VARIANT = {
    "host": Variant("probe_h_128x256_s3_t2", "host", flatten=False),
    "dev": Variant("probe_d_128x256_s3_t2", "dev", flatten=False),
}


def _num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 4


def tma_ok(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> str | None:
    """None when the TMA kernels can serve these tensors, else why not (16-byte aligned rows, unit stride)."""
    if a.dtype != torch.int8 or w.dtype != torch.int8:
        return "int8 x int8 only"
    if a.stride(1) != 1 or w.stride(1) != 1 or out.stride(1) != 1:
        return "inner strides must be 1"
    if a.stride(0) % 16 or w.stride(0) % 16 or (out.stride(0) * out.element_size()) % 16:
        return "row strides must be 16-byte multiples"
    return None


def launch(
    v: Variant,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    gate: Any = 1,
    wrap: bool = False,
) -> None:
    """out = (a @ w.T) * ws (* xs) (+ bias) with variant `v`; `wrap` goes through wrap_triton (traced code)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from qlower.lowerings.triton_kernels import int8_hopper as H

    m, k = a.shape
    n = w.shape[0]
    ws1, s_ws = flat(ws)
    xs1, s_xs = flat(xs) if xs is not None else (ws1, 0)
    b1, s_b = flat(bias) if bias is not None else (ws1, 0)
    tiles = ((m + v.bm - 1) // v.bm) * ((n + v.bn - 1) // v.bn)
    if v.persistent:
        cap = v.progs_per_sm * _num_sms()
        progs = min(cap, tiles) if isinstance(tiles, int) else torch.sym_min(cap, tiles)
    else:
        progs = tiles
    grid = (progs * gate, 1, 1)
    split = 2 if v.epi == "tma2" else 1
    meta = dict(
        HAS_XS=xs is not None, HAS_BIAS=bias is not None, EPI_TMA=v.epi != "ptr", EPI_SPLIT=split,
        BLOCK_M=v.bm, BLOCK_N=v.bn, BLOCK_K=v.bk, GROUP_M=v.group_m, FLATTEN=v.flatten, WARP_SPEC=v.ws,
        num_warps=v.warps, num_stages=v.stages,
    )  # fmt: skip
    if v.desc == "dev":
        kern = wrap_triton(H.int8_mm_tma_dev_kernel) if wrap else H.int8_mm_tma_dev_kernel
        kern[grid](
            a, w, out, ws1, xs1, b1, m, n, k, a.stride(0), w.stride(0), out.stride(0), s_ws, s_xs, s_b, **meta
        )
    else:
        kern = wrap_triton(int8_mm_tma_host_kernel) if wrap else int8_mm_tma_host_kernel
        a_d = TensorDescriptor.from_tensor(a, [v.bm, v.bk])
        w_d = TensorDescriptor.from_tensor(w, [v.bn, v.bk])
        o = TensorDescriptor.from_tensor(out, [v.bm, v.bn // split]) if v.epi != "ptr" else out
        kern[grid](a_d, w_d, o, ws1, xs1, b1, m, n, k, out.stride(0), s_ws, s_xs, s_b, **meta)


def run_variant(
    v: Variant,
    a: torch.Tensor,
    w: torch.Tensor,
    ws: torch.Tensor,
    xs: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    out = torch.empty((a.shape[0], w.shape[0]), dtype=out_dtype, device=a.device)
    launch(v, a, w, ws, xs, bias, out)
    return out


def set_allocator() -> None:
    """Scratch for device-built descriptors (Triton asks for it at each launch of a `dev` kernel)."""
    import triton

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))


# ---------------------------------------------------------------- triton_ops for the Inductor probes
_OP_VARIANT: dict[str, Variant] = dict(PROBE_VARIANT)


@triton_op("qlower_exp::int8_mm_host", mutates_args=())
def int8_mm_host(
    x_q: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor:
    """(x_q @ w.T) * x_scale * w_scale -> bf16, host-built descriptors."""
    out = torch.empty((x_q.shape[0], w.shape[0]), dtype=torch.bfloat16, device=x_q.device)
    launch(_OP_VARIANT["host"], x_q, w, w_scale, x_scale, None, out, wrap=True)
    return out


@triton_op("qlower_exp::int8_mm_dev", mutates_args=())
def int8_mm_dev(
    x_q: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor
) -> torch.Tensor:
    """(x_q @ w.T) * x_scale * w_scale -> bf16, device-built descriptors."""
    out = torch.empty((x_q.shape[0], w.shape[0]), dtype=torch.bfloat16, device=x_q.device)
    launch(_OP_VARIANT["dev"], x_q, w, w_scale, x_scale, None, out, wrap=True)
    return out


def install_qlower_patch(v: Variant) -> Callable[[], None]:
    """Make qlower's dynamic-int8 lowering launch `v` (what ops.py would do); returns the undo."""
    from qlower.lowerings.triton_kernels import ops

    orig = ops._launch

    def patched(cfg: Any, a: torch.Tensor, w: torch.Tensor, ws: torch.Tensor, xs: torch.Tensor | None,
                bias: torch.Tensor | None, out: torch.Tensor, gate: Any) -> None:  # fmt: skip
        if cfg.kernel == "mm" and cfg.split_k == 1 and tma_ok(a, w, out) is None:
            launch(v, a, w, ws, xs, bias, out, gate, wrap=True)
        else:
            orig(cfg, a, w, ws, xs, bias, out, gate)

    ops._launch = patched
    return lambda: setattr(ops, "_launch", orig)


# ---------------------------------------------------------------- models and problems
def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xs = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-6) / 127.0
    xq = torch.clamp(torch.round(x.float() / xs), -128, 127).to(torch.int8)
    return xq, xs


def dyn_model(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Hand-written dynamic per-token int8 linear through `_int_mm` (what qlower's pattern matches)."""
    xq, xs = quantize_per_token(x)
    return ((torch._int_mm(xq, w.t()).float() * xs) * s.float()).to(x.dtype)


def direct_host(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xq, xs = quantize_per_token(x)
    return torch.ops.qlower_exp.int8_mm_host(xq, xs, w, s)


def direct_dev(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xq, xs = quantize_per_token(x)
    return torch.ops.qlower_exp.int8_mm_dev(xq, xs, w, s)


def problem(m: int, k: int, n: int, n_weights: int = N_WEIGHTS, device: str = "cuda") -> dict[str, Any]:
    g = torch.Generator(device=device).manual_seed(m * 7 + k + n)
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=g)
    w = [
        torch.randint(-127, 128, (n, k), device=device, dtype=torch.int8, generator=g)
        for _ in range(n_weights)
    ]
    s = [
        (torch.rand(n, device=device, generator=g) * 0.02 + 0.005).to(torch.bfloat16)
        for _ in range(n_weights)
    ]
    xq, xs = quantize_per_token(x)
    return {"x": x, "w": w, "s": s, "xq": xq, "xs": xs}


def dyn_ref(p: dict[str, Any], bias: torch.Tensor | None = None) -> torch.Tensor:
    r = (p["xq"].double() @ p["w"][0].double().t()) * p["xs"].double() * p["s"][0].double()[None, :]
    return r + bias.double()[None, :] if bias is not None else r


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# ---------------------------------------------------------------- timing (copied from bench_cuda_kernels.py)
def tops(m: int, k: int, n: int, us: float | None) -> float | None:
    return 2.0 * m * k * n / us / 1e6 if us else None


# ---------------------------------------------------------------- children
def _err_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:600]}"


def child_compile(job: dict[str, Any]) -> dict[str, Any]:
    """Compile one kernel config by launching it at SMALL (same specialization as the timed shapes), check it."""
    set_allocator()
    m, k, n = SMALL
    p = problem(m, k, n, n_weights=1)
    ref = dyn_ref(p)
    res: dict[str, Any] = {}
    t = time.time()
    if job["type"] == "existing":
        from qlower.lowerings.triton_kernels import configs, ops

        cfg = configs.KernelConfig(**job["cfg"])
        out = ops.launch_config(cfg, p["xq"], p["w"][0], p["s"][0], p["xs"], out_dtype=torch.bfloat16)
    else:
        v = VARIANT_BY_NAME[job["name"]]
        out = run_variant(v, p["xq"], p["w"][0], p["s"][0], p["xs"])
    torch.cuda.synchronize()
    res["compile_s"] = round(time.time() - t, 2)
    res["rel_err"] = rel_err(out, ref)
    res["ok"] = res["rel_err"] <= MAX_REL_ERR
    if job["type"] == "variant" and VARIANT_BY_NAME[job["name"]].ragged_check:
        try:
            rm, rk, rn = RAGGED
            q = problem(rm, rk, rn, n_weights=1)
            bias = torch.randn(rn, device="cuda", dtype=torch.bfloat16)
            out = run_variant(VARIANT_BY_NAME[job["name"]], q["xq"], q["w"][0], q["s"][0], q["xs"], bias)
            torch.cuda.synchronize()
            res["ragged_bias_rel_err"] = rel_err(out, dyn_ref(q, bias))
        except Exception as e:
            res["ragged_bias_error"] = _err_text(e)
    return res


def _generated_code(fn: Callable, *args: Any) -> tuple[torch.Tensor, str]:
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(fn, *args)
    return out, "\n".join(codes)


def _code_only(code: str) -> str:
    """Inductor's output without comment lines (they quote the model's source, op names included)."""
    return "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith("#"))


def _code_facts(code: str, kernel: str) -> dict[str, Any]:
    code = _code_only(code)
    return {
        "launches_kernel": kernel in code,
        "launches_old_kernel": "qlinear_mm_kernel" in code,
        "python_fallback": "torch.ops.qlower" in code,
        "host_descriptors_in_wrapper": "TensorDescriptor.from_tensor" in code,
        "allocator_in_wrapper": "set_allocator" in code,
        "clone_calls": code.count("clone"),
    }


def functional_trace_facts(kind: str, p: dict[str, Any]) -> dict[str, Any]:
    """Trace the triton_op as qlower's inline.py does; report which kernel args functionalization clones."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._subclasses.functional_tensor import FunctionalTensorMode, dispatch_functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    op = torch.ops.qlower_exp.int8_mm_host if kind == "host" else torch.ops.qlower_exp.int8_mm_dev

    def fn(xq: torch.Tensor, xs: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return op(xq, xs, w, s)

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in (p["xq"], p["xs"], p["w"][0], p["s"][0])]
    with mode:
        gm = make_fx(dispatch_functionalize(fn, FunctionalTensorMode()), tracing_mode="real")(*fakes)
    facts: dict[str, Any] = {"kernel_nodes": 0}
    for node in gm.graph.nodes:
        if "triton_kernel_wrapper" in str(node.target):
            facts["kernel_nodes"] += 1
            facts["hop"] = str(node.target)
            facts["tensors_to_clone"] = list(node.kwargs.get("tensors_to_clone", []))
            facts["tma_descriptor_metadata"] = str(node.kwargs.get("tma_descriptor_metadata", {}))
    return facts


def child_inductor(kind: str, route: str) -> dict[str, Any]:
    """Does Inductor compile a kernel of this kind, directly as a triton_op ("direct_triton_op") or through
    qlower's inline path ("qlower": the dynamic-int8 lowering with `ops._launch` patched)?

    No allocator is set first, so a `dev` kernel shows whether Inductor installs one itself.
    """
    import qlower

    torch._inductor.config.force_disable_caches = True
    torch._inductor.config.compile_threads = 1
    m, k, n = PROBE_SHAPE
    p = problem(m, k, n, n_weights=1)
    ref = dyn_ref(p)
    kernel = "int8_mm_tma_host_kernel" if kind == "host" else "int8_mm_tma_dev_kernel"
    r: dict[str, Any] = {"variant": asdict(PROBE_VARIANT[kind])}
    if route == "direct_triton_op":
        try:
            r["functional_trace"] = functional_trace_facts(kind, p)
        except Exception as e:
            r["functional_trace"] = {"error": _err_text(e)}
            traceback.print_exc()
        model = direct_host if kind == "host" else direct_dev
        undo: Callable[[], None] = lambda: None  # noqa: E731
    else:
        model = dyn_model
        undo = install_qlower_patch(PROBE_VARIANT[kind])
    try:
        opts = qlower.inductor_options() if route == "qlower" else None
        f = torch.compile(model, options=opts, fullgraph=True, dynamic=False)
        try:
            out, code = _generated_code(f, p["x"], p["w"][0], p["s"][0])
        except Exception as e:
            if kind == "dev" and "allocator" in str(e).lower():
                r["error_without_allocator"] = _err_text(e)
                set_allocator()
                out, code = _generated_code(f, p["x"], p["w"][0], p["s"][0])
            else:
                raise
        r.update(_code_facts(code, kernel))
        r["rel_err"] = rel_err(out, ref)
        r["ok"] = r["rel_err"] <= MAX_REL_ERR and r["launches_kernel"] and not r["python_fallback"]
        if route == "qlower":
            rep = qlower.last_report()
            r["lowering"] = ",".join(str(d.lowering) for d in rep) if rep else None
    except Exception as e:
        r["ok"], r["error"] = False, _err_text(e)
        traceback.print_exc()
    finally:
        undo()
    return r


def child_main(spec: str) -> None:
    job = json.loads(spec)
    try:
        res = child_inductor(job["kind"], job["route"]) if job["type"] == "inductor" else child_compile(job)
    except Exception as e:
        traceback.print_exc()
        res = {"ok": False, "error": _err_text(e)}
    print("RESULT " + json.dumps(res, default=str), flush=True)


def run_children(jobs: dict[str, dict[str, Any]], out_dir: Path, parallel: int) -> dict[str, dict[str, Any]]:
    """Run each job in its own process, `parallel` at once, each under CHILD_TIMEOUT_S; logs in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pending = list(jobs.items())
    running: dict[str, tuple[subprocess.Popen, float, Path]] = {}
    results: dict[str, dict[str, Any]] = {}
    script = os.path.abspath(__file__)
    while pending or running:
        while pending and len(running) < parallel and left_s() > 60:
            key, job = pending.pop(0)
            logf = out_dir / f"{key.replace(':', '_').replace('/', '_')}.log"
            with open(logf, "w") as fh:  # the child keeps its own copy of the descriptor
                proc = subprocess.Popen(
                    [sys.executable, "-P", script, "--child", json.dumps(job)],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                )
            running[key] = (proc, time.time(), logf)
        if pending and not running:  # out of time to start more
            for key, _ in pending:
                results[key] = {"ok": False, "error": "not started: out of time"}
            pending.clear()
        for key in list(running):
            proc, t_start, logf = running[key]
            rc = proc.poll()
            timed_out = rc is None and time.time() - t_start > CHILD_TIMEOUT_S
            if rc is None and not timed_out:
                continue
            if timed_out:
                proc.kill()
                proc.wait()
            text = logf.read_text(errors="replace")
            line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("RESULT ")), None)
            if line is not None:
                res = json.loads(line[len("RESULT ") :])
            else:
                why = "timeout" if timed_out else f"exit code {proc.returncode} (crash?)"
                res = {"ok": False, "error": why, "log_tail": text[-1500:]}
            res["child_wall_s"] = round(time.time() - t_start, 1)
            results[key] = res
            del running[key]
            log(f"child {key}: " + ("ok" if res.get("ok") else f"FAILED {str(res.get('error'))[:200]}")
                + f" ({res['child_wall_s']} s)")  # fmt: skip
        time.sleep(0.2)
    return results


# ---------------------------------------------------------------- parent phases
class Results:
    """The JSON document, written after every phase and by the watchdog."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.doc: dict[str, Any] = {}
        self.lock = threading.Lock()

    def save(self) -> None:
        for attempt in range(3):  # the watchdog may serialize while the main thread adds a key
            try:
                with self.lock:
                    text = json.dumps(self.doc, indent=1, default=str)
                    self.path.write_text(text)
                return
            except RuntimeError:
                if attempt == 2:
                    raise
                time.sleep(0.05)


def start_watchdog(res: Results) -> None:
    def run() -> None:
        while time.time() - T0 < BUDGET_S + 8:
            time.sleep(1.0)
        res.doc["watchdog"] = "ended by the watchdog: over the time budget"
        try:
            res.save()
            print(summary(res.doc), flush=True)
        except Exception as e:
            print("watchdog: summary failed:", e, flush=True)
        finally:
            print(f"[{time.time() - T0:6.1f}s] watchdog: over budget, results saved, exiting", flush=True)
            os._exit(3)

    threading.Thread(target=run, daemon=True).start()


def existing_cfg(m: int, k: int, n: int) -> Any:
    from qlower.lowerings.triton_kernels import configs

    return configs.dynamic_int8_config(m, k, n)


def _variant_result(
    v: Variant, p: dict[str, Any], ref: torch.Tensor, row: dict[str, Any], c: dict[str, Any]
) -> dict[str, Any]:
    """Check and time one variant at one shape (skipped when its child failed or time is short)."""
    m, k, n = row["m"], row["k"], row["n"]
    vr: dict[str, Any] = {}
    if not c.get("ok"):
        vr["skipped"] = f"child compile/check failed: {str(c.get('error', c.get('rel_err')))[:200]}"
        return vr
    if left_s() < 60:
        vr["skipped"] = "out of time"
        return vr
    try:
        vr["rel_err"] = rel_err(run_variant(v, p["xq"], p["w"][0], p["s"][0], p["xs"]), ref)
        if vr["rel_err"] > MAX_REL_ERR:
            vr["skipped"] = "rel err above 1e-2"
            return vr
        calls = [
            (lambda i=i: run_variant(v, p["xq"], p["w"][i], p["s"][i], p["xs"])) for i in range(N_WEIGHTS)
        ]
        vr["us"] = gpu_time_us(calls)
        vr["tops"] = tops(m, k, n, vr["us"])
        vr["vs_bf16"] = row["bf16_us"] / vr["us"]
        vr["vs_existing"] = row["existing_us"] / vr["us"] if row.get("existing_us") else None
    except Exception as e:
        vr["error"] = _err_text(e)
    return vr


def _kernel_row(m: int, k: int, n: int, children: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """bf16 F.linear, _int_mm (+ rescale), the existing kernel and every variant at one shape."""
    from qlower.lowerings.triton_kernels import ops

    p = problem(m, k, n)
    ref = dyn_ref(p)
    xq, xs, ws, ss = p["xq"], p["xs"], p["w"], p["s"]
    row: dict[str, Any] = {"m": m, "k": k, "n": n, "variants": {}}
    wb = [w.to(torch.bfloat16) * s[:, None] for w, s in zip(ws, ss, strict=True)]
    row["bf16_us"] = gpu_time_us([(lambda i=i: F.linear(p["x"], wb[i])) for i in range(N_WEIGHTS)])
    wb.clear()

    def int_mm_rescaled(i: int) -> torch.Tensor:
        return (torch._int_mm(xq, ws[i].t()).float() * xs * ss[i].float()).to(torch.bfloat16)

    try:
        row["int_mm_err"] = rel_err(int_mm_rescaled(0), ref)
        row["int_mm_us"] = gpu_time_us([(lambda i=i: torch._int_mm(xq, ws[i].t())) for i in range(N_WEIGHTS)])
        row["int_mm_rescale_us"] = gpu_time_us([(lambda i=i: int_mm_rescaled(i)) for i in range(N_WEIGHTS)])
    except Exception as e:
        row["int_mm_error"] = _err_text(e)
    cfg = existing_cfg(m, k, n)
    row["existing_cfg"] = str(cfg)
    c = children.get(f"existing:{cfg}", {})
    if c.get("ok"):
        try:
            calls = [
                (lambda i=i: ops.launch_config(cfg, xq, ws[i], ss[i], xs, out_dtype=torch.bfloat16))
                for i in range(N_WEIGHTS)
            ]
            row["existing_err"] = rel_err(calls[0](), ref)
            row["existing_us"] = gpu_time_us(calls)
        except Exception as e:
            row["existing_error"] = _err_text(e)
    else:
        row["existing_error"] = f"child compile: {c.get('error', 'missing')}"
    for v in VARIANTS:
        row["variants"][v.name] = _variant_result(v, p, ref, row, children.get(f"variant:{v.name}", {}))
    ok = {name: vr["us"] for name, vr in row["variants"].items() if vr.get("us")}
    if ok:
        best = min(ok, key=ok.__getitem__)
        row["best"] = {"name": best, "us": ok[best], "tops": tops(m, k, n, ok[best])}
        for kind in ("dev", "host"):
            of_kind = {nm: us for nm, us in ok.items() if VARIANT_BY_NAME[nm].desc == kind}
            if of_kind:
                b = min(of_kind, key=of_kind.__getitem__)
                row[f"best_{kind}"] = {"name": b, "us": of_kind[b]}
    for key in ("bf16_us", "int_mm_us", "existing_us"):
        if row.get(key):
            row[key.replace("_us", "_tops")] = tops(m, k, n, row[key])
    return row


def time_kernels(res: Results, children: dict[str, dict[str, Any]]) -> None:
    """Per shape: bf16 F.linear, _int_mm (+ rescale), the existing kernel, every variant that compiled."""
    rows = res.doc.setdefault("kernels", [])
    for m, k, n in SHAPES:
        if left_s() < 70:
            log("kernels: out of time, stopping")
            break
        rows.append(_kernel_row(m, k, n, children))
        log(short_kernel_row(rows[-1]))
        res.save()
        torch.cuda.empty_cache()


def time_prologue(res: Results) -> None:
    """The per-token quantize alone, as Inductor compiles it (its share of the whole model)."""
    torch._dynamo.reset()
    q = torch.compile(quantize_per_token, fullgraph=True, dynamic=False)
    rows = res.doc.setdefault("prologue", [])
    for m, k in sorted({(m, k) for m, k, _ in SHAPES}, reverse=True):
        if left_s() < 50:
            break
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        try:
            rows.append({"m": m, "k": k, "us": gpu_time_us([lambda x=x: q(x)] * N_WEIGHTS)})
        except Exception as e:
            rows.append({"m": m, "k": k, "error": _err_text(e)})
        log(f"prologue M={m} K={k}: {rows[-1]}")
    res.save()


def _compiled_route(
    route: str, v: Variant | None, p: dict[str, Any], ref: torch.Tensor, row: dict[str, Any]
) -> None:
    """Compile the whole model with qlower (stock kernel, or `v` patched in), check the code, time it."""
    import qlower

    m, k, n = row["m"], row["k"], row["n"]
    torch._dynamo.reset()
    undo = install_qlower_patch(v) if v is not None else (lambda: None)
    try:
        t = time.time()
        f = torch.compile(dyn_model, options=qlower.inductor_options(), fullgraph=True, dynamic=False)
        out, code = _generated_code(f, p["x"], p["w"][0], p["s"][0])
        row[f"{route}_compile_s"] = round(time.time() - t, 1)
        kernel = "qlinear_mm_kernel" if v is None else KERNEL_NAMES[0 if v.desc == "dev" else 1]
        row[f"{route}_variant"] = v.name if v is not None else str(existing_cfg(m, k, n))
        facts = _code_facts(code, kernel)
        row[f"{route}_launches_kernel"] = facts["launches_kernel"]
        row[f"{route}_python_fallback"] = facts["python_fallback"]
        row[f"{route}_clone_calls"] = facts["clone_calls"]
        row[f"{route}_err"] = rel_err(out, ref)
        row[f"{route}_us"] = gpu_time_us(
            [(lambda i=i: f(p["x"], p["w"][i], p["s"][i])) for i in range(N_WEIGHTS)]
        )
        row[f"{route}_vs_bf16"] = row["bf16_us"] / row[f"{route}_us"]
    except Exception as e:
        row[f"{route}_error"] = _err_text(e)
        traceback.print_exc()
    finally:
        undo()
    log(f"compiled M={m} {k}->{n} {route}: {row.get(f'{route}_us')} us "
        f"(err {row.get(f'{route}_err')}) {row.get(f'{route}_error', '')}")  # fmt: skip


def time_compiled(res: Results, probes: dict[str, dict[str, Any]]) -> None:
    """Whole model under torch.compile + qlower: stock kernel vs the best host/dev variant patched in."""
    torch._inductor.config.force_disable_caches = True
    rows = res.doc.setdefault("compiled", [])
    krows = {(r["m"], r["k"], r["n"]): r for r in res.doc.get("kernels", [])}
    for m, k, n in SHAPES:
        kr = krows.get((m, k, n))
        if kr is None or left_s() < 55:
            break
        p = problem(m, k, n)
        ref = dyn_ref(p)
        row: dict[str, Any] = {"m": m, "k": k, "n": n, "bf16_us": kr["bf16_us"]}
        routes: list[tuple[str, Variant | None]] = [("stock", None)]
        for kind in ("dev", "host"):
            b = kr.get(f"best_{kind}")
            if b and probes.get(f"inductor:{kind}:qlower", {}).get("ok"):
                routes.append((kind, VARIANT_BY_NAME[b["name"]]))
        for route, v in routes:
            if left_s() < 40:
                row[f"{route}_skipped"] = "out of time"
            else:
                _compiled_route(route, v, p, ref, row)
        rows.append(row)
        res.save()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- summary
def _f(v: Any, fmt: str = ".1f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"


def short_kernel_row(r: dict[str, Any]) -> str:
    b = r.get("best", {})
    return (f"M={r['m']} {r['k']}->{r['n']}: bf16 {_f(r.get('bf16_us'))}, int_mm {_f(r.get('int_mm_us'))}, "
            f"existing {_f(r.get('existing_us'))}, best {b.get('name', '-')} {_f(b.get('us'))} us "
            f"({_f(b.get('tops'), '.0f')} TOP/s)")  # fmt: skip


def summary(doc: dict[str, Any]) -> str:
    lines = ["", "== kernels (us; TOP/s in brackets) =="]
    lines.append(
        "| M | K->N | bf16 | _int_mm | _int_mm+rescale | existing | best new | best/bf16 | best/existing |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in doc.get("kernels", []):
        b = r.get("best", {})
        lines.append(
            f"| {r['m']} | {r['k']}->{r['n']} | {_f(r.get('bf16_us'))} | {_f(r.get('int_mm_us'))} "
            f"[{_f(r.get('int_mm_tops'), '.0f')}] | {_f(r.get('int_mm_rescale_us'))} | {_f(r.get('existing_us'))} "
            f"[{_f(r.get('existing_tops'), '.0f')}] | {b.get('name', '-')} {_f(b.get('us'))} [{_f(b.get('tops'), '.0f')}] "
            f"| {_f(r['bf16_us'] / b['us'] if b else None, '.2f')} "
            f"| {_f(r['existing_us'] / b['us'] if b and r.get('existing_us') else None, '.2f')} |"
        )  # fmt: skip
    lines.append("")
    lines.append("== every variant (us per shape, in SHAPES order; x = failed/skipped) ==")
    for v in VARIANTS:
        cells = []
        for r in doc.get("kernels", []):
            vr = r["variants"].get(v.name, {})
            cells.append(_f(vr.get("us")) if vr.get("us") else "x")
        c = doc.get("children", {}).get(f"variant:{v.name}", {})
        note = "" if c.get("ok") else f"  <- {str(c.get('error', c.get('rel_err')))[:90]}"
        lines.append(f"  {v.name:26s} " + " ".join(f"{s:>7s}" for s in cells) + note)
    lines.append("")
    lines.append("== Inductor probes ==")
    for kind in ("dev", "host"):
        for route in ("qlower", "direct_triton_op"):
            r = doc.get("children", {}).get(f"inductor:{kind}:{route}", {})
            lines.append(f"  {kind:4s} {route:16s} ok={r.get('ok')} kernel={r.get('launches_kernel')} "
                         f"err={_f(r.get('rel_err'), '.1e')} clones={r.get('clone_calls')} "
                         f"{('needs allocator: ' + r['error_without_allocator'][:80]) if 'error_without_allocator' in r else ''}"
                         f"{r.get('error', '')[:160]}")  # fmt: skip
        ft = doc.get("children", {}).get(f"inductor:{kind}:direct_triton_op", {}).get("functional_trace", {})
        lines.append(
            f"  {kind:4s} functional trace: clones {ft.get('tensors_to_clone')} {ft.get('error', '')[:160]}"
        )
    lines.append("")
    lines.append("== prologue (compiled per-token quantize) ==")
    for r in doc.get("prologue", []):
        lines.append(f"  M={r['m']} K={r['k']}: {_f(r.get('us'))} us {r.get('error', '')}")
    lines.append("")
    lines.append("== whole compiled model (prologue + GEMM), us and x bf16 ==")
    for r in doc.get("compiled", []):
        parts = [f"M={r['m']} {r['k']}->{r['n']} bf16 {_f(r['bf16_us'])}"]
        for route in ("stock", "host", "dev"):
            if f"{route}_us" in r or f"{route}_error" in r:
                parts.append(f"{route} {_f(r.get(f'{route}_us'))} ({_f(r.get(f'{route}_vs_bf16'), '.2f')}x)"
                             f"{' ERR ' + r[f'{route}_error'][:80] if f'{route}_error' in r else ''}")  # fmt: skip
        lines.append("  " + ", ".join(parts))
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def parent_main() -> None:
    import triton

    out_dir = Path(os.environ.get("OUT", "out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    res = Results(out_dir / "int8_exp.json")
    start_watchdog(res)
    torch._dynamo.config.cache_size_limit = 64
    torch._inductor.config.compile_threads = 1
    res.doc["env"] = {
        "torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(),
        "capability": torch.cuda.get_device_capability(), "sms": _num_sms(), "date": time.strftime("%Y-%m-%d"),
        "shapes": SHAPES, "variants": [asdict(v) for v in VARIANTS],
    }  # fmt: skip
    log(res.doc["env"]["torch"], res.doc["env"]["triton"], res.doc["env"]["gpu"])
    jobs: dict[str, dict[str, Any]] = {
        f"inductor:{kind}:{route}": {"type": "inductor", "kind": kind, "route": route}
        for kind in ("dev", "host")
        for route in ("qlower", "direct_triton_op")
    }
    for m, k, n in SHAPES:
        cfg = existing_cfg(m, k, n)
        jobs[f"existing:{cfg}"] = {"type": "existing", "cfg": asdict(cfg)}
    for v in VARIANTS:
        jobs[f"variant:{v.name}"] = {"type": "variant", "name": v.name}
    parallel = max(2, min(len(jobs), (os.cpu_count() or 4) - 2))
    log(f"{len(jobs)} child jobs, {parallel} at once")
    children = run_children(jobs, out_dir / "children", parallel)
    res.doc["children"] = children
    res.save()
    set_allocator()  # after the probes: eager launches of `dev` kernels need it
    phases: list[tuple[str, Callable[[], None]]] = [
        ("kernels", lambda: time_kernels(res, children)),
        ("prologue", lambda: time_prologue(res)),
        ("compiled", lambda: time_compiled(res, children)),
    ]
    for name, fn in phases:
        try:
            fn()
        except Exception as e:
            res.doc.setdefault("phase_errors", {})[name] = _err_text(e)
            traceback.print_exc()
        res.save()
    res.doc["wall_s"] = round(time.time() - T0, 1)
    res.save()
    print(summary(res.doc), flush=True)
    log(f"done; wrote {res.path}")


def cpu_check() -> None:
    """Interpreter run at tiny shapes (fp32 out; bf16 is broken in the interpreter): indexing, masking, TMA
    out-of-bounds handling, epilogue splits, persistent and one-tile-per-program grids, both descriptor kinds."""
    set_allocator()
    m, k, n = 40, 80, 56  # ragged in every dimension against 16x32x32 tiles (K % 16 == 0 for TMA)
    p = problem(m, k, n, n_weights=1, device="cpu")
    p["s"][0] = p["s"][0].float()
    bias = torch.randn(n)
    ref = dyn_ref(p, bias)
    worst = 0.0
    for desc in ("dev", "host"):
        for epi in ("ptr", "tma", "tma2"):
            for persistent in (True, False):
                v = Variant("cpu", desc, bm=16, bn=32, bk=32, warps=4, stages=2, persistent=persistent, epi=epi,
                            group_m=2)  # fmt: skip
                out = run_variant(v, p["xq"], p["w"][0], p["s"][0], p["xs"], bias, out_dtype=torch.float32)
                err = rel_err(out, ref)
                worst = max(worst, err)
                print(f"{desc} {epi:4s} persistent={persistent}: rel err {err:.2e}", flush=True)
    assert worst < 1e-5, worst
    print("cpu check passed", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help="internal: run one compile/probe job (JSON) and print RESULT <json>")
    ap.add_argument("--cpu-check", action="store_true", help="interpreter run at tiny shapes, no GPU")
    args = ap.parse_args()
    if args.cpu_check:
        cpu_check()
    elif args.child:
        child_main(args.child)
    else:
        parent_main()


if __name__ == "__main__":
    main()
