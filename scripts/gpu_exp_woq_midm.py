"""woq-int8 at M = 16..256 on the H200: which launch beats bf16 F.linear, and where dequant + mm still wins.

    python -P scripts/gpu_exp_woq_midm.py   # writes $OUT/woq_midm.json and prints a table

Why: before session 4, qlower's Triton woq kernel served M <= 64 under AUTO and the dequant + cuBLAS path above.
At M=128 on 4096->4096 that path measured 0.52x bf16 (the weight dequantized to bf16 every call costs as much
as the matmul). The tiled kernel's only configs at M=128..256 gave 32-64 programs on 132 SMs; this sweep adds
split-K and narrower swap-AB tiles, and times them side by side with bf16 and the dequant + mm path, each over
8 rotating weight sets (scripts/cuda_timing.py: CUDA-graph replay, GPU time). Session 4 adds the int8-limb
kernel (`woq_limbs`) at every M > 1.

Env: WOQ_EXP_POINTS ("MxKxN,..."), WOQ_EXP_BUDGET_S, WOQ_EXP_LIMBS_ONLY=1 (only the limb configs next to the
current pick), WOQ_EXP_CVT=1..4 (only the inline-PTX int8 -> bf16 tiles of the four session-6 runs),
WOQ_EXP_TMA=1|2 (session 8: the TMA-fed persistent woq kernel, `int8_hopper.woq_mm_tma_dev_kernel`; 2: round
two, plus each point's "ceiling": the same pointer and TMA tiles fed a bf16 weight, no conversion at all, so
the gap between a woq tile and cuBLAS splits into the conversion's share and the Triton GEMM's own).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_timing import gpu_time_us  # noqa: E402

from qlower.lowerings.triton_kernels import configs, ops  # noqa: E402
from qlower.lowerings.triton_kernels.configs import decode_dot, decode_fma, limbs, mm, tma  # noqa: E402

OUT = Path(os.environ.get("OUT", "out"))
BUDGET_S = float(os.environ.get("WOQ_EXP_BUDGET_S", "240"))
N_SETS = 8
T0 = time.time()


def limb_candidates(m: int) -> list[Any]:
    """`woq_limbs` (x as three int8 digit planes on int8 tensor cores), tiles after the dynamic-int8 table's."""
    if m <= 16:
        return [limbs(16, 64, 256, 4, 4), limbs(16, 32, 512, 4, 4), limbs(16, 128, 256, 4, 4),
                limbs(16, 64, 512, 4, 3), limbs(16, 32, 256, 4, 4)]  # fmt: skip
    if m <= 64:
        return [limbs(64, 64, 256, 4, 4), limbs(32, 128, 256, 4, 4), limbs(64, 64, 128, 4, 4),
                limbs(32, 64, 256, 4, 4), limbs(64, 128, 128, 4, 3)]  # fmt: skip
    if m <= 256:
        return [limbs(64, 64, 256, 4, 4), limbs(64, 128, 128, 4, 4), limbs(128, 64, 128, 8, 3),
                limbs(32, 64, 256, 4, 4), limbs(128, 128, 128, 8, 3), limbs(128, 64, 128, 4, 4)]  # fmt: skip
    return [limbs(128, 128, 128, 8, 3), limbs(128, 256, 64, 8, 3), limbs(128, 128, 64, 8, 4)]


