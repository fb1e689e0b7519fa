"""e8m0 codes 0 and 255 through qlower's MX Triton kernels: decoded as the matched graph decodes them.

The recognizer records where a decode departs from the OCP spec (0 -> 0.0, 255 -> +inf:
`rec.weight_mx.scale_special`, `aq.mx.scale_special`); `emit_mx_triton` maps that to the `a_special` /
`w_special` flags of `qlower::mx_linear`, and every kernel decodes by them. In Triton's interpreter (CPU;
inline PTX cannot run there, so `mx_bf16` is checked on the GPU, tests/lowerings/kernels/test_mx_gpu.py) each
interpretable kernel path runs with codes 0 and 255 planted, under each flag combination, against float64
`mx_format.dequantize_f64(..., special=...)` products: NaN / +inf / -inf where the reference has them (a +inf
scale gives NaN at a zero element, +-inf where every product of its block has one sign), finite values within
the interpreter tests' tolerances, and exact zeros where code 0 decodes to 0.0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import qlower
from qlower.patterns import mx_format as fmt
from tests.helpers import SUBPROCESS_TIMEOUT_S

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import math
    import torch
    from qlower.patterns import mx_format as fmt
    from qlower.lowerings.kernels.triton.mx.ops import ELEM_CODE, MXConfig, Special, launch_config
    from qlower.lowerings.kernels.triton.mx.decode import BITS, DecodeConfig, as_words
    from qlower.lowerings.kernels.triton.mx.launch import launch_decode

    SPECIALS = {0: {}, 1: {0: 0.0}, 2: {255: math.inf}, 3: {0: 0.0, 255: math.inf}}
    ONE = {"e2m1": 0x22, "e4m3": 0x38}  # a byte of 1.0 elements
    M, N, K = 4, 24, 64  # two scale blocks; N off the 32-row tiles (few programs: the interpreter is slow)
    GEMV = MXConfig("gemv", block_n=32, block_k=64, num_warps=4, num_stages=1)
    MM = MXConfig("mm", block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=1)
    HF = DecodeConfig("hfma", BITS, 32, 4, 4, 1, block_m=4, split_k=2)  # e2m1: a block per tile, two K splits
    HF2 = DecodeConfig("hfma", BITS, 32, 8, 4, 1, block_m=2, prefetch=True)  # e4m3: one block per tile
    DMM = DecodeConfig("mm", BITS, 32, 8, 4, 1, block_m=16)

    def weight(elem):
        q, e = fmt.quantize(torch.randn(N, K) * 0.05, elem)
        qb = q.view(torch.uint8)
        per = K // 2 if elem == "e2m1" else K  # bytes per row
        e[0, 1], qb[0, per // 2:] = 255, ONE[elem]         # block 1 all 1.0 under x = 1: +inf with SPECIAL_INF
        e[1, 0], qb[1, 0] = 255, 0                         # a zero element: NaN either way
        e[2, :] = 0                                        # every block code 0: 0.0 or 2**-127 times the row
        e[3, 1], qb[3, per // 2:] = 255, ONE[elem] | 0x88 if elem == "e2m1" else 0xB8  # all -1.0: -inf
        e[4, 0] = 0
        return qb, e

    def act(elem, dtype, zero_row):
        x = torch.randn(M, K) * 3
        x[:, 32:] = 1.0
        if elem == "float":
            return x.to(dtype), None, x.to(dtype).double()
        q, e = fmt.quantize(x, elem)
        e[1, 0], e[3, 0] = 255, 0
        if zero_row:  # row 3 meets the +inf weight blocks with 2**-127 (inf) or 0.0 (NaN) activations; the
            e[3, 1] = 0  # FP8 tiles' per-element recompute dots in fp16 here (bf16 on the GPU), which flush them
        return q.view(torch.uint8), e, None  # the reference decodes these codes per flag below

    def high_code_row(wq, wc, elem, code, one):
        # Row 5's block 0: a high finite code over zeros and, with `one`, one 0.5 element: its products
        # (|x| < 32 at code <= 250) are finite, and a factor > 1 folded into that scale overflowed it (inf, or
        # 0 * inf NaN; zeros stay 0 in the graph's fp16 weight too).
        wq, wc = wq.clone(), wc.clone()
        per = 16 if elem == "e2m1" else 32
        wc[5, 0], wq[5, :per] = code, 0
        if one:
            wq[5, 0] = 0x01 if elem == "e2m1" else 0x30
        return wq, wc

    # (code, one 0.5 element): the element only where the kernel's dots hold 2**122 (`big` below)
    HIGH_CODES = ((249, True), (250, True), (252, False), (254, False))

    def run_case(run, a, a_codes, wq, wc, a_fmt, w_fmt, sp):
        flags = Special(sp if a_codes is not None else 0, sp)
        if run in ("gemv", "mm"):
            cfg = GEMV if run == "gemv" else MM
            return launch_config(cfg, a, a_codes, wq, wc, None, a_fmt, w_fmt, out_dtype=torch.float32,
                                 dot_dtype=torch.float16, special=flags)
        if run == "op":
            return torch.ops.qlower.mx_linear(a, None, wq, wc, None, a_fmt, w_fmt, False, False, torch.float32,
                                              False, 0, sp)
        out = torch.empty(M, N, dtype=torch.float32)
        launch_decode(run, a, as_words(wq), wc, None, out, w_fmt, direct=True, w_special=sp)
        return out

    # name, activation format, weight format, activation dtype, runner, tolerance, holds 2**-127 products,
    # holds 2**122 weights (not the fp16 dots of a dequantized tile: the graph's fp16 weight is inf there too)
    CASES = [
        ("gemv", "float", "e2m1", torch.float32, "gemv", 1e-6, True, True),
        ("gemv-mx", "e4m3", "e2m1", None, "gemv", 1e-6, True, True),
        ("mm-upcast", "float", "e4m3", torch.float16, "mm", 1e-3, False, False),  # fp16 dots flush 2**-127
        ("mm-upcast-e2m1", "float", "e2m1", torch.float16, "mm", 1e-3, False, False),
        ("mm-fp8", "e4m3", "e4m3", None, "mm", 1e-6, True, True),
        ("mm-fp8-e2m1", "e2m1", "e2m1", None, "mm", 1e-6, True, True),
        ("hfma", "float", "e2m1", torch.float16, HF, 1e-3, True, True),
        ("hfma-e4m3", "float", "e4m3", torch.float32, HF2, 1e-3, True, True),  # x scaled into fp16
        ("decode-mm", "float", "e2m1", torch.float16, DMM, 1e-3, False, False),
        ("op", "float", "e4m3", torch.float16, "op", 1e-3, True, True),  # qlower::mx_linear at M = 4: hfma
    ]
    torch.manual_seed(0)
    for name, a_elem, w_elem, adtype, run, tol, tiny, big in CASES:
        wq, wc = weight(w_elem)
        a, a_codes, a_ref = act(a_elem, adtype, zero_row=run == "gemv")
        a_fmt, w_fmt = ELEM_CODE[a_elem], ELEM_CODE[w_elem]
        bad = []
        for code, one in HIGH_CODES:
            hq, hc = high_code_row(wq, wc, w_elem, code, one and big)
            out = run_case(run, a, a_codes, hq, hc, a_fmt, w_fmt, 0).double()
            aref = a_ref if a_codes is None else fmt.dequantize_f64(a, a_codes, a_elem)
            want = (aref[:, None, :] * fmt.dequantize_f64(hq, hc, w_elem)[None, :, :]).sum(-1)[:, 5]
            got, fin = out[:, 5], want.isfinite()  # MX activations' own special codes make rows 1, 3 NaN
            ok = torch.equal(got.isfinite(), fin) and torch.equal(got.isnan(), want.isnan())
            if not (ok and ((got[fin] - want[fin]).norm() / want[fin].norm()).item() <= tol):
                bad.append(f"code {code}: {got.tolist()} vs {want.tolist()}")
        print(9, name, "OK" if not bad else f"BAD {bad}", flush=True)
        for sp, special in SPECIALS.items():
            wref = fmt.dequantize_f64(wq, wc, w_elem, special=special)
            aref = a_ref if a_codes is None else fmt.dequantize_f64(a, a_codes, a_elem, special=special)
            ref = (aref[:, None, :] * wref[None, :, :]).sum(-1)  # elementwise: IEEE 0 * inf, no BLAS shortcuts
            out = run_case(run, a, a_codes, wq, wc, a_fmt, w_fmt, sp).double()
            fin = ref.isfinite() & out.isfinite()
            err = ((out[fin] - ref[fin]).norm() / ref[fin].norm()).item()
            checks = {
                "nan": torch.equal(out.isnan(), ref.isnan()),
                "+inf": torch.equal(out == math.inf, ref == math.inf),
                "-inf": torch.equal(out == -math.inf, ref == -math.inf),
                "finite": err <= tol,
                "zeros": bool((out[ref == 0] == 0).all()),  # code 0 as 0.0: products exactly 0
            }
            fp8_tail = run == "mm" and a_elem != "float" and sp & 2  # recomputed in fp16 dots: flushed
            if tiny and not sp & 1 and not fp8_tail:  # code 0 as 2**-127: the all-code-0 column's tiny values
                c = ref[:, 2].isfinite()
                col, want = out[c, 2] * 2.0**127, ref[c, 2] * 2.0**127
                checks["tiny"] = ((col - want).norm() / want.norm()).item() <= 1e-3
            assert (ref == math.inf).any() == bool(sp & 2) and (ref == -math.inf).any() == bool(sp & 2)
            bad = [k for k, ok in checks.items() if not ok]
            print(sp, name, f"{err:.1e}", "OK" if not bad else f"BAD {bad}", flush=True)
    """
)


