"""The inline-PTX int8 -> bf16/fp16 conversions of `kernels._int8_to`, checked on the CPU.

The GPU tests compare the PTX path with the fp32 path bit for bit, but CI has no GPU. Here a small evaluator
runs the exact PTX text (the handful of instructions it uses, with their PTX semantics) on every int8 value
in every byte position and compares with torch's own int8 -> bf16/fp16 conversion, so an edit of the PTX that
breaks the numbers fails in CI too. Needs Triton only to import the kernels module.
"""

from __future__ import annotations

import importlib.util
import struct

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _half_bits(value: float, dtype: torch.dtype) -> int:
    return int(torch.tensor(value, dtype=torch.float32).to(dtype).view(torch.int16).item()) & 0xFFFF


def _half_value(bits: int, dtype: torch.dtype) -> float:
    return float(
        torch.tensor(bits - (1 << 16) if bits & 0x8000 else bits, dtype=torch.int16).view(dtype).item()
    )


def _pairwise(a: int, b: int, c: int | None, dtype: torch.dtype, op) -> int:
    """A `.bf16x2` / `.f16x2` instruction: op on each 16-bit lane, rounded once to the lane's type."""
    out = 0
    for shift in (0, 16):
        lanes = [_half_value((v >> shift) & 0xFFFF, dtype) for v in (a, b) + ((c,) if c is not None else ())]
        out |= _half_bits(op(*lanes), dtype) << shift  # exact in float64 here, then one rounding
    return out


def _prmt(a: int, b: int, sel: int) -> int:
    pool = struct.pack("<II", a, b)
    return sum(pool[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def run_ptx(asm: str, operands: dict[str, int]) -> dict[str, int]:
    """Evaluate the one-line asm block; `operands` maps "$i" to its value, outputs come back in the dict."""
    regs = dict(operands)
    body = asm.strip().removeprefix("{").removesuffix("}")
    for stmt in filter(None, (s.strip() for s in body.split(";"))):
        op, _, args = stmt.partition(" ")
        names = [a.strip() for a in args.split(",")]
        if op.startswith(".reg"):
            continue

        def val(x: str) -> int:
            return int(x, 0) & 0xFFFFFFFF if x[0].isdigit() else regs[x]  # an immediate or a register

        dst, src = names[0], [val(x) for x in names[1:]]
        if op == "mov.b32":
            regs[dst] = src[0]
        elif op == "cvt.u32.u16":
            regs[dst] = src[0] & 0xFFFF
        elif op == "and.b32":
            regs[dst] = src[0] & src[1]
        elif op == "xor.b32":
            regs[dst] = src[0] ^ src[1]
        elif op == "prmt.b32":
            regs[dst] = _prmt(src[0], src[1], src[2])
        elif op == "lop3.b32":
            lut = src[3]
            regs[dst] = sum(
                ((lut >> ((((src[0] >> i) & 1) << 2) | (((src[1] >> i) & 1) << 1) | ((src[2] >> i) & 1))) & 1)
                << i
                for i in range(32)
            )
        elif op == "fma.rn.bf16x2":
            regs[dst] = _pairwise(src[0], src[1], src[2], torch.bfloat16, lambda a, b, c: a * b + c)
        elif op == "sub.f16x2":
            regs[dst] = _pairwise(src[0], src[1], None, torch.float16, lambda a, b: a - b)
        else:
            raise AssertionError(f"the evaluator does not know {op!r}: extend it with its PTX semantics")
    return regs


def _int8s(word: int, count: int) -> list[int]:
    return [((word >> (8 * i)) & 0xFF) - 256 * ((word >> (8 * i + 7)) & 1) for i in range(count)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pairs", [1, 2])
def test_ptx_int8_conversion_is_exact_for_every_byte(pairs, dtype):
    from qlower.lowerings.kernels.triton.int8 import kernels

    asm = (kernels._ptx_int8_to_bf16 if dtype == torch.bfloat16 else kernels._ptx_int8_to_f16)(pairs)
    assert "\n" not in asm  # Inductor copies it into its generated module as a one-line literal
    outputs = [f"${i}" for i in range(pairs)]
    src = f"${pairs}"  # inputs follow the outputs
    words = [b * 0x01010101 for b in range(256)]  # every value in every byte position
    words += [0x80FF7F00, 0x0180FE7F, 0x7F80FF01, 0x12345678, 0xFEDCBA98]  # mixed neighbours
    for word in words:
        word &= 0xFFFF if pairs == 1 else 0xFFFFFFFF
        regs = run_ptx(asm, {src: word})
        got = []
        for out in outputs:
            got += [_half_value(regs[out] & 0xFFFF, dtype), _half_value(regs[out] >> 16, dtype)]
        want = [float(torch.tensor(v, dtype=torch.int8).to(dtype)) for v in _int8s(word, 2 * pairs)]
        assert got == want, (hex(word), got, want)


def test_evaluator_rejects_unknown_instructions():
    """The evaluator must not pass an instruction it does not model (a test that cannot fail otherwise)."""
    with pytest.raises(AssertionError, match="does not know"):
        run_ptx("{ add.s32 $0, $1, 1; }", {"$1": 0})
