"""The MX Triton kernels' index, mask, swizzle and decode logic on CPU, in Triton's interpreter.

A subprocess sets TRITON_INTERPRET=1 before Triton is imported. Activations are fp32/fp16 (bf16 loads are
wrong in the interpreter) and the tile path's dots run in fp16; numerics at GPU precision are covered by
tests/test_mx_gpu.py on the H200. Shapes are off every tile: M=5, N=48, K=96 (not a BLOCK_K multiple).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from qlower.patterns import mx_format as fmt
    from qlower.lowerings.triton_kernels.mx_ops import ELEM_CODE, MXConfig, launch_config

    torch.manual_seed(0)
    M, N, K = 5, 48, 96
    GEMV = MXConfig("gemv", block_n=16, block_k=64, num_warps=4, num_stages=1)
    MM = MXConfig("mm", block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=1)
    CASES = [  # activation format, weight format, kernel, swizzled, activation dtype
        ("float", "e4m3", GEMV, False, torch.float32),
        ("float", "e2m1", GEMV, True, torch.float16),
        ("e4m3", "e2m1", GEMV, True, None),
        ("e2m1", "e5m2", GEMV, False, None),
        ("float", "e2m1", MM, False, torch.float16),
        ("float", "e5m2", MM, True, torch.float16),
        ("e4m3", "e4m3", MM, True, None),   # fp8 dots per 32-wide chunk
        ("e2m1", "e2m1", MM, False, None),  # e2m1 decoded to e4m3 / 64 for the fp8 dots
        ("e5m2", "e4m3", MM, False, None),  # mixed fp8 types: upcast tiles
    ]
    for a_elem, w_elem, cfg, swz, adtype in CASES:
        x, w = torch.randn(M, K) * 3, torch.randn(N, K) * 0.05
        wq, wc = fmt.quantize(w, w_elem)
        wref = fmt.dequantize_f64(wq, wc, w_elem)
        ws = fmt.to_swizzled(wc) if swz else wc
        if a_elem == "float":
            a, a_s, aref = x.to(adtype), None, x.to(adtype).double()
        else:
            aq, ac = fmt.quantize(x, a_elem)
            aref = fmt.dequantize_f64(aq, ac, a_elem)
            a, a_s = aq.view(torch.uint8), (fmt.to_swizzled(ac) if swz else ac)
        bias = torch.randn(N)
        ref = aref @ wref.t() + bias.double()
        out = launch_config(cfg, a, a_s, wq.view(torch.uint8), ws, bias, ELEM_CODE[a_elem], ELEM_CODE[w_elem],
                            swz and a_s is not None, swz, out_dtype=torch.float32, dot_dtype=torch.float16)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        tol = 1e-3 if a_elem == "float" and cfg.kernel == "mm" else 1e-6  # fp16 rounding of float activations
        print(a_elem, w_elem, cfg.kernel, swz, f"{err:.2e}", "OK" if err <= tol else "BAD")
    """
)


def test_kernels_in_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 9, proc.stdout
    assert all(line.endswith("OK") for line in lines), proc.stdout