@pytest.fixture(scope="module")
def interpreter_results() -> dict[int, list[str]]:
    """Every case under every flag value, in one interpreter subprocess (TRITON_INTERPRET before import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[int, list[str]] = {}
    for line in proc.stdout.strip().splitlines():
        sp, rest = line.split(" ", 1)
        out.setdefault(int(sp), []).append(rest)
    return out


@pytest.mark.parametrize("special", [0, 1, 2, 3])  # bit 0: code 0 is 0.0; bit 1: code 255 is +inf
def test_kernels_decode_special_codes_in_triton_interpreter(interpreter_results, special):
    lines = interpreter_results[special]
    assert len(lines) == 10, lines
    assert all(line.endswith("OK") for line in lines), lines


def test_kernels_keep_high_finite_scale_codes_finite_in_triton_interpreter(interpreter_results):
    """Codes 249-254 under each kernel: finite where float64 is, within the kernel's tolerance of it."""
    lines = interpreter_results[9]
    assert len(lines) == 10, lines
    assert all(line.endswith("OK") for line in lines), lines


# ------------------------------------------------------------------------------------------ emission
def _weight_only_fp4(x, q, e):  # the hand-written form: exp2 in fp32 gives +inf at code 255
    return F.linear(x, fmt.dequantize(q, e, "e2m1", torch.bfloat16))


