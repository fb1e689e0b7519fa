"""AUTO's measured M crossovers on CUDA, in one table: the M at which one lowering hands a static M to the next
in the ranking, or (a symbolic M) at which qlower's op hands the run-time M to another kernel inside the call.

Only `lowerings/devices/` reads these (tests/tools/test_layout.py checks it): the device rules decline a
static M outside a range (`prefer`), and hand the numbers an emitter needs to it as arguments, with the
preference the choice was made under (an explicit preference keeps the chosen kernel at every M). The CPU's
crossovers are rows of the per-ISA tables in `devices/cpu.py`. Each number cites the table in BENCHMARKS.md it
comes from.

What is not here: the kernels' own configuration tables (tile shapes per M bucket, `kernels/triton/configs.py`,
`kernels/triton/mx/ops.py`, `kernels/cutlass/tuned/`), which choose how one kernel runs an M, not which
lowering runs it.
"""

from __future__ import annotations

# woq-int8, qlower's Triton kernel -> fused dequant + cuBLAS: the largest static M at which the Triton kernel was
# measured at least as fast. On sm_90, timed side by side with dequant + cuBLAS at M = 64, 128 and 256 on
# 4096->4096 and 4096->14336, the Triton kernel won all six (17.4 vs 23.2 ... 77.2 vs 93.3 us; neither reaches
# bf16 F.linear there). At M = 1024 it lost (77.9 vs 57.8 us on 4096->4096; the mixed-dtype tensor-core loop
# reaches ~450 TFLOP/s, cuBLAS bf16 ~800), and at M = 4096 (302 vs 195 us; 4096->14336 1096 vs 649 us). M = 512
# was not measured, so the limit is the last measured win. The PTX tiles narrow the gap but still lose there
# (M = 1024 4096^2: 67.7 vs 57.9 us; M = 4096: 266 vs 189 us). BENCHMARKS.md, "CUDA, woq_int8". A symbolic M
# under AUTO runs the Triton op, which hands M above this to dequant + cuBLAS inside the call.
WOQ_INT8_TRITON_MAX_M: int | None = 256

# dynamic-int8, qlower's Triton int8 kernels -> cuBLASLt `_int_mm`: None, they won on the whole grid measured
# (M = 4096, 4096->14336: 342 vs 544.8 us kernel alone; BENCHMARKS.md, "CUDA, dynamic_int8").
DYNAMIC_INT8_TRITON_MAX_M: int | None = None

# woq-int8, qlower's CUTLASS W8A16 GEMM (sm_90a): the static M range AUTO ranks it first in, (lowest, highest or
# None). On the H200 (BENCHMARKS.md, "CUTLASS W8A16") it ran 1.12x / 0.95x bf16 at M = 128 (4096->14336 /
# 14336->4096), where the Triton tiles ran 0.92x / 0.66x; 0.84-0.97x at M = 256, where dequant + cuBLAS ran
# 0.47-0.49x; 0.93-0.99x at M = 4096 (dequant + cuBLAS 0.92-0.94x). At M = 8192 dequant + cuBLAS is faster
# (0.98-1.00x against 0.91-0.94x). A symbolic M under CUDA graphs runs the Triton op with this GEMM as its
# branch from the range's start.
CUTLASS_W8A16_M_RANGE: tuple[int, int | None] = (128, 4096)

# MXFP4 weight-only with bf16 x, qlower's CUTLASS MXFP4 GEMM (sm_90a): the static M range AUTO ranks it first
# in, ahead of the Triton MX op (lowest, highest or None; None: not measured, AUTO never takes it). On the H100
# (BENCHMARKS.md, "CUTLASS MXFP4"; 4096->14336 / 14336->4096, kernels alone) it ran 1.39x / 1.30x bf16 at M = 64
# where the Triton tiles ran 1.19x / 1.09x, 1.25x / 1.13x at M = 128 (Triton 0.85x / 0.48x) and 0.70x / 0.81x at
# M = 256 (Triton's dequantize + cuBLAS 0.46x / 0.49x); at M = 1024 dequantize + cuBLAS is ahead (0.67x / 0.70x
# against 0.62x), so it keeps M above the range. The range starts at 33, the first M of the 64-token tile that
# serves M = 64: a tile's work does not depend on how many of its rows are real (TMA fills the others with zeros,
# the MMAs are the same), so the time measured at M = 64 is the time from M = 33; and the Triton op's run-time
# bucket of a symbolic M is 33-64. A symbolic M runs the Triton op with this GEMM from the range's start to its
# end, dequantize + cuBLAS above (`kernels/triton/mx/launch.py: mxfp4_dense`).
CUTLASS_MXFP4_M_RANGE: tuple[int, int | None] | None = (33, 256)

# MX, qlower's Triton MX op -> the emulation, for weight-only MX other than MXFP4 with bf16 x: the op's decode
# kernels serve M <= 16 (2x bf16); above it the op runs the tile kernel, measured at 0.16-0.43x bf16 at
# M = 128-4096 on sm_90, below the emulation's 0.85-0.93x (BENCHMARKS.md, "CUDA, mx"). MXFP4 with bf16 x keeps
# the op at every M (its bf16-decode kernels). Equal to the op's own decode range (`mx.ops.DECODE_MAX_M`,
# tests/tools/test_layout.py checks it).
MX_WEIGHT_ONLY_TRITON_MAX_M = 16

# MX with MX activations, qlower's Triton MX op -> the emulation: the op's GEMV serves M <= 4; above it the fp8
# tile kernel measured 0.15x bf16 (M = 4096) and 0.33x (M = 128) on sm_90. A symbolic M is declined. Equal to
# the op's GEMV range (`mx.ops.GEMV_MAX_M`).
MX_DYNAMIC_TRITON_MAX_M = 4