def ptx_cvt_candidates(m: int) -> list[Any]:
    """Session 6: tiles with the int8 -> bf16 conversion by inline PTX (2 instructions per element, against
    3.6-5 through fp32), each next to its fp32-magic twin (WOQ_EXP_CVT=1)."""
    if m <= 16:
        pairs = [(decode_dot(16, 32, 256), decode_dot(16, 32, 256, cvt=3)),
                 (decode_dot(16, 64, 256), decode_dot(16, 64, 256, cvt=3)),
                 (mm(16, 64, 256, 4, 4), mm(16, 64, 256, 4, 4, fast=2))]  # fmt: skip
        return [c for p in pairs for c in p] + [
            decode_dot(16, 64, 128, stages=5, cvt=3), decode_dot(16, 128, 128, cvt=3),
            decode_dot(16, 32, 512, stages=3, cvt=3), mm(16, 32, 256, 4, 4, fast=2), mm(16, 128, 128, 4, 4, fast=2),
            mm(16, 64, 128, 4, 5, fast=2), mm(16, 128, 256, 4, 3, fast=2), mm(16, 64, 512, 4, 3, fast=2),
            mm(16, 128, 256, 8, 3, fast=2)]  # fmt: skip
    if m <= 64:
        return [mm(32, 64, 256, 4, 4, swap=True, fast=2), mm(64, 64, 128, 4, 4, swap=True, fast=2),
                mm(64, 64, 128, 4, 4), mm(64, 64, 128, 4, 4, fast=2), mm(64, 128, 128, 4, 4, fast=2),
                mm(64, 64, 256, 4, 3, fast=2), mm(32, 64, 256, 4, 4, fast=2), mm(64, 128, 64, 4, 4, fast=2)]  # fmt: skip
    if m <= 256:
        return [mm(64, 64, 256, 4, 4, swap=True, fast=2), mm(128, 64, 128, 4, 4, swap=True, fast=2),
                mm(128, 64, 128, 4, 4), mm(128, 64, 128, 4, 4, fast=2), mm(64, 128, 128, 4, 4, fast=2),
                mm(128, 128, 64, 8, 3, fast=2), mm(128, 128, 128, 8, 3, fast=2), mm(64, 64, 128, 4, 4, fast=2),
                mm(128, 128, 64, 4, 4, fast=2)]  # fmt: skip
    return [mm(128, 128, 64, 8, 4, fast=2), mm(128, 128, 64, 8, 3, fast=2), mm(128, 256, 64, 8, 3, fast=2),
            mm(128, 128, 128, 8, 3, fast=2), mm(128, 128, 64, 4, 4, fast=2), mm(256, 128, 64, 8, 3, fast=2)]


def ptx_cvt_round2(m: int) -> list[Any]:
    """Session 6, second run (WOQ_EXP_CVT=2): around the PTX winners of the first (16-row tiles; 4 warps at
    M >= 1024)."""
    if m <= 16:
        return [mm(16, 64, 256, 8, 4, fast=2), mm(16, 64, 256, 4, 3, fast=2), mm(16, 32, 256, 4, 4, fast=2),
                mm(16, 64, 256, 4, 4, split_k=2, fast=2), mm(16, 32, 256, 4, 4, split_k=2, fast=2),
                mm(16, 64, 128, 4, 6, fast=2), mm(16, 32, 512, 4, 3, fast=2), mm(16, 32, 256, 2, 4, fast=2),
                mm(16, 16, 512, 4, 3, fast=2), mm(16, 32, 128, 4, 6, fast=2), mm(16, 64, 256, 4, 4, fast=2)]  # fmt: skip
    return [mm(128, 128, 64, 4, 4, fast=2), mm(128, 128, 64, 8, 4, fast=2), mm(128, 64, 64, 4, 4, fast=2),
            mm(128, 256, 64, 8, 3, fast=2), mm(128, 128, 64, 4, 3, fast=2), mm(64, 128, 64, 4, 4, fast=2)]


def ptx_cvt_round3(m: int) -> list[Any]:
    """Session 6, third run (WOQ_EXP_CVT=3): swap-AB tiles with the 2-element PTX call (fast=3), which on the
    wgmma register operand avoids the byte packing that made fast=2 lose there."""
    if m <= 16:
        return [mm(16, 64, 256, 4, 4, swap=True, fast=3), mm(16, 128, 128, 4, 4, swap=True, fast=3),
                mm(16, 64, 128, 4, 5, swap=True, fast=3), mm(16, 64, 256, 4, 4, swap=True)]  # fmt: skip
    if m <= 64:
        return [mm(32, 64, 256, 4, 4, swap=True, fast=3), mm(64, 64, 128, 4, 4, swap=True, fast=3),
                mm(32, 32, 256, 4, 4, swap=True, fast=3), mm(64, 64, 256, 4, 4, swap=True, fast=3),
                mm(64, 128, 128, 4, 4, swap=True, fast=3)]  # fmt: skip
    return [mm(64, 64, 256, 4, 4, swap=True, fast=3), mm(128, 64, 128, 4, 4, swap=True, fast=3),
            mm(64, 128, 128, 4, 4, swap=True, fast=3), mm(128, 128, 64, 8, 4, swap=True, fast=3),
            mm(64, 64, 128, 4, 4, swap=True, fast=3), mm(128, 64, 64, 4, 4, swap=True, fast=3)]


