"""The MX Triton kernels' index, mask, swizzle and decode logic on CPU, in Triton's interpreter.

A subprocess sets TRITON_INTERPRET=1 before Triton is imported. Activations are fp32/fp16 (bf16 loads are
wrong in the interpreter) and the tile path's dots run in fp16; numerics at GPU precision are covered by
tests/lowerings/kernels/test_mx_gpu.py on the H200. Shapes are off every tile: M=5, N=48, K=96 (not a BLOCK_K
multiple).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import SUBPROCESS_TIMEOUT_S

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch
    from qlower.patterns import mx_format as fmt
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE, MXConfig, launch_config

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
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 9, proc.stdout
    assert all(line.endswith("OK") for line in lines), proc.stdout


DECODE_SCRIPT = textwrap.dedent(
    """
    import torch
    from qlower.patterns import mx_format as fmt
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops
    from qlower.lowerings.kernels.triton.mx.decode import BITS, DecodeConfig
    from qlower.lowerings.kernels.triton.mx.decode import as_words
    from qlower.lowerings.kernels.triton.mx.launch import launch_decode

    def mx_decode_linear(cfg, x, w, w_scale, bias, w_fmt, w_swizzled=False, out_dtype=None):
        # one DecodeConfig launched directly (no wrap_triton): uint8 weight [N, K/2 or K] -> out [M, N]
        out = torch.empty((x.shape[0], w.shape[0]), dtype=out_dtype or x.dtype, device=w.device)
        launch_decode(cfg, x, as_words(w), w_scale, bias, out, w_fmt, w_swizzled, direct=True)
        return out
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE

    torch.manual_seed(0)
    MM4 = DecodeConfig("mm", BITS, 16, 8, 4, 1, block_m=16)   # fp4: 64 elements per dot step
    MM8 = DecodeConfig("mm", BITS, 16, 16, 4, 1, block_m=16)  # fp8: 64 elements per dot step
    H1 = DecodeConfig("hfma", BITS, 16, 8, 4, 1, prefetch=True)  # mx_hfma (its exact fallback here)
    H1SK = DecodeConfig("hfma", BITS, 16, 8, 4, 1, split_k=3)
    H2 = DecodeConfig("hfma", BITS, 8, 16, 4, 1, block_m=2, prefetch=True)
    H4SK = DecodeConfig("hfma", BITS, 8, 16, 4, 1, block_m=4, split_k=2)

    def data(m, n, k, elem, adtype, x_mag=3.0):
        x, w = torch.randn(m, k) * x_mag, torch.randn(n, k) * 0.05
        wq, wc = fmt.quantize(w, elem)
        wref = fmt.dequantize_f64(wq, wc, elem)
        return x.to(adtype), wq.view(torch.uint8), wc, wref

    def report(tag, out, ref):
        err = ((out.double() - ref).norm() / ref.norm()).item()
        print(tag, f"{err:.2e}", "OK" if err <= 1e-3 else "BAD")

    # Kernels, explicit configs. K=224: 7 scale blocks (off every BLOCK_KW); N=40, 36: ragged N.
    CASES = [  # weight format, config, M, N, swizzled, bias, activation dtype
        ("e2m1", MM4, 7, 40, True, True, torch.float16),
        ("e4m3", MM8, 16, 36, False, True, torch.float16),
        ("e2m1", H1, 1, 40, False, True, torch.float16),
        ("e2m1", H1SK, 1, 40, True, False, torch.float16),
        ("e4m3", H2, 3, 36, True, True, torch.float16),
        ("e2m1", H4SK, 6, 40, True, True, torch.float16),
        ("e4m3", H4SK, 3, 40, False, True, torch.float16),
    ]
    K = 224
    for elem, cfg, m, n, swz, has_bias, adtype in CASES:
        x, wq, wc, wref = data(m, n, K, elem, adtype)
        bias = torch.randn(n) if has_bias else None
        ref = x.double() @ wref.t() + (bias.double() if has_bias else 0)
        out = mx_decode_linear(cfg, x, wq, fmt.to_swizzled(wc) if swz else wc, bias, ELEM_CODE[elem], swz,
                               out_dtype=torch.float32)
        report(f"{elem} {cfg.short()} M={m} N={n} swz={swz}", out, ref)

    # hfma scales each 32-block of x into f16 range: x far outside it (fp32 input) still matches.
    for elem, x_mag in (("e2m1", 1e6), ("e4m3", 1e-6)):
        x, wq, wc, wref = data(2, 40, K, elem, torch.float32, x_mag)
        out = mx_decode_linear(H2, x, wq, wc, None, ELEM_CODE[elem], False, out_dtype=torch.float32)
        report(f"{elem} hfma |x|~{x_mag:g}", out, x.double() @ wref.t())

    # The triton_op's weight-only path: picks the (BITS-decoded) decode kernels per M bucket.
    for elem, m in (("e2m1", 1), ("e4m3", 1), ("e2m1", 3), ("e4m3", 9)):
        n, k = 40, 256
        cfg = mx_ops.pick_decode(m, ELEM_CODE[elem], k, n)
        assert cfg is not None and cfg.decode == BITS, cfg
        x, wq, wc, wref = data(m, n, k, elem, torch.float16)
        bias = torch.randn(n).half()
        ref = x.double() @ wref.t() + bias.double()
        out = torch.ops.qlower.mx_linear(x, None, wq, fmt.to_swizzled(wc), bias, 0, ELEM_CODE[elem], False,
                                         True, torch.float32)
        report(f"op {elem} M={m} {cfg.short()}", out, ref)
    """
)


def test_decode_kernels_in_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", DECODE_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 13, proc.stdout
    assert all(line.endswith("OK") for line in lines), proc.stdout


def test_decode_table_matches_rules():
    """The committed H200 table and the rules for other shapes agree at every measured point."""
    from qlower.lowerings.kernels.triton.mx import ops
    from qlower.lowerings.kernels.triton.mx.decode import CVT

    for (w_fmt, m, k, n), cfg in ops.DECODE_TABLE.items():
        assert ops.decode_rule(m, w_fmt, k, n) == cfg, (w_fmt, m, k, n)
        for mm in {1: (1,), 2: (2,), 4: (3, 4), 16: (5, 16)}[m]:
            got = ops.pick_decode(mm, w_fmt, k, n)  # BITS-decoded when TRITON_INTERPRET is set here
            assert (got and dataclasses.replace(got, decode=CVT)) == cfg
    assert ops.decode_rule(1, ops.E2M1, 8192, 28672) == ops.HF_WIDE  # fp4, M=1, N > K: no prefetch, no split
    assert ops.decode_rule(1, ops.E2M1, 8192, 8192) == ops.HF_SQUARE_PF  # fp4, M=1, N = K: prefetch
    # fp4, M=1, K < N < 2K: the square tile, no prefetch
    assert ops.decode_rule(1, ops.E2M1, 4096, 6144) == ops.HF_SQUARE
    assert (
        ops.decode_rule(1, ops.E2M1, 8192, 1024).prefetch
        and ops.decode_rule(1, ops.E2M1, 8192, 1024).split_k == 1
    )
    assert ops.decode_rule(1, ops.E4M3, 8192, 28672) == ops.HF_WIDE  # fp8, wide N
    assert ops.decode_rule(1, ops.E4M3, 8192, 1024).split_k == 2  # fp8, K > N: split K
    assert ops.decode_rule(3, ops.E4M3, 1024, 8192) == ops.DEC_MM_FP8  # fp8, M 3-4, N > K: the dot kernel
    assert ops.decode_rule(17, ops.E4M3, 4096, 4096) is None  # above the measured range: current kernels
    assert ops.decode_rule(1, ops.E5M2, 4096, 4096) is None
    assert ops.HF_WIDE.kernel == "hfma" and ops.DEC_MM_FP4.decode == CVT


def test_dynamic_m_buckets_cover_m1_under_the_size_assumption():
    """A symbolic M is traced as >= 2 (0/1 specialization) but an AOTInductor package also runs at M = 1: the
    gates must keep the M == 1 bucket, and at every M exactly one bucket's gate is 1 (without that, an
    AOTInductor package on the H200 pruned the M == 1 bucket and M = 1 got no launch, an unwritten output)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, statically_known_true

    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    env = ShapeEnv()
    sym = env.create_symbol(8, ConstantSource("m"), dynamic_dim=DimDynamic.DYNAMIC)
    m = env.create_symintnode(sym, hint=8)
    assert statically_known_true(m > 1)  # the tracing assumption the gates must not rely on
    gates = {bucket: mx_ops._gate(m, *bucket) for bucket in mx_ops._BUCKETS}
    assert all(g is not None for g in gates.values()), gates
    for v in (1, 2, 3, 4, 5, 16, 17, 1000):
        on = [b for b, g in gates.items() if int(g.node.expr.subs(sym, v)) == 1]
        off = [b for b, g in gates.items() if int(g.node.expr.subs(sym, v)) == 0]
        assert len(on) == 1 and len(on) + len(off) == len(gates), (v, on)
        lo, hi = on[0]
        assert lo <= v and (hi is None or v <= hi), (v, on)


