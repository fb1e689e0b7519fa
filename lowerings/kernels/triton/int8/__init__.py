"""The int8 family's Triton kernels (woq-int8: int8 weights, float activations; dynamic-int8: int8 x int8), their
launchers and their `triton_op`s.

- `kernels.py`: the FMA GEMV (woq-int8, tiny M) and the tiled tensor-core kernel both families share.
- `hopper.py`: the sm_90 TMA-fed kernels (`int8_mm_tma_dev_kernel`, `woq_mm_tma_dev_kernel`).
- `woq_decode.py`: the decode-size (M <= 16) weight-only kernel.
- `woq_limbs.py`: woq-int8 on the int8 tensor cores, the activation split into three exact int8 limbs.
- `ops.py`: `qlower::woq_int8_linear` / `qlower::dynamic_int8_linear` (triton_ops) and their launchers; which
  kernel and config run comes from `../configs.py` (tables in `../tuned/`).

Importing a kernel module or `ops` imports Triton; importing this package does not.
"""