def ptx_cvt_round4(m: int) -> list[Any]:
    """Session 6, fourth run (WOQ_EXP_CVT=4), M <= 16 at N > K: wide tiles read the bf16 activation tile from
    L2 once per 128 weight rows instead of 64 (a third less L2 traffic), and a 2-way K split keeps 224
    programs for 132 SMs."""
    return [mm(16, 128, 256, 4, 3, split_k=2, fast=2), mm(16, 128, 128, 4, 4, split_k=2, fast=2),
            mm(16, 128, 256, 8, 3, split_k=2, fast=2), mm(16, 128, 128, 8, 4, split_k=2, fast=2),
            mm(16, 256, 128, 8, 3, split_k=4, fast=2), mm(16, 128, 256, 4, 3, fast=2),
            mm(16, 64, 256, 4, 4, fast=2)]  # fmt: skip


def tma_round(m: int) -> list[Any]:
    """Session 8 (WOQ_EXP_TMA=1): operands by TMA (no address registers, swizzled shared memory wgmma reads
    directly), persistent grids. The run also timed swap-AB TMA tiles (the converted weight as wgmma's register
    operand); they lost at every point (woq_tma_session8.json) and the kernel no longer has that variant."""
    if m <= 16:
        return [tma(16, 64, 256, 4, 4, 2, fast=2)]
    if m <= 64:
        return [tma(64, 64, 128, 4, 4, 2, fast=2), tma(64, 32, 256, 4, 4, 2, fast=2)]
    if m <= 256:
        return [tma(128, 64, 128, 4, 4, 2, fast=2), tma(128, 32, 128, 4, 4, 2, fast=2),
                tma(128, 128, 64, 4, 4, 2, fast=2)]  # fmt: skip
    return [tma(128, 128, 64, 4, 4, 1, fast=2), tma(128, 128, 64, 4, 4, 2, fast=2),
            tma(128, 256, 64, 8, 3, 1, fast=2), tma(128, 128, 128, 8, 3, 1, fast=2),
            tma(128, 128, 64, 8, 4, 1, fast=2)]  # fmt: skip


def tma_round2(m: int) -> list[Any]:
    """Session 8, second run: round one's winners (non-swap, 2 programs per SM) with 3 programs per SM,
    3 stages, wider groups, and narrower tiles at mid M."""
    if m <= 256:
        return [tma(128, 128, 64, 4, 4, 2, fast=2), tma(128, 128, 64, 4, 3, 3, fast=2),
                tma(128, 64, 64, 4, 4, 3, fast=2), tma(128, 64, 64, 4, 4, 2, fast=2),
                tma(64, 128, 64, 4, 4, 3, fast=2), tma(128, 128, 64, 4, 4, 2, fast=2, group_m=16)]  # fmt: skip
    return [tma(128, 128, 64, 4, 4, 2, fast=2), tma(128, 128, 64, 4, 3, 3, fast=2),
            tma(128, 128, 64, 4, 4, 2, fast=2, group_m=16), tma(128, 128, 64, 4, 4, 2, fast=2, group_m=4),
            tma(128, 128, 32, 4, 6, 2, fast=2), tma(128, 64, 64, 4, 4, 3, fast=2)]  # fmt: skip


def ceiling(m: int) -> list[Any]:
    """Tiles to time on a bf16 weight (fast=0: the conversion is a no-op): what the Triton GEMM alone reaches."""
    if m <= 256:
        return [mm(128, 64, 128, 4, 4, swap=True, fast=0), mm(64, 64, 128, 4, 4, swap=True, fast=0),
                mm(128, 128, 64, 4, 4, fast=0), tma(128, 128, 64, 4, 4, 2, fast=0),
                tma(128, 64, 128, 4, 4, 2, fast=0)]  # fmt: skip
    return [mm(128, 128, 64, 4, 4, fast=0), mm(128, 128, 64, 4, 3, fast=0), tma(128, 128, 64, 4, 4, 2, fast=0),
            tma(128, 256, 64, 8, 3, 1, fast=0), tma(128, 128, 128, 8, 3, 1, fast=0)]  # fmt: skip


def launch_bf16_weight(cfg: Any, x: torch.Tensor, wb: torch.Tensor, ones: torch.Tensor) -> torch.Tensor:
    """A woq tile on a bf16 weight (no conversion): the pointer kernel through `ops._launch`, TMA directly."""
    out = torch.empty(x.shape[0], wb.shape[0], dtype=x.dtype, device=x.device)
    if cfg.kernel == "tma":
        ops._launch_tma(cfg, x, wb, ones, None, None, out)
    else:
        ops._launch(cfg, x, wb, ones, None, None, out, 1)
    return out