SPECIAL_CODES_SCRIPT = textwrap.dedent(
    """
    import torch
    from qlower.patterns import mx_format as fmt
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE

    # The BITS decoder (tl bit ops), the one the interpreter runs.
    # Row n of the weight holds fp8 code n first, zeros after; x = 1: out[:, n] is code n's value, so every
    # code (NaN and Inf encodings included) is checked against torch's own float8 cast.
    n, k = 256, 256
    for elem, dtype in (("e4m3", torch.float8_e4m3fn),):  # e5m2: the interpreter's fp8e5 cast is finite on
        # Inf/NaN codes (Triton 3.x emulation), so its check runs on the GPU
        # (tests/lowerings/kernels/test_mx_gpu.py)
        wq = torch.zeros(n, k, dtype=torch.uint8)
        wq[:, 0] = torch.arange(256, dtype=torch.uint8)
        want = wq[:, 0].view(dtype).float()
        wc = torch.full((n, k // 32), 127, dtype=torch.uint8)
        for m in (1, 9):
            cfg = mx_ops.pick_decode(m, ELEM_CODE[elem], k, n)
            x = torch.ones(m, k, dtype=torch.float16)
            out = torch.ops.qlower.mx_linear(x, None, wq, fmt.to_swizzled(wc), None, 0, ELEM_CODE[elem], False,
                                             True, torch.float32)
            same = torch.equal(out.isnan(), want.isnan().expand(m, n)) and torch.equal(
                out.nan_to_num(), want.nan_to_num().expand(m, n))
            print(elem, m, cfg.short() if cfg else "mm", "OK" if same else "BAD")
    """
)


def test_every_fp8_code_decodes_as_torch_in_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SPECIAL_CODES_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and "/bits" in lines[0] and "/bits" in lines[1], proc.stdout  # decode kernels
    assert all(line.endswith("OK") for line in lines), proc.stdout
