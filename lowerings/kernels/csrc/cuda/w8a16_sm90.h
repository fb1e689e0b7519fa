// The C ABI of qlower's W8A16 GEMM objects (w8a16_sm90.cu): one struct, one entry point per configuration.
// Mirrored by lowerings/kernels/cutlass/w8a16.py (ctypes) and woq_int8_cutlass.cpp; a new field is appended, never inserted.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum QlowerW8A16Status {
  QLOWER_W8A16_OK = 0,
  QLOWER_W8A16_CANNOT_IMPLEMENT = 1,   // CUTLASS's can_implement refused the shapes, strides or alignment
  QLOWER_W8A16_NEEDS_WORKSPACE = 2,    // workspace_bytes now holds the size needed: allocate, call again
  QLOWER_W8A16_INIT_FAILED = 3,
  QLOWER_W8A16_LAUNCH_FAILED = 4,
  QLOWER_W8A16_BAD_DTYPE = 5,
  QLOWER_W8A16_NOT_BUILT_FOR_SM90A = 6,
};

enum QlowerW8A16Dtype { QLOWER_W8A16_BF16 = 0, QLOWER_W8A16_FP16 = 1 };

typedef struct QlowerW8A16Args {
  const void* x;      // [m, k], row stride ldx, x's dtype
  const void* w;      // [n, k] int8, row stride ldw
  const void* scale;  // [n] (scale_per_channel) or [1], x's dtype
  const void* bias;   // [n] x's dtype, or null
  void* out;          // [m, n], row stride ldout, x's dtype
  void* workspace;    // null: query (returns QLOWER_W8A16_NEEDS_WORKSPACE when one is needed)
  void* stream;       // cudaStream_t
  int64_t m, n, k, ldx, ldw, ldout;
  int64_t workspace_bytes;
  int32_t dtype;  // QlowerW8A16Dtype
  int32_t scale_per_channel;
  int32_t splits;    // stream-K configurations: 0 = CUTLASS's heuristic, s > 0 = split-K into s slices
  int32_t device;
  int32_t sm_count;  // 0: queried by CUTLASS
} QlowerW8A16Args;

#ifdef __cplusplus
}
#endif