def candidates(m: int) -> list[Any]:
    if os.environ.get("WOQ_EXP_TMA") == "2":
        return tma_round2(m)
    if os.environ.get("WOQ_EXP_TMA"):
        return tma_round(m)
    if os.environ.get("WOQ_EXP_CVT") == "4":
        return ptx_cvt_round4(m)
    if os.environ.get("WOQ_EXP_CVT") == "3":
        return ptx_cvt_round3(m)
    if os.environ.get("WOQ_EXP_CVT") == "2":
        return ptx_cvt_round2(m)
    if os.environ.get("WOQ_EXP_CVT"):
        return ptx_cvt_candidates(m)
    if os.environ.get("WOQ_EXP_LIMBS_ONLY"):
        return limb_candidates(m)
    return _candidates(m) + (limb_candidates(m) if m > 1 else [])


def _candidates(m: int) -> list[Any]:
    if m == 1:  # 4096->4096 needs <= 6.7 us for 2x bf16 (7.0 in session 3): longer K slices, more warps
        return [decode_fma(1, 4, 1024, acc3=True), decode_fma(1, 8, 2048, 8, acc3=True),
                decode_fma(1, 16, 1024, 8, acc3=True), decode_fma(1, 8, 512, acc3=True),
                decode_fma(1, 4, 2048, 8, acc3=True), decode_fma(1, 8, 1024, 8, acc3=True),
                decode_fma(1, 8, 1024, 4, 2, acc3=True), decode_fma(1, 2, 2048, 4, acc3=True)]  # fmt: skip
    if m <= 16:
        return [decode_dot(16, 32, 256), decode_dot(16, 64, 256), decode_dot(16, 64, 128, stages=5),
                decode_dot(16, 128, 128), decode_dot(16, 32, 512, stages=3), mm(16, 64, 256, 4, 4),
                mm(16, 64, 256, 4, 4, swap=True, split_k=2), mm(16, 128, 256, 4, 4, swap=True, split_k=2),
                mm(16, 128, 128, 4, 4, swap=True, split_k=4), mm(16, 64, 512, 4, 3, swap=True, split_k=2)]  # fmt: skip
    if m <= 64:
        return [mm(32, 64, 256, 4, 4, swap=True), mm(64, 64, 256, 4, 4, swap=True, split_k=2),
                mm(64, 128, 128, 4, 4, swap=True, split_k=2), mm(64, 128, 256, 8, 3, swap=True, split_k=2),
                mm(32, 32, 256, 4, 4, swap=True), mm(64, 64, 128, 4, 4, swap=True),
                mm(64, 128, 128, 4, 4, swap=True, split_k=4)]  # fmt: skip
    return [mm(128, 64, 128, 4, 4), mm(64, 128, 128, 4, 4), mm(128, 128, 64, 8, 3),
            mm(128, 64, 128, 4, 4, swap=True), mm(128, 64, 128, 4, 4, swap=True, split_k=2),
            mm(128, 128, 64, 8, 4, swap=True, split_k=2), mm(128, 128, 64, 8, 4, swap=True, split_k=4),
            mm(128, 128, 128, 8, 3, swap=True, split_k=4), mm(64, 128, 128, 4, 4, swap=True, split_k=2),
            mm(64, 64, 256, 4, 4, swap=True), mm(64, 64, 256, 4, 4, swap=True, split_k=2),
            mm(128, 64, 256, 8, 3, swap=True, split_k=2), mm(64, 128, 128, 4, 4, split_k=2),
            # second round: more programs than SMs (the first round's winners ran 1 CTA of 4 warps per SM)
            mm(32, 64, 256, 4, 4, swap=True), mm(32, 32, 256, 4, 4, swap=True), mm(64, 32, 256, 4, 4, swap=True),
            mm(64, 64, 128, 4, 3, swap=True), mm(64, 64, 128, 4, 4, swap=True), mm(128, 64, 64, 4, 5, swap=True)]  # fmt: skip


