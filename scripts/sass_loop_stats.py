"""Count the SASS instructions in the main loop of a qlower Triton kernel, compiled for sm_90 on a CPU machine.

    python -W ignore scripts/sass_loop_stats.py mx_hfma 16 128 4        # BLOCK_N BLOCK_KW warps [BLOCK_M [prefetch]]
    python -W ignore scripts/sass_loop_stats.py qlinear_mm 64 64 256 4 4 1  # BM BN BK warps stages swap [split [cvt]]
    python -W ignore scripts/sass_loop_stats.py woq_limbs 16 64 256 4 4     # BM BN BK warps stages
    python -W ignore scripts/sass_loop_stats.py mx_fp8 128 128 8 4 1 2      # BM BN warps stages chunks [scaled 0-3, see mx_fp8()]

Why: GPU time is scarce (30 min a session) and a kernel's instruction mix explains most of what a sweep shows.
Triton compiles for a `GPUTarget("cuda", 90, 32)` without a GPU, and its wheel ships `ptxas` and `nvdisasm`,
so the loop body (the longest backward branch) can be read here: integer ops per weight word, shared-memory
round trips (BAR/STS/LDS: layout conversions), shuffles, loads. Integer arguments are marked divisible by 16,
as Triton's launcher specializes them at run time on the model shapes (without it loads do not vectorize).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

_SASS_OP = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def _compile(fn: Any, sig: dict[str, str], consts: dict[str, Any], div16: list[str], warps: int, stages: int):
    for name in consts:
        sig[name] = "constexpr"
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div16}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
    )


def mx_hfma(
    block_n: int, block_kw: int, warps: int, block_m: int = 1, prefetch: int = 0
) -> tuple[Any, float]:
    """The e2m1 f16x2 GEMV; returns (compiled, (row, word) pairs per thread per loop iteration)."""
    from qlower.lowerings.triton_kernels.mx_hfma import mx_hfma_gemv_kernel

    sig = dict(x_ptr="*bf16", w_ptr="*i32", s_ptr="*u8", bias_ptr="*bf16", out_ptr="*bf16", M="i32", N="i32",
               KW="i32", KW_SPLIT="i32", stride_xm="i32", stride_wn="i32", stride_sn="i32", stride_om="i32")  # fmt: skip
    consts = dict(stride_xk=1, stride_sk=1, s_cols_pad=0, stride_os=0, stride_on=1, W_FMT=3, SWIZZLED=False,
                  HAS_BIAS=False, EVEN_K=True, EVICT=True, PREFETCH=bool(prefetch), USE_ASM=True, BLOCK_M=block_m,
                  BLOCK_N=block_n, BLOCK_KW=block_kw)  # fmt: skip
    div = ["x_ptr", "w_ptr", "s_ptr", "bias_ptr", "out_ptr", "N", "KW", "KW_SPLIT", "stride_xm", "stride_wn",
           "stride_sn", "stride_om"]  # fmt: skip
    k = _compile(mx_hfma_gemv_kernel, sig, consts, div, warps, 1)
    return k, block_n * block_kw / (32 * warps)


def qlinear_mm(
    bm: int, bn: int, bk: int, warps: int, stages: int, swap: int, split: int = 1, cvt: int = 1
) -> tuple[Any, float]:
    """The woq-int8 tile kernel (bf16 x, int8 weight); returns (compiled, weight elements per thread per step)."""
    from qlower.lowerings.triton_kernels.kernels import qlinear_mm_kernel

    sig = dict(a_ptr="*bf16", w_ptr="*i8", ws_ptr="*bf16", xs_ptr="*fp32", b_ptr="*bf16",
               out_ptr="*fp32" if split > 1 else "*bf16", M="i32", N="i32", K="i32", stride_am="i32",
               stride_wn="i32", stride_om="i32")  # fmt: skip
    consts = dict(stride_ak=1, stride_wk=1, stride_ws=1, stride_xs=1, stride_b=1, stride_on=1, INT8_A=False,
                  HAS_XS=False, HAS_BIAS=False, SWAP_AB=bool(swap), SPLIT_K=split, EVEN_K=True, FAST_CVT=cvt,
                  BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)  # fmt: skip
    div = ["a_ptr", "w_ptr", "ws_ptr", "xs_ptr", "b_ptr", "out_ptr", "M", "N", "K", "stride_am", "stride_wn",
           "stride_om"]  # fmt: skip
    k = _compile(qlinear_mm_kernel, sig, consts, div, warps, stages)
    return k, bn * bk / (32 * warps)


def woq_limbs(bm: int, bn: int, bk: int, warps: int, stages: int) -> tuple[Any, float]:
    """The int8-limb woq GEMM; returns (compiled, weight elements per thread per step)."""
    from qlower.lowerings.triton_kernels.woq_limbs import woq_limb_mm_kernel

    sig = dict(l_ptr="*i8", rs_ptr="*fp32", w_ptr="*i8", ws_ptr="*bf16", b_ptr="*bf16", out_ptr="*bf16", M="i32",
               N="i32", K="i32", stride_wn="i32", stride_om="i32")  # fmt: skip
    consts = dict(stride_wk=1, stride_ws=1, stride_b=1, stride_on=1, HAS_BIAS=False, EVEN_K=True, BLOCK_M=bm,
                  BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)  # fmt: skip
    div = ["l_ptr", "rs_ptr", "w_ptr", "ws_ptr", "b_ptr", "out_ptr", "M", "N", "K", "stride_wn", "stride_om"]
    k = _compile(woq_limb_mm_kernel, sig, consts, div, warps, stages)
    return k, bn * bk / (32 * warps)


def mx_fp8(bm: int, bn: int, warps: int, stages: int, chunks: int, scaled: int = 1) -> tuple[Any, float]:
    """The Hopper MXFP8 GEMM (one fp8 MMA per 32-wide K block); returns (compiled, outputs per thread).

    scaled: 0 none (plain fp8 GEMM), 1 e8m0 codes with weight scales [N, K/32], 2 fp32 scales with weight
    scales stored [K/32, N], 3 codes stored [K/32, N].
    """
    from gpu_exp_mxfp8_mm import mx_fp8_mm_tma_kernel

    s_ty = "*fp32" if scaled == 2 else "*u8"
    sig = dict(a_ptr="*u8", as_ptr=s_ty, w_ptr="*u8", ws_ptr=s_ty, bias_ptr="*bf16", out_ptr="*bf16", M="i32",
               N="i32", K="i32", stride_am="i32", stride_asm="i32", stride_wn="i32", stride_om="i32")  # fmt: skip
    kn = scaled in (2, 3)
    sig["stride_wsk" if kn else "stride_wsn"] = "i32"
    consts = dict(stride_ask=1, A_E5M2=False, W_E5M2=False, HAS_BIAS=False, SCALED=bool(scaled),
                  SCALES_F32=scaled == 2, BLOCK_M=bm, BLOCK_N=bn, CHUNKS=chunks, GROUP_M=8, FLATTEN=False)  # fmt: skip
    consts["stride_wsn" if kn else "stride_wsk"] = 1
    div = [n for n in sig if n not in ("stride_ask",)]
    k = _compile(mx_fp8_mm_tma_kernel, sig, consts, div, warps, stages)
    return k, bm * bn * chunks / (32 * warps)


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def loop_ops(sass: str, innermost_mma: bool = False) -> collections.Counter[str]:
    """Opcode counts (without modifiers) between the label and the branch of the longest backward jump.

    innermost_mma: the shortest backward jump whose body holds a wgmma instead (a persistent kernel's K loop
    inside its tile loop).
    """
    lines = sass.splitlines()
    best: tuple[int, int] | None = None
    for end, line in enumerate(lines):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", line)
        if not m:
            continue
        starts = [i for i, ln in enumerate(lines[:end]) if ln.strip().startswith(m.group(1) + ":")]
        if not starts:
            continue
        if innermost_mma:
            if "GMMA" in "".join(lines[starts[0] : end]) and (best is None or end - starts[0] < best[1] - best[0]):
                best = (starts[0], end)
        elif best is None or end - starts[0] > best[1] - best[0]:
            best = (starts[0], end)
    ops: collections.Counter[str] = collections.Counter()
    for line in lines[best[0] : best[1] + 1] if best else []:
        m = _SASS_OP.match(line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
    return ops


def main() -> None:
    kind, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    compiled, per_thread = {"mx_hfma": mx_hfma, "qlinear_mm": qlinear_mm, "woq_limbs": woq_limbs, "mx_fp8": mx_fp8}[kind](*args)
    cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"qlower_{kind}_{'_'.join(map(str, args))}.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run(
        [_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    res = subprocess.run(
        [_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True
    ).stdout
    regs = re.search(r"REG:(\d+)", res)
    ops = loop_ops(sass, innermost_mma=kind == "mx_fp8")
    total = sum(ops.values())
    integer = ops["LOP3"] + ops["SHF"] + ops["IMAD"] + ops["PRMT"] + ops["IADD3"] + ops["VIADD"]
    unit = {"mx_hfma": "word", "mx_fp8": "output per K block"}.get(kind, "weight element")
    print(f"{kind} {args}: loop {total} instructions per thread = {total / per_thread:.1f} per {unit}; "
          f"integer {integer / per_thread:.1f}/{unit}; BAR {ops['BAR']} LDS {ops['LDS']} "
          f"STS {ops['STS'] + ops['STSM']} SHFL {ops['SHFL']} LDG {ops['LDG']}; registers {regs.group(1) if regs else '?'}")  # fmt: skip
    print("  " + ", ".join(f"{op} {n}" for op, n in ops.most_common(16)))


if __name__ == "__main__":
    main()
