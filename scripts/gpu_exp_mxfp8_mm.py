"""GPU experiment: can an MXFP8 x MXFP8 GEMM on Hopper's fp8 tensor cores beat bf16 F.linear at large M?

    python -m pip install -q --no-deps --no-build-isolation . && python -P scripts/gpu_exp_mxfp8_mm.py

Side by side in one run, at (M, K, N) = (4096, 4096, 14336) and (4096, 4096, 4096), bf16 activations:
- bf16 `F.linear` (the target's baseline) and `torch._scaled_mm` per-tensor fp8 (cuBLAS's fp8 ceiling);
- `mx_fp8_hopper.mx_fp8_mm_tma_kernel` with the block scales (SCALED) over a grid of tiles, and without them
  (the same kernel as a plain fp8 GEMM: what the scaling costs);
- `mx_kernels.mx_mm_kernel` (FP8_MMA), the kernel the MX lowering has today.
Each scaled variant is checked against a float64 dequantized reference (rel err <= 1e-2) on weight set 0.
Scales are tried as e8m0 codes (weight scales [N, K/32], as models store them) and decoded to fp32 with the
weight's stored [K/32, N] (the cheapest form for the loop: `sass_loop_stats.py mx_fp8 ... 1` vs `... 2`).

Timing: `gpu_time_us` (CUDA-graph replays over 8 rotating weight sets). Writes $OUT/mxfp8_mm.json after every
variant. Env: OUT, MXFP8_EXP_BUDGET_S (default 200), MXFP8_EXP_VARIANTS (a Python list of tuples
(bm, bn, warps, stages, chunks, group_m) replacing the built-in grid).
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import gpu_time_us  # noqa: E402

from qlower.lowerings.triton_kernels.int8_hopper import _tile_coords  # noqa: E402
from qlower.lowerings.triton_kernels.mx_kernels import _scale_f32, mx_mm_kernel  # noqa: E402

T0 = time.time()
OUT = Path(os.environ.get("OUT", "out"))
BUDGET_S = float(os.environ.get("MXFP8_EXP_BUDGET_S", "200"))
SHAPES = ((4096, 4096, 14336), (4096, 4096, 4096))
N_SETS = 8
VARIANTS = [
    (128, 128, 8, 4, 1, 8),
    (128, 64, 4, 4, 1, 8),
    (128, 256, 8, 3, 1, 8),
    (64, 128, 4, 6, 1, 8),
    (128, 128, 8, 4, 2, 8),
]
if os.environ.get("MXFP8_EXP_VARIANTS"):
    VARIANTS = ast.literal_eval(os.environ["MXFP8_EXP_VARIANTS"])


# ------------------------------------------------------------------------------------------------ the kernel
# The candidate lives here, not in the package: it measured far below bf16 (BENCHMARKS.md, session 7), so no
# lowering uses it. `scripts/sass_loop_stats.py mx_fp8 ...` reads its loop.
#
# sm_90 has fp8 tensor cores but no block-scaled MMA. Every e8m0 scale covers 32 elements of K, exactly one
# fp8 wgmma (k = 32): each K block is one MMA into a fresh fp32 partial, then acc += partial * (sa[m] * sw[n])
# on the CUDA cores (powers of two: exact in fp32). That is 2 CUDA-core ops per output per K block against
# 64 MMA flops, so at the H200's rates the scaling, not the MMA, bounds the kernel. Operands come by TMA
# (descriptors built on the device: needs `triton.set_allocator`); scales plain [rows, K / 32], any strides,
# as e8m0 codes or (SCALES_F32) decoded fp32. SCALED=False: the same tiles as a plain fp8 GEMM.


@triton.jit
def _block_scale(ptr, rows, mask, kb, stride_r, stride_c, F32: tl.constexpr):
    """fp32 scale of K block kb for each row (1.0 past the edge, where the data is zero-padded).

    F32: the scales arrive decoded (fp32 powers of two), so the loop loads them and decodes nothing.
    """
    if F32:
        return tl.load(ptr + rows * stride_r + kb * stride_c, mask=mask, other=1.0)
    else:
        return _scale_f32(tl.load(ptr + rows * stride_r + kb * stride_c, mask=mask, other=127))


@triton.jit
def mx_fp8_mm_tma_kernel(
    a_ptr, as_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr,
    M, N, K,
    stride_am, stride_asm, stride_ask, stride_wn, stride_wsn, stride_wsk, stride_om,
    A_E5M2: tl.constexpr, W_E5M2: tl.constexpr, HAS_BIAS: tl.constexpr, SCALED: tl.constexpr,
    SCALES_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CHUNKS: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr,
):  # fmt: skip
    """out[M, N] = dequant(a) @ dequant(w).T (+ bias). Grid (P,): P = #tiles, or fewer for a persistent walk.

    CHUNKS K blocks per loop step (one MMA each): more independent MMAs between the scaling FMAs.
    """
    a_ty: tl.constexpr = tl.float8e5 if A_E5M2 else tl.float8e4nv
    w_ty: tl.constexpr = tl.float8e5 if W_E5M2 else tl.float8e4nv
    a_desc = tl.make_tensor_descriptor(a_ptr.to(tl.pointer_type(a_ty)), [M, K], [stride_am, 1], [BLOCK_M, 32])
    w_desc = tl.make_tensor_descriptor(w_ptr.to(tl.pointer_type(w_ty)), [N, K], [stride_wn, 1], [BLOCK_N, 32])
    start = tl.program_id(0)
    step = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    nkb = K // 32
    tile_c = start - step
    for tile_id in tl.range(start, num_tiles, step, flatten=FLATTEN):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rm = off_m + tl.arange(0, BLOCK_M)
        rn = off_n + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb0 in range(0, nkb, CHUNKS):
            for j in tl.static_range(CHUNKS):
                kb = kb0 + j
                a = a_desc.load([off_m, kb * 32])
                w = w_desc.load([off_n, kb * 32])
                if SCALED:
                    p = tl.dot(a, w.T)
                    sa = _block_scale(as_ptr, rm, (rm < M) & (kb < nkb), kb, stride_asm, stride_ask, SCALES_F32)
                    sw = _block_scale(ws_ptr, rn, (rn < N) & (kb < nkb), kb, stride_wsn, stride_wsk, SCALES_F32)
                    acc = tl.fma(p, sa[:, None] * sw[None, :], acc)
                else:
                    acc = tl.dot(a, w.T, acc)
        tile_c += step
        pid_mc, pid_nc = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        om = pid_mc * BLOCK_M + tl.arange(0, BLOCK_M)
        on = pid_nc * BLOCK_N + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + on, mask=on < N, other=0).to(tl.float32)[None, :]
        mask = (om < M)[:, None] & (on < N)[None, :]
        tl.store(out_ptr + om[:, None] * stride_om + on[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


def log(*a: Any) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def e8m0(codes: torch.Tensor) -> torch.Tensor:
    return torch.exp2(codes.double() - 127)


def quantize_rows(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [R, K] -> (e4m3 bytes [R, K] uint8, e8m0 codes [R, K/32] uint8), floor scale as the OCP spec."""
    r, k = v.shape
    blocks = v.float().view(r, k // 32, 32)
    amax = blocks.abs().amax(-1).clamp_min(2.0**-120)
    exp = torch.floor(torch.log2(amax)) - 8  # e4m3 max 448 = 1.75 * 2**8
    codes = (exp + 127).clamp(1, 254)
    q = (blocks / torch.exp2(codes - 127)[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.view(r, k).view(torch.uint8), codes.to(torch.uint8)


def dequant(q: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    r, k = q.shape
    v = q.view(torch.float8_e4m3fn).double().view(r, k // 32, 32) * e8m0(codes)[..., None]
    return v.view(r, k)


def launch(a, sa, w, sw, out, cfg, scaled: bool) -> None:
    """scaled: codes or fp32 scales, told apart by sa's dtype."""
    bm, bn, warps, stages, chunks, group_m = cfg
    m, k = a.shape
    n = w.shape[0]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    mx_fp8_mm_tma_kernel[(tiles,)](
        a, sa, w, sw, out, out, m, n, k,
        a.stride(0), sa.stride(0), sa.stride(1), w.stride(0), sw.stride(0), sw.stride(1), out.stride(0),
        A_E5M2=False, W_E5M2=False, HAS_BIAS=False, SCALED=scaled,
        SCALES_F32=sa.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn, CHUNKS=chunks,
        GROUP_M=group_m, FLATTEN=False, num_warps=warps, num_stages=stages,
    )  # fmt: skip


def launch_current(a, sa, w, sw, out) -> None:
    m, k = a.shape
    n = w.shape[0]
    bm, bn, bk = 128, 128, 64
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    mx_mm_kernel[grid](
        a, sa, w, sw, out, out, m, n, k,
        a.stride(0), 1, sa.stride(0), sa.stride(1), 0, w.stride(0), 1, sw.stride(0), sw.stride(1), 0,
        out.stride(0), 1, A_FMT=1, W_FMT=1, A_SWZ=False, W_SWZ=False, HAS_BIAS=False, FP8_MMA=True,
        DOT_BF16=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=3,
    )  # fmt: skip


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    res: dict[str, Any] = {
        "env": {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()},
        "points": [],
    }

    def write() -> None:
        res["wall_s"] = time.time() - T0
        (OUT / "mxfp8_mm.json").write_text(json.dumps(res, indent=1))

    g = torch.Generator(device="cuda").manual_seed(0)
    for m, k, n in SHAPES:
        pt: dict[str, Any] = {"m": m, "k": k, "n": n, "variants": {}}
        res["points"].append(pt)
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        a, sa = quantize_rows(x)
        ws = [torch.randn(n, k, device="cuda", generator=g) * k**-0.5 for _ in range(N_SETS)]
        qs = [quantize_rows(w) for w in ws]
        sa_f32 = torch.exp2(sa.float() - 127)
        sw_f32 = [torch.exp2(s.float() - 127).t().contiguous().t() for _, s in qs]  # stored [K/32, N]
        wb = [w.to(torch.bfloat16) for w in ws]
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = dequant(a[:256], sa[:256]) @ dequant(*qs[0]).t()
        flops = 2.0 * m * n * k
        pt["bf16_us"] = gpu_time_us([partial(F.linear, x, w) for w in wb])
        log(m, k, n, "bf16", pt["bf16_us"])
        try:
            one = torch.ones((), device="cuda")
            a8 = a.view(torch.float8_e4m3fn)
            calls = [partial(torch._scaled_mm, a8, q.view(torch.float8_e4m3fn).t(), one, one,
                             out_dtype=torch.bfloat16) for q, _ in qs]  # fmt: skip
            pt["cublas_fp8_tensorwise_us"] = gpu_time_us(calls)
        except Exception as e:  # noqa: BLE001
            pt["cublas_fp8_tensorwise_error"] = repr(e)[:300]
        try:
            launch_current(a, sa, *qs[0], out)
            pt["current_rel_err"] = rel_err(out[:256], ref)
            pt["current_us"] = gpu_time_us([partial(launch_current, a, sa, q, s, out) for q, s in qs])
        except Exception as e:  # noqa: BLE001
            pt["current_error"] = repr(e)[:300]
        write()
        for cfg in VARIANTS:
            for scaled, layout in ((True, "codes-nk"), (True, "f32-kn"), (False, "-")):
                if time.time() - T0 > BUDGET_S:
                    res["budget_hit"] = True
                    write()
                    return
                name = f"{cfg}:{'scaled-' + layout if scaled else 'plain'}"
                v: dict[str, Any] = {}
                pt["variants"][name] = v
                try:
                    sws = sw_f32 if layout == "f32-kn" else [s for _, s in qs]
                    sa_l = sa_f32 if layout == "f32-kn" else sa
                    launch(a, sa_l, qs[0][0], sws[0], out, cfg, scaled)
                    if scaled:
                        v["rel_err"] = rel_err(out[:256], ref)
                    calls = [partial(launch, a, sa_l, q[0], s, out, cfg, scaled) for q, s in zip(qs, sws, strict=True)]
                    v["us"] = gpu_time_us(calls)
                    v["tflops"] = flops / v["us"] / 1e6
                    v["vs_bf16"] = pt["bf16_us"] / v["us"]
                    log(m, k, n, name, f"{v['us']:.1f} us", f"{v['vs_bf16']:.2f}x", v.get("rel_err"))
                except Exception as e:  # noqa: BLE001
                    v["error"] = repr(e)[:300]
                    v["trace"] = traceback.format_exc()[-1200:]
                    log(m, k, n, name, "ERROR", repr(e)[:200])
                write()
    write()


if __name__ == "__main__":
    main()