def dequant_mm(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """What qlower's `dequant_mm` lowering emits: one fused dequant feeding cuBLAS."""
    return torch.mm(x, (q.to(s.dtype) * s[:, None]).to(x.dtype).t())


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    spec = os.environ.get("WOQ_EXP_POINTS", "16x4096x14336,64x4096x4096,64x4096x14336,128x4096x4096,"
                          "128x4096x14336,256x4096x4096,256x4096x14336")  # fmt: skip
    points = [tuple(int(v) for v in p.split("x")) for p in spec.split(",")]
    results: list[dict[str, Any]] = []
    torch._dynamo.config.recompile_limit = 64  # one static compile per point (else eager past 8 points)
    dq = torch.compile(dequant_mm, dynamic=False)
    for m, k, n in points:
        if time.time() - T0 > BUDGET_S:
            print("out of budget", flush=True)
            break
        g = torch.Generator(device="cuda").manual_seed(m + k + n)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        qs = [
            torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8, generator=g)
            for _ in range(N_SETS)
        ]
        ss = [
            (torch.rand(n, device="cuda", generator=g) * 0.02 + 0.001).to(torch.bfloat16)
            for _ in range(N_SETS)
        ]
        wb = [(q.to(torch.bfloat16) * s[:, None]) for q, s in zip(qs, ss, strict=True)]
        ref = x.double() @ (qs[0].double() * ss[0].double()[:, None]).t()
        row: dict[str, Any] = {"m": m, "k": k, "n": n}
        row["bf16_us"] = gpu_time_us([lambda w=w, x=x: F.linear(x, w) for w in wb])
        row["dequant_mm_us"] = gpu_time_us(
            [lambda q=q, s=s, x=x: dq(x, q, s) for q, s in zip(qs, ss, strict=True)]
        )
        cur = configs.woq_int8_config(m, k, n)
        row["current"] = str(cur)
        row["variants"] = []
        for cfg in [cur] + [c for c in candidates(m) if c != cur]:
            v: dict[str, Any] = {"config": str(cfg), "repr": repr(cfg)}
            try:
                out = ops.launch_config(cfg, x, qs[0], ss[0])
                v["rel_err"] = float((out.double() - ref).norm() / ref.norm())
                if v["rel_err"] < 1e-2:
                    v["us"] = gpu_time_us(
                        [
                            lambda q=q, s=s, c=cfg, x=x: ops.launch_config(c, x, q, s)
                            for q, s in zip(qs, ss, strict=True)
                        ]
                    )
            except Exception as e:  # a config Triton cannot build
                v["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            row["variants"].append(v)
        if os.environ.get("WOQ_EXP_TMA") == "2":
            ones = torch.ones(n, device="cuda", dtype=torch.float32)
            ref_b = x.double() @ wb[0].double().t()
            row["ceiling"] = []
            for cfg in ceiling(m):
                v = {"config": str(cfg)}
                try:
                    out = launch_bf16_weight(cfg, x, wb[0], ones)
                    v["rel_err"] = float((out.double() - ref_b).norm() / ref_b.norm())
                    v["us"] = gpu_time_us([lambda w=w, c=cfg, x=x, o=ones: launch_bf16_weight(c, x, w, o) for w in wb])
                except Exception as e:  # a config Triton cannot build
                    v["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                row["ceiling"].append(v)
            print("    ceiling (bf16 weight): " + ", ".join(
                f"{v['config']}: {v.get('us', v.get('error'))} ({v.get('rel_err', 0):.1e})" for v in row["ceiling"]),
                flush=True)  # fmt: skip
        ok = [v for v in row["variants"] if "us" in v]
        best = min(ok, key=lambda v: v["us"]) if ok else None
        row["best"] = best
        results.append(row)
        (OUT / "woq_midm.json").write_text(json.dumps(results, indent=1))
        line = (
            f"[{time.time() - T0:5.0f}s] M={m} {k}->{n}: bf16 {row['bf16_us']:.1f}  dequant_mm "
            f"{row['dequant_mm_us']:.1f}  current {row['variants'][0].get('us', float('nan')):.1f} [{cur}]"
        )
        if best:
            line += f"  best {best['us']:.1f} [{best['config']}] = {row['bf16_us'] / best['us']:.2f}x bf16"
        print(line, flush=True)
        print("    " + ", ".join(f"{v['config']}: {v.get('us', v.get('error', 'err'))}" for v in row["variants"]),
              flush=True)  # fmt: skip
        del qs, ss, wb
        torch.cuda.empty_cache()


if __name__ == "__main__":
    with torch.no_grad():
        main()