def _bit_shift_fp4(x, q, e):  # the exponent field: 0.0 at code 0, +inf at code 255
    w = fmt.dequantize(q, torch.full_like(e, 127), "e2m1", torch.float32)
    s = (e.to(torch.int32) << 23).view(torch.float32)
    return F.linear(x, (w.view(-1, e.shape[1], 32) * s.unsqueeze(-1)).view(w.shape).to(x.dtype))


def _guarded_fp4(x, q, e):  # NaN at code 255: the spec
    w = fmt.dequantize(q, torch.full_like(e, 127), "e2m1", torch.float32)
    s = torch.where(e == 255, float("nan"), torch.exp2(e.float() - 127))
    return F.linear(x, (w.view(-1, e.shape[1], 32) * s.unsqueeze(-1)).view(w.shape).to(x.dtype))


def _dynamic_fp8(xq, xs, q, e):  # activation decode +inf at code 255, the weight's NaN (the spec)
    x = fmt.dequantize(xq, xs, "e4m3", torch.bfloat16)
    s = torch.where(e == 255, float("nan"), torch.exp2(e.float() - 127))
    w = (q.float().view(-1, e.shape[1], 32) * s.unsqueeze(-1)).view(q.shape)
    return F.linear(x, w.to(torch.bfloat16))


def _lowered_hops(fn, *specs):
    """Trace fn on fake CUDA tensors and lower it as on an H100 (no GPU needed): the Triton launches emitted."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from qlower.lowerings.devices.cuda import override_cuda_capability
    from qlower.testing import apply_pass

    with FakeTensorMode():
        args = [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in specs]
        gm = make_fx(fn, decomposition_table=select_decomp_table())(*args)
    with override_cuda_capability((9, 0)):
        report = apply_pass(gm, families=("mx",), kernel_preference=qlower.KernelPreference.TRITON)
    assert [d.lowering for d in report] == ["triton.mx_linear"], report
    graphs = [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]
    hops = [n for g in graphs for n in g.graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert hops
    return hops


N, K = 64, 128


@pytest.mark.parametrize(
    "fn,m,want",
    [
        (_weight_only_fp4, 1, 2),  # the f16x2 GEMV
        (_weight_only_fp4, 40, 2),  # `mx_bf16` tiles
        (_bit_shift_fp4, 3, 3),
        (_guarded_fp4, 1, 0),
    ],
)
def test_emission_passes_the_records_weight_flags(fn, m, want):
    specs = (((m, K), torch.bfloat16), ((N, K // 2), torch.uint8), ((N, K // 32), torch.uint8))
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    flags = {
        kernel_side_table.get_kernel(h.kwargs["kernel_idx"]).fn.__name__: h.kwargs["kwargs"].get("SPECIAL")
        for h in _lowered_hops(fn, *specs)
    }
    flags.pop("splitk_reduce_kernel", None)  # sums fp32 partials: no scales
    assert flags and all(f == want for f in flags.values()), flags


def test_emission_passes_activation_and_weight_flags_apart():
    specs = (
        ((2, K), torch.float8_e4m3fn),
        ((2, K // 32), torch.uint8),
        ((N, K), torch.float8_e4m3fn),
        ((N, K // 32), torch.uint8),
    )
    (hop,) = _lowered_hops(_dynamic_fp8, *specs)  # M = 2: the GEMV
    consts = hop.kwargs["kwargs"]
    assert (consts["A_SPECIAL"], consts["W_SPECIAL"]) == (2, 0), consts


def test_special_bits_and_the_ops_defaults():
    from qlower.lowerings.emit.triton_mx import special_bits
    from qlower.lowerings.kernels.triton.mx import ops as mx_ops

    assert special_bits(None) == special_bits({}) == 0
    assert special_bits({0: 0.0}) == 1 and special_bits({255: float("inf")}) == 2
    assert special_bits({0: 0.0, 255: float("inf")}) == 3
    with pytest.raises(ValueError, match="code 255 as 0.0"):
        special_bits({255: 0.0})
    defaults = {a.name: a.default_value for a in mx_ops.mx_linear._opoverload._schema.arguments}
    assert defaults["a_special"] == 0 and defaults["w_special"] == 0  # callers without flags: the spec
