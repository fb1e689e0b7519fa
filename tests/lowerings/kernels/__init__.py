"""The kernels: Triton (interpreter on CPU, numerics on GPU), the CPU C++ ops, CUTLASS, the native library
builds, the tuned tables."""
