"""The MX family's Triton kernels (MXFP8 / MXFP4 weights, e8m0 block scales, on GPUs without MX tensor cores),
their launchers and their `triton_op`.

- `kernels.py`: the MX GEMV and tile kernels (`mx_gemv_kernel`, `mx_mm_kernel`) and the format codes.
- `decode.py`: the word-wise weight-only decode kernels and `DecodeConfig`.
- `hfma.py`: the weight-only GEMV on packed f16x2 FMAs (M <= 4).
- `bf16.py`: e2m1 decoded straight to scaled bf16 (tile kernel and the dequantize-then-cuBLAS kernel).
- `launch.py`: which decode kernel runs a `DecodeConfig`, and its grid.
- `ops.py`: `qlower::mx_linear` (triton_op) and which kernel/config runs for which shape (the measured weight-only
  decode table is data: the `"mx"` table of `../tuned/<gpu>.json`).

Importing a kernel module or `ops` imports Triton; importing this package does not.
"""
