// The C ABI of qlower's MXFP4 weight-only GEMM objects (mxfp4_sm90.cu): one struct, one entry point per
// configuration. Mirrored by lowerings/kernels/cutlass/mxfp4.py (ctypes); a new field is appended, never inserted.
// Status codes are QlowerW8A16Status's (w8a16_sm90.h).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// K elements per tile of the kernel and per entry of the scale tensor: an entry holds the tile's 4 MX block
// scales (32 elements each) of one output channel as bf16.
#define QLOWER_MXFP4_TILE_K 128

typedef struct QlowerMxfp4Args {
  const void* x;       // [m, k] bf16, row stride ldx
  const void* w;       // [n, k / 2] uint8: e2m1 codes, element 2i in the low nibble of byte i; row stride ldw bytes
  const void* scales;  // [k / 128, n, 4] bf16, contiguous: scales[t, j, b] = the scale of w[j, 128 t + 32 b ...]
  const void* bias;    // [n] bf16, or null
  void* out;           // [m, n] bf16, row stride ldout
  void* workspace;     // null: query (returns QLOWER_W8A16_NEEDS_WORKSPACE when one is needed)
  void* stream;        // cudaStream_t
  int64_t m, n, k, ldx, ldw, ldout;
  int64_t workspace_bytes;
  int32_t splits;    // stream-K configurations: 0 = CUTLASS's heuristic, s > 0 = split-K into s slices
  int32_t device;
  int32_t sm_count;  // 0: queried by CUTLASS
} QlowerMxfp4Args;

#ifdef __cplusplus
}
#endif
