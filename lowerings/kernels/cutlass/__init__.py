"""qlower's CUTLASS kernels (CUDA C++ on CUTLASS/CuTe headers), built with nvcc at first use and cached.

`configs` names each compiled configuration, `build` finds the toolchain and builds the library, `w8a16` calls
the W8A16 GEMM and registers it as `qlower::woq_int8_cutlass`.
"""
