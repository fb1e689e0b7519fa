// qlower::woq_int8_gemm: x [M, K] (bf16/fp16/fp32) @ w [N, K] int8, with the int8 -> float conversion inside
// the kernel, on CPU. It computes the user's formula with the user's own roundings, up to the order
// of the fp32 sums:
//   acc[m, n] = sum_k x[m, k] * w'[n, k] in fp32, w' = w (exact in every activation dtype), or, when the graph
//               scales the weight (`w.to(dtype) * s`), w' = round_dtype(fp32(w) * s[n]) as the graph rounds it;
//   y = round_dtype(acc)                                  (the matmul's rounding to x's dtype)
//   y = round_out(fp32(y) * s[n]) if the scale is on the output (`F.linear(x, w.to(dtype)) * s`), in fp32;
//   y = round_out(fp32(y) + bias[n]) if a bias is given.
// Products of bf16/fp16 activations and int8 weights are exact in fp32; fp32 activations round each product
// as F.linear's own FMAs do. The AVX512-BF16 path (vdpbf16ps) treats bf16 denormals as zero, like oneDNN's bf16
// GEMM on the same instruction; the chunked path below runs F.linear's own GEMM on the converted weight.
//
// Four paths, chosen per call (`QLOWER_CPU_WOQ_GEMM_PATH=auto|direct|chunked|amx|panel`, read at each call;
// auto when unset):
// - direct: qlower's own micro-kernel (a dot-product formulation: both operands are contiguous along K, so
//   neither is transposed):
//   - threads over blocks of N columns (and of M rows for large M), each block [mb x nb] summed over K
//     blocks into a thread-local fp32 strip, then finished (roundings, scale, bias) by a vectorized epilogue;
//   - M <= 8 (decode): the int8 rows are converted in registers right where the FMAs read them, one pass
//     over K per 4 rows;
//   - larger M: each int8 [nb x kc] block is converted once into a thread-local float (or bf16) buffer and
//     reused by every M row of the block;
//   - micro-kernel: MR rows x NR columns of vector accumulators over K, horizontal sums at the end of a K
//     block.
// - chunked: threads over chunks of N columns (and blocks of at most 1024 M rows, smaller where there are
//   fewer chunks than threads); each thread converts its chunk's int8 rows w[n0 : n0 + nc, :] (all of K)
//   into a thread-local buffer of x's dtype (exact for int8; w' above where the graph scales the weight)
//   sized for L2 (512 KiB; 8 MiB from M = 256 on, wide enough for oneDNN's GEMM; 16 rows at least), multiplies
//   it with ATen's own GEMM (`at::mm_out`, as F.linear does: oneDNN's bf16 GEMM, AMX / AVX512-BF16 where the
//   CPU has them; one thread inside the parallel region) into a thread-local [mb, nc] buffer of x's dtype
//   (the matmul's rounding), and finishes it with the same epilogue. Correct on every CPU; fast where ATen's
//   GEMM is (the direct micro-kernel was 0.16-0.43x of bf16 F.linear at M >= 16 on a Xeon with AMX:
//   BENCHMARKS.md, "CPU, woq_int8: qlower::woq_int8_gemm").
// - amx: AMX-BF16 tiles (the `amx` namespace below says how) for bf16 x with a [N, K] weight, where the CPU
//   has AMX and the OS grants the tile state (amx_usable).
// - panel: vdpbf16ps for bf16 x with a [N, K] weight and even K (avx512_bf16::run_panel): panels of 48
//   columns converted once into vdpbf16ps's pair layout, x's rows broadcast against them (no horizontal sums).
// auto (plan_call, which `woq_int8_gemm_plan` reports): amx for bf16 x from M = kAmxMinM to kAmxMaxM where the
// tiles are usable; chunked for bf16 x at the avx512_bf16 level from M = kChunkedMinM on where oneDNN's bf16
// GEMM runs on AMX (amx_bf16_gemm); panel for bf16 x at that level from M = kPanelMinM where it does not;
// else direct. At that level the
// direct path of bf16 x runs the avx512 fp32-FMA kernels where oneDNN has AMX (faster than vdpbf16ps at
// M = 1..16 on that Xeon) and below M = kDpbf16MinM, else the vdpbf16ps ones (QLOWER_CPU_WOQ_ISA=avx512_bf16
// forces them).
// Timings against the other CPU lowerings: lowerings/devices/cpu.py (WOQ_GEMM_MAX_M).
// ISA: AVX512-BF16 vdpbf16ps for bf16 x, else AVX512 or AVX2 fp32 FMA, else a scalar loop; chosen at run time
// (`__builtin_cpu_supports`), each compiled under `#pragma GCC target` so one library serves every x86-64 CPU.
// `QLOWER_CPU_WOQ_ISA=scalar|avx2|avx512|avx512_bf16` forces a path (an error where the CPU lacks it); a
// forced level below avx512_bf16 keeps auto on the direct path. The chunked path uses the level's conversion
// and epilogue code.
// The ISA-generic part (the QLOWER_WOQ_GEMM_BODY section at the end) is included once per ISA namespace.
//
// Built twice: into libqlower_ops.so (lowerings/aoti/build.py; the schema comes from the Python registration in
// lowerings/kernels/custom_ops.py), and, with QLOWER_IN_PROCESS defined, into libqlower_native.so under the
// private namespace `qlower_native`, which qlower's Python op calls (lowerings/kernels/native.py).
// Tests: tests/lowerings/kernels/test_cpu_woq_gemm.py.
#ifndef QLOWER_WOQ_GEMM_BODY

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__)
#define QLOWER_WOQ_X86 1
#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace qlower::woq {

enum class DType : int { F32, BF16, F16 };

inline int64_t elem_size(DType dt) {
  return dt == DType::F32 ? 4 : 2;
}

// One call's operands. x rows have unit inner stride; w is [N, K] with strides (sn, sk), sk == 1 (as F.linear
// stores it) or sn == 1 (a [K, N] weight seen transposed). scale and bias are fp32 [N] or null.
struct Problem {
  const void* x;
  int64_t lda;
  DType act;
  const int8_t* w;
  int64_t sn, sk;
  const float* scale;
  const float* bias;
  bool scale_on_weight;
  void* out;
  int64_t ldo;
  DType out_dt;
  int64_t M, N, K;
};

// A thread-local buffer of at least n elements.
template <class T>
T* grown(std::vector<T>& buf, size_t n) {
  if (buf.size() < n) {
    buf.resize(n);
  }
  return buf.data();
}

// A block of w: rows [n0, n0 + nb), K range [k0, k0 + kc).
struct Block {
  int64_t n0, nb, k0, kc;
};

// Prefetches row j of `next` (the block the next pack_b call converts) while pack_b converts its own row j:
// a block's rows are kc bytes each and K bytes apart, too short for the hardware prefetcher to ramp up on
// (without it, the buffered path of a 4096x4096 weight took 4 ms more than the in-register one).
inline void prefetch_row(const Problem& p, const Block& next, int64_t j) {
  if (j >= next.nb || p.sk != 1) {
    return;
  }
  const char* row = reinterpret_cast<const char*>(p.w + (next.n0 + j) * p.sn + next.k0);
  for (int64_t off = 0; off < next.kc; off += 64) {
    __builtin_prefetch(row + off, 0, 3);
  }
}

constexpr int kMaxMr = 8;  // the avx512_bf16 kernels; the others stop at 4 (Isa::kMr)
constexpr int64_t kDirectMaxM = 8;  // Kernels::direct_max_m of every level but avx512_bf16 (kDirectMaxMBf16)
constexpr int kMaxNr = 8;
constexpr int64_t kPanelKc = 2048;  // K per panel of the panel path: 2048 x 48 x 2 bytes = 192 KiB, in L2

// c[i * ldc + j] += sum_k a[i][k] * b[j][k] for an MR x NR tile over kc elements of K.
using TileFn = void (*)(const void* a, int64_t lda, const void* b, int64_t ldb, int64_t kc, float* c,
                        int64_t ldc);

// The kernels of one ISA path.
struct Kernels {
  const char* name;
  int mr_max;
  int nr_direct[kMaxMr + 1];  // widest tile per MR when B is read as int8 rows of w
  int nr_packed[kMaxMr + 1];  // ... when B is read from the converted buffer
  bool a_bf16;                // tiles read A as bf16 (x itself); else as fp32
  int64_t b_elem;             // bytes per converted B element (4: fp32, 2: bf16)
  int64_t direct_max_m;       // M up to which the int8 rows are converted in registers (run, below)
  TileFn direct[kMaxMr + 1][kMaxNr + 1];
  TileFn packed[kMaxMr + 1][kMaxNr + 1];
  // rows x kc activations from `src` (row stride lda) -> fp32 dst (row stride ldd)
  void (*pack_a)(const void* src, DType dt, int64_t lda, int64_t rows, int64_t kc, float* dst, int64_t ldd);
  // block b of w -> converted rows of dst (row stride ldd elements), scaled if the graph scales the weight;
  // prefetches block `next`
  void (*pack_b)(const Problem& p, const Block& b, const Block& next, void* dst, int64_t ldd);
  // fp32 sums c [mb x nb] -> out[m0 :, n0 :] with the roundings, scale and bias of the formula
  void (*epilogue)(const Problem& p, const float* c, int64_t ldc, int64_t m0, int64_t mb, int64_t n0,
                   int64_t nb);
  // chunked path: rows [n0, n0 + nb) of w, all of K -> rows of x's dtype in dst (row stride ldd elements),
  // exact for int8, round_act(fp32(w) * s[n]) where the graph scales the weight (as pack_b)
  void (*pack_rows)(const Problem& p, int64_t n0, int64_t nb, void* dst, int64_t ldd);
  // chunked path: c [mb x nb] in x's dtype (the matmul, already rounded) -> out[m0 :, n0 :], as epilogue
  void (*epilogue_act)(const Problem& p, const void* c, int64_t ldc, int64_t m0, int64_t mb, int64_t n0,
                       int64_t nb);
};

// ---- scalar conversions (round to nearest even, as c10 and the vector paths do)

inline float bf16_to_f(uint16_t bits) {
  return static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}

inline uint16_t f_to_bf16(float v) {
  return c10::BFloat16(v).x;
}

inline float f16_to_f(uint16_t bits) {
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

inline uint16_t f_to_f16(float v) {
  return c10::Half(v).x;
}

inline float round_scalar(DType dt, float v) {
  switch (dt) {
    case DType::BF16:
      return bf16_to_f(f_to_bf16(v));
    case DType::F16:
      return f16_to_f(f_to_f16(v));
    default:
      return v;
  }
}

inline float load_scalar(DType dt, const void* base, int64_t i) {
  switch (dt) {
    case DType::BF16:
      return bf16_to_f(static_cast<const uint16_t*>(base)[i]);
    case DType::F16:
      return f16_to_f(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

inline void store_scalar(DType dt, void* base, int64_t i, float v) {
  switch (dt) {
    case DType::BF16:
      static_cast<uint16_t*>(base)[i] = f_to_bf16(v);
      break;
    case DType::F16:
      static_cast<uint16_t*>(base)[i] = f_to_f16(v);
      break;
    default:
      static_cast<float*>(base)[i] = v;
  }
}

// A rounding the compiler must not fuse away: without it `y * s + b` may become one FMA (GCC contracts
// even intrinsics), while the formula rounds y * s before adding the bias.
inline float keep_scalar(float v) {
  volatile float t = v;
  return t;
}

// The formula's epilogue for one element (the vector paths compute the same, lane by lane).
inline float finish_scalar(const Problem& p, float v, int64_t n) {
  v = round_scalar(p.act, v);
  if (p.scale != nullptr && !p.scale_on_weight) {
    v = keep_scalar(v * p.scale[n]);
    if (p.bias != nullptr) {
      v = round_scalar(p.out_dt, v);
    }
  }
  if (p.bias != nullptr) {
    v = v + p.bias[n];
  }
  return v;
}

}  // namespace qlower::woq

#define QLOWER_WOQ_GEMM_BODY 1

// ---- scalar: the fallback, and the reference for the vector paths' logic (the same body with W = 1)
namespace qlower::woq::scalar {
struct Isa {
  static constexpr int W = 1;
  static constexpr int kMr = 4;
  static constexpr int kNrDirect[kMaxMr + 1] = {0, 4, 4, 4, 4};
  static constexpr int kNrPacked[kMaxMr + 1] = {0, 4, 4, 4, 4};
  using V = float;
  static V zero() { return 0.f; }
  static V set1(float v) { return v; }
  static V loadu(const float* p) { return *p; }
  static void storeu(float* p, V v) { *p = v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V keep(V v) { return keep_scalar(v); }
  static V load_i8(const int8_t* p) { return static_cast<float>(*p); }
  static V load_bf16(const uint16_t* p) { return bf16_to_f(*p); }
  static V load_f16(const uint16_t* p) { return f16_to_f(*p); }
  static V round_bf16(V v) { return round_scalar(DType::BF16, v); }
  static V round_f16(V v) { return round_scalar(DType::F16, v); }
  static void store_bf16(uint16_t* p, V v) { *p = f_to_bf16(v); }
  static void store_f16(uint16_t* p, V v) { *p = f_to_f16(v); }
  static float hsum(V v) { return v; }
};
#include __FILE__
}  // namespace qlower::woq::scalar

#ifdef QLOWER_WOQ_X86

// ---- AVX2 + FMA + F16C: 8 fp32 lanes, 16 registers (MR x NR accumulators + NR B vectors + 1 A vector)
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace qlower::woq::avx2 {
struct Isa {
  static constexpr int W = 8;
  static constexpr int kMr = 4;
  static constexpr int kNrDirect[kMaxMr + 1] = {0, 7, 5, 3, 3};
  static constexpr int kNrPacked[kMaxMr + 1] = {0, 7, 5, 3, 3};
  using V = __m256;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float v) { return _mm256_set1_ps(v); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V keep(V v) {
    asm volatile("" : "+x"(v));
    return v;
  }
  static V load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static V load_bf16(const uint16_t* p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // fp32 bits rounded to bf16 (nearest even) in the high half, low half zero; NaN -> 0x7FC0 as c10 does
  static __m256i bf16_bits32(V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
    r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC00000), nan);
  }
  static V round_bf16(V v) { return _mm256_castsi256_ps(bf16_bits32(v)); }
  static V round_f16(V v) { return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
  static void store_bf16(uint16_t* p, V v) {
    const __m256i r = _mm256_srli_epi32(bf16_bits32(v), 16);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store_f16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
};
#include __FILE__
}  // namespace qlower::woq::avx2
#pragma GCC pop_options

// ---- AVX512 (F, BW, VL, DQ) + FMA + F16C: 16 fp32 lanes, 32 registers
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
namespace qlower::woq::avx512 {
struct Isa {
  static constexpr int W = 16;
  static constexpr int kMr = 4;
  static constexpr int kNrDirect[kMaxMr + 1] = {0, 8, 8, 7, 6};
  static constexpr int kNrPacked[kMaxMr + 1] = {0, 8, 8, 7, 6};
  using V = __m512;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float v) { return _mm512_set1_ps(v); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V keep(V v) {
    asm volatile("" : "+v"(v));
    return v;
  }
  static V load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static V load_bf16(const uint16_t* p) {
    const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
  }
  static V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512i bf16_bits32(V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
    r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC00000));
  }
  static V round_bf16(V v) { return _mm512_castsi512_ps(bf16_bits32(v)); }
  static V round_f16(V v) { return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
  static __m256i bf16_of(V v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits32(v), 16)); }
  static void store_bf16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_of(v));
  }
  static void store_f16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static float hsum(V v) { return _mm512_reduce_add_ps(v); }
};
#include __FILE__
}  // namespace qlower::woq::avx512
#pragma GCC pop_options

// ---- AVX512-BF16: bf16 x against bf16 B pairs with vdpbf16ps (int8 -> bf16 is exact); the rest is avx512's
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
namespace qlower::woq::avx512_bf16 {
using Isa = avx512::Isa;
using V = Isa::V;
constexpr int kStep = 32;  // bf16 elements per vdpbf16ps

inline __m512bh bf16x32_of_i8(const int8_t* p) {
  const V lo = Isa::load_i8(p);
  const V hi = Isa::load_i8(p + 16);
  return _mm512_cvtne2ps_pbh(hi, lo);  // elements 0..15 from lo, 16..31 from hi; exact for int8 values
}

inline __m512bh load_b32(const int8_t* p) {
  return bf16x32_of_i8(p);
}

inline __m512bh load_b32(const uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(p);
}

inline float scalar_b(const int8_t* p) {
  return static_cast<float>(*p);
}

inline float scalar_b(const uint16_t* p) {
  return bf16_to_f(*p);
}

template <int MR, int NR, class BT>
void tile(const void* a_, int64_t lda, const void* b_, int64_t ldb, int64_t kc, float* c, int64_t ldc) {
  const uint16_t* a = static_cast<const uint16_t*>(a_);
  const BT* b = static_cast<const BT*>(b_);
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      acc[i][j] = _mm512_setzero_ps();
    }
  }
  const int64_t kv = kc / kStep * kStep;
  for (int64_t k = 0; k < kv; k += kStep) {
    __m512bh bv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      bv[j] = load_b32(b + j * ldb + k);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + i * lda + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = _mm512_reduce_add_ps(acc[i][j]);
      for (int64_t k = kv; k < kc; ++k) {
        s += bf16_to_f(a[i * lda + k]) * scalar_b(b + j * ldb + k);
      }
      c[i * ldc + j] += s;
    }
  }
}

// w block -> bf16 rows: exact for int8; the graph's scaled weight is rounded to bf16 as the graph rounds it.
void pack_b(const Problem& p, const Block& blk, const Block& next, void* dst_, int64_t ldd) {
  const int64_t n0 = blk.n0, nb = blk.nb, k0 = blk.k0, kc = blk.kc;
  uint16_t* dst = static_cast<uint16_t*>(dst_);
  const bool scaled = p.scale_on_weight;
  if (p.sk == 1) {
    const int64_t kv = kc / Isa::W * Isa::W;
    for (int64_t j = 0; j < nb; ++j) {
      prefetch_row(p, next, j);
      const int8_t* src = p.w + (n0 + j) * p.sn + k0;
      uint16_t* d = dst + j * ldd;
      const float s = scaled ? p.scale[n0 + j] : 1.f;
      const V sv = Isa::set1(s);
      for (int64_t k = 0; k < kv; k += Isa::W) {
        V v = Isa::load_i8(src + k);
        if (scaled) {
          v = Isa::round_bf16(Isa::mul(v, sv));
        }
        Isa::store_bf16(d + k, v);
      }
      for (int64_t k = kv; k < kc; ++k) {
        d[k] = f_to_bf16(scaled ? static_cast<float>(src[k]) * s : static_cast<float>(src[k]));
      }
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const int8_t* src = p.w + (k0 + k) * p.sk + n0 * p.sn;
    for (int64_t j = 0; j < nb; ++j) {
      const float v = static_cast<float>(src[j * p.sn]);
      dst[j * ldd + k] = f_to_bf16(scaled ? v * p.scale[n0 + j] : v);
    }
  }
}

// ---- the panel path (large M): the weight converted once per panel into VNNI pairs, rows broadcast
// An outer-product micro-kernel, as BLAS GEMMs are built: a panel of kPanelN output columns by kc of K is
// converted from int8 once and laid out as vdpbf16ps's B operand (slot (kp, n) holds the bf16 pair
// w'[n, 2kp], w'[n, 2kp + 1]); every MR rows of x then stream through it, each 32-bit pair of a row
// broadcast against kPanelN / 16 panel vectors, with MR x kPanelN / 16 accumulators in registers and no
// horizontal sums. The conversion is paid once per panel instead of once per MR rows (the direct kernel's
// cost at large M), and x needs no packing: its rows already hold K pairs contiguously.
constexpr int kPanelVecs = 3;                  // accumulator vectors per row: 48 output columns
constexpr int64_t kPanelN = 16 * kPanelVecs;  // output columns per panel
constexpr int kPanelMr = 8;                    // rows per micro-kernel: 24 accumulators + 3 B + 1 A of 32 zmm
constexpr int64_t kPanelMc = 512;              // x rows per work unit (the panel is converted once per unit)

// The transpose of a 16 x 16 matrix of 32-bit elements held as 16 rows: swaps of off-diagonal blocks of 8, 4,
// 2 and 1 (permutex2var picks each lane from either row of a pair). Unrolled, so the rows stay in registers.
template <int B>
inline __m512i swap_index(bool upper) {
  alignas(64) int32_t idx[16];
  for (int c = 0; c < 16; ++c) {
    // row i: its own columns without bit B, row i + B's below them; row i + B: row i's with bit B, its own
    idx[c] = upper ? ((c & B) ? 16 + c : c + B) : ((c & B) ? 16 + c - B : c);
  }
  return _mm512_load_si512(idx);
}

template <int B>
inline void transpose_stage(__m512i (&r)[16]) {
  static const __m512i lo = swap_index<B>(false), hi = swap_index<B>(true);
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if ((i & B) == 0) {
      const __m512i a = r[i], c = r[i + B];
      r[i] = _mm512_permutex2var_epi32(a, lo, c);
      r[i + B] = _mm512_permutex2var_epi32(a, hi, c);
    }
  }
}

inline void transpose16(__m512i (&r)[16]) {
  transpose_stage<8>(r);
  transpose_stage<4>(r);
  transpose_stage<2>(r);
  transpose_stage<1>(r);
}

// 32 K elements of weight row n from k: bf16 pairs (exact for int8; the graph's scaled weight rounded to bf16).
inline __m512i pairs_of_row(const Problem& p, int64_t n, int64_t k) {
  const int8_t* src = p.w + n * p.sn + k;
  V lo = Isa::load_i8(src), hi = Isa::load_i8(src + 16);
  if (p.scale_on_weight) {
    const V sv = Isa::set1(p.scale[n]);
    lo = Isa::round_bf16(Isa::mul(lo, sv));
    hi = Isa::round_bf16(Isa::mul(hi, sv));
  }
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

inline uint32_t pair_scalar(const Problem& p, int64_t n, int64_t k) {
  const float s = p.scale_on_weight ? p.scale[n] : 1.f;
  const int8_t* src = p.w + n * p.sn + k;
  const float a = static_cast<float>(src[0]), b = static_cast<float>(src[1]);
  const uint32_t lo = f_to_bf16(p.scale_on_weight ? a * s : a), hi = f_to_bf16(p.scale_on_weight ? b * s : b);
  return lo | (hi << 16);
}

// Panel of columns [n0, n0 + nb) (nb <= kPanelN; the rest zero) and K [k0, k0 + kc), kc even, into dst
// [kc / 2][kPanelN] pairs.
void pack_panel(const Problem& p, int64_t n0, int64_t nb, int64_t k0, int64_t kc, uint32_t* dst) {
  const int64_t kv = kc / 32 * 32;
  for (int v = 0; v < kPanelVecs; ++v) {
    const int64_t c0 = v * 16, rows = std::clamp<int64_t>(nb - c0, 0, 16);
    for (int64_t k = 0; k < kv; k += 32) {
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        r[i] = i < rows ? pairs_of_row(p, n0 + c0 + i, k0 + k) : _mm512_setzero_si512();
      }
      transpose16(r);  // r[q]: pair k / 2 + q of the 16 columns
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q) {
        _mm512_storeu_si512(dst + (k / 2 + q) * kPanelN + c0, r[q]);
      }
    }
    for (int64_t k = kv; k < kc; k += 2) {
      for (int64_t i = 0; i < 16; ++i) {
        dst[(k / 2) * kPanelN + c0 + i] = i < rows ? pair_scalar(p, n0 + c0 + i, k0 + k) : 0u;
      }
    }
  }
}

// c[i][0 : kPanelN] (+)= x rows a[i] (kc bf16, even) times the panel, for MR rows.
template <int MR>
void panel_tile(const uint16_t* a, int64_t lda, const uint32_t* b, int64_t kc, float* c, int64_t ldc,
                bool accumulate) {
  __m512 acc[MR][kPanelVecs];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < kPanelVecs; ++j) {
      acc[i][j] = accumulate ? _mm512_loadu_ps(c + i * ldc + j * 16) : _mm512_setzero_ps();
    }
  }
  for (int64_t kp = 0; kp < kc / 2; ++kp) {
    __m512bh bv[kPanelVecs];
    for (int j = 0; j < kPanelVecs; ++j) {
      bv[j] = (__m512bh)_mm512_loadu_si512(b + kp * kPanelN + j * 16);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      int32_t pair;
      std::memcpy(&pair, a + i * lda + 2 * kp, sizeof pair);
      const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < kPanelVecs; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < kPanelVecs; ++j) {
      _mm512_storeu_ps(c + i * ldc + j * 16, acc[i][j]);
    }
  }
}

using PanelTileFn = void (*)(const uint16_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, bool);
constexpr PanelTileFn kPanelTiles[kPanelMr + 1] = {nullptr,        &panel_tile<1>, &panel_tile<2>,
                                                   &panel_tile<3>, &panel_tile<4>, &panel_tile<5>,
                                                   &panel_tile<6>, &panel_tile<7>, &panel_tile<8>};

// bf16 x, a [N, K] weight (sk == 1), K even: threads over units of kPanelMc rows x kPanelN columns; each unit
// converts its panels (one per kPanelKc of K) and runs every row block through each, then the epilogue.
void run_panel(const Problem& p) {
  const int64_t m_blocks = (p.M + kPanelMc - 1) / kPanelMc;
  const int64_t n_blocks = (p.N + kPanelN - 1) / kPanelN;
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  at::parallel_for(0, m_blocks * n_blocks, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> c_buf;
    thread_local std::vector<uint32_t> b_buf;
    float* c = grown(c_buf, static_cast<size_t>(std::min(kPanelMc, p.M) * kPanelN));
    uint32_t* panel = grown(b_buf, static_cast<size_t>(kPanelKc / 2 * kPanelN));
    for (int64_t u = lo; u < hi; ++u) {
      // Units run N-major within a row block: consecutive units of one thread share x's rows in cache.
      const int64_t m0 = (u / n_blocks) * kPanelMc, mb = std::min(kPanelMc, p.M - m0);
      const int64_t n0 = (u % n_blocks) * kPanelN, nb = std::min(kPanelN, p.N - n0);
      for (int64_t k0 = 0; k0 < p.K; k0 += kPanelKc) {
        const int64_t kc = std::min(kPanelKc, p.K - k0);
        pack_panel(p, n0, nb, k0, kc, panel);
        for (int64_t i = 0; i < mb; i += kPanelMr) {
          const int mr = static_cast<int>(std::min<int64_t>(kPanelMr, mb - i));
          kPanelTiles[mr](x + (m0 + i) * p.lda + k0, p.lda, panel, kc, c + i * kPanelN, kPanelN, k0 > 0);
        }
      }
      avx512::epilogue(p, c, kPanelN, m0, mb, n0, nb);
    }
  });
}

template <class BT, int MR, int NR>
void fill(TileFn (&row)[kMaxNr + 1]) {
  row[NR] = &tile<MR, NR, BT>;
  if constexpr (NR > 1) {
    fill<BT, MR, NR - 1>(row);
  }
}

// In-register conversion at every M, eight rows per tile: each B vector (five instructions to convert from
// int8) serves eight vdpbf16ps instead of four, and the unit's int8 rows stay in L2 between passes. On an
// AVX512-BF16 EPYC without AMX (2 threads; BENCHMARKS.md, "AMD EPYC with AVX512-BF16") this ran M = 16-128 at
// 0.93-1.49x of bf16 F.linear, where four-row tiles ran 0.74-1.22x in registers (to M = 32) and 0.73-0.79x on
// the converted buffer above, and ties or beats the chunked path at M = 256-1024 (0.88-0.97x against
// 0.78-0.96x). Accumulators MR x NR, NR B vectors, one A and two conversion temporaries fit the 32 zmm registers.
constexpr int64_t kDirectMaxMBf16 = int64_t{1} << 40;
constexpr int kMrBf16 = 8;
constexpr int kNrDirect[kMaxMr + 1] = {0, 8, 8, 6, 5, 4, 4, 3, 3};  // int8 -> bf16 in registers takes two more
constexpr int kNrPacked[kMaxMr + 1] = {0, 8, 8, 7, 6, 5, 4, 3, 3};

Kernels make_kernels() {
  Kernels k{};
  k.name = "avx512_bf16";
  k.mr_max = kMrBf16;
  for (int mr = 0; mr <= kMaxMr; ++mr) {
    k.nr_direct[mr] = kNrDirect[mr];
    k.nr_packed[mr] = kNrPacked[mr];
  }
  k.a_bf16 = true;
  k.b_elem = 2;
  k.direct_max_m = kDirectMaxMBf16;
  fill<int8_t, 1, kNrDirect[1]>(k.direct[1]);
  fill<int8_t, 2, kNrDirect[2]>(k.direct[2]);
  fill<int8_t, 3, kNrDirect[3]>(k.direct[3]);
  fill<int8_t, 4, kNrDirect[4]>(k.direct[4]);
  fill<uint16_t, 1, kNrPacked[1]>(k.packed[1]);
  fill<uint16_t, 2, kNrPacked[2]>(k.packed[2]);
  fill<uint16_t, 3, kNrPacked[3]>(k.packed[3]);
  fill<uint16_t, 4, kNrPacked[4]>(k.packed[4]);
  fill<int8_t, 5, kNrDirect[5]>(k.direct[5]);
  fill<int8_t, 6, kNrDirect[6]>(k.direct[6]);
  fill<int8_t, 7, kNrDirect[7]>(k.direct[7]);
  fill<int8_t, 8, kNrDirect[8]>(k.direct[8]);
  fill<uint16_t, 5, kNrPacked[5]>(k.packed[5]);
  fill<uint16_t, 6, kNrPacked[6]>(k.packed[6]);
  fill<uint16_t, 7, kNrPacked[7]>(k.packed[7]);
  fill<uint16_t, 8, kNrPacked[8]>(k.packed[8]);
  k.pack_a = nullptr;  // A is x itself
  k.pack_b = &pack_b;
  k.epilogue = &avx512::epilogue;
  k.pack_rows = &avx512::pack_rows;
  k.epilogue_act = &avx512::epilogue_act;
  return k;
}
}  // namespace qlower::woq::avx512_bf16
#pragma GCC pop_options

// ---- AMX-BF16 (Sapphire Rapids on): the swapped product C^T = W' X^T on tile registers, for bf16 x.
// Why swapped: the weight's rows run along K, which is the A operand's layout (16 rows of 64 bytes of K), so
// each int8 weight row converts to bf16 in registers (exact) and is stored as it is, with no transpose; X^T is
// the B operand (VNNI: row r holds, for 16 columns m, the bf16 pair at K = 2r, 2r + 1), transposed once per
// call (M x K elements, against N x K converted weight elements). A tile step covers 64 bytes (32 bf16) of K.
// Tiles: tmm0..3 C [16 n x 16 m] fp32, tmm4-5 A (weight rows n0..n0+15, n0+16..n0+31), tmm6-7 B (X^T columns
// m0..m0+15, m0+16..m0+31).
// Work: threads over blocks of 32 weight rows. M <= kSmallM: one block of M whose C stays in tiles over all
// of K, the weight converted one K step at a time a few steps ahead of the tiles (small_m). Larger M: the
// weight converted kKcSteps steps at a time into an L1 buffer, chunks of kMChunk columns of X^T, each block
// converted once per chunk, C tiles saved between K blocks (large_m). The result tiles are transposed back and
// finished by the avx512 epilogue (roundings, scale, bias). tdpbf16ps treats bf16 denormal inputs as zero, as
// oneDNN's bf16 GEMM does on the same unit (the chunked path's GEMM on these CPUs). The same tiles on AMX-INT8 (tdpbssd on the weight's own bytes) for dynamic int8 measured at
// parity with oneDNN's `_int_mm` (0.8-1.18x at M = 1..64, 2 threads; 0.6-1.0x at M = 128..1024), so that op is
// not built: BENCHMARKS.md, "CPU, woq_int8: qlower::woq_int8_gemm".
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")
namespace qlower::woq::amx {
using Isa = avx512::Isa;
constexpr int64_t kStepBytes = 64;             // K bytes of one tile row
constexpr int64_t kTileBytes = 16 * kStepBytes;
constexpr int64_t kRows = 32;                  // weight rows per block (two A tiles)
constexpr int64_t kCols = 32;                  // X^T columns per block (two B tiles)
constexpr int64_t kKcSteps = 8;                // K steps per packed block (32 rows x 512 bytes: 16 KiB)
constexpr int64_t kKcBytes = kKcSteps * kStepBytes;
constexpr int64_t kSmallM = 32;
constexpr int64_t kCTile = 16 * 16;            // elements of one C tile
constexpr int64_t kMChunk = 128;               // X^T columns per chunk at M > kSmallM (in L2 at K = 4096)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tile state is per thread: every thread that runs tiles loads the configuration first. The configuration
// lives in a static object: GCC does not see ldtilecfg read its operand and drops stores to a local one.
void load_config() {
  static const TileConfig cfg = [] {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.rows[t] = 16;
      c.colsb[t] = 64;
    }
    return c;
  }();
  _tile_loadconfig(&cfg);
}

// r[i] <- column i of the 16 x 16 matrix of 32-bit elements whose rows are r[0..15].
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int h = 0; h < 16; h += 8) {
    for (int i = 0; i < 4; ++i) {
      t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// X^T as B tiles, packed once per call: tile (mt, ks) at (mt * ksteps + ks) * kTileBytes; its row r holds the
// 4 bytes at K byte 64 ks + 4r of x's rows 16 mt + m, m = 0..15 (zeros beyond M and K): per tile, a transpose
// of 16 x 16 four-byte groups.
struct PackedX {
  uint8_t* tiles;   // the calling thread's buffer, reused across calls (a fresh multi-MiB buffer per call
                    // would be a fresh mmap whose pages fault in on every call)
  int64_t ksteps;   // tile steps over K
  int64_t bstride;  // bytes from one 16-column tile of X^T to the next
  const uint8_t* at(int64_t m0, int64_t step) const {
    return tiles + (m0 / 16) * bstride + step * kTileBytes;
  }
};

// x: M rows of K bf16 elements, row stride lda elements.
PackedX pack_x(const void* xp, int64_t lda, int64_t M, int64_t K) {
  constexpr int64_t es = 2;  // bf16
  PackedX px;
  const int64_t kbytes = K * es;
  px.ksteps = (kbytes + kStepBytes - 1) / kStepBytes;
  px.bstride = px.ksteps * kTileBytes;
  const int64_t mtiles = (M + 15) / 16;
  thread_local std::vector<uint8_t> buf;
  px.tiles = grown(buf, static_cast<size_t>(mtiles * px.bstride));
  const char* x = static_cast<const char*>(xp);
  at::parallel_for(0, mtiles * px.ksteps, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t mt = u / px.ksteps, k0 = (u % px.ksteps) * kStepBytes;
      const int64_t kn = std::min(kStepBytes, kbytes - k0);
      const __mmask64 kmask = kn >= 64 ? ~__mmask64{0} : (__mmask64{1} << kn) - 1;
      __m512i r[16];
      for (int m = 0; m < 16; ++m) {
        const int64_t row = mt * 16 + m;
        r[m] = row < M ? _mm512_maskz_loadu_epi8(kmask, x + row * lda * es + k0) : _mm512_setzero_si512();
      }
      transpose16(r);
      uint8_t* dst = px.tiles + u * kTileBytes;
      for (int i = 0; i < 16; ++i) {
        _mm512_storeu_si512(dst + i * kStepBytes, r[i]);
      }
    }
  });
  return px;
}

// Prefetches the `bytes` after `row`'s packed range (the next block's), within the `remaining` bytes of the row.
inline void prefetch_next(const int8_t* row, int64_t bytes, int64_t remaining) {
  for (int64_t off = bytes; off < 2 * bytes && off < remaining; off += 64) {
    __builtin_prefetch(row + off, 0, 3);
  }
}

// bf16 x (woq_int8_gemm): weight rows [n0, n0 + kRows) x K steps [s0, s0 + steps) -> bf16 rows of dst (row
// stride ld bytes); zeros beyond N and K. Exact int8 values, or round_bf16(fp32(w) * s[n]) where the graph
// scales the weight (as avx512_bf16::pack_b).
struct Bf16Product {
  const Problem& p;
  const Kernels& kk;
  int64_t M, N;

  void pack(int64_t n0, int64_t s0, int64_t steps, uint8_t* dst, int64_t ld) const {
    constexpr int64_t kElems = kStepBytes / 2;
    const int64_t k0 = s0 * kElems, kc = steps * kElems;
    const int64_t kn = std::max<int64_t>(0, std::min(kc, p.K - k0));
    const int64_t kv = kn / kElems * kElems;
    for (int64_t j = 0; j < kRows; ++j) {
      uint16_t* d = reinterpret_cast<uint16_t*>(dst + j * ld);
      const int64_t n = n0 + j;
      int64_t k = 0;
      if (n < p.N) {
        const int8_t* src = p.w + n * p.sn + k0;
        prefetch_next(src, kc, p.K - k0);
        if (!p.scale_on_weight) {
          for (; k < kv; k += kElems) {
            _mm512_storeu_si512(d + k, (__m512i)avx512_bf16::bf16x32_of_i8(src + k));
          }
          for (; k < kn; ++k) {
            d[k] = f_to_bf16(static_cast<float>(src[k]));
          }
        } else {
          const float s = p.scale[n];
          const Isa::V sv = Isa::set1(s);
          for (; k + Isa::W <= kn; k += Isa::W) {
            Isa::store_bf16(d + k, Isa::mul(Isa::load_i8(src + k), sv));
          }
          for (; k < kn; ++k) {
            d[k] = f_to_bf16(static_cast<float>(src[k]) * s);
          }
        }
      }
      std::fill(d + k, d + kc, uint16_t{0});
    }
  }

  // Saved fp32 C tiles -> [kCols m x kRows n] -> the epilogue into out[m0 : m0 + mb, n0 : n0 + nb].
  void finish(const void* tiles, float* c, int64_t m0, int64_t mb, int64_t n0, int64_t nb) const;
};

inline void zero_c() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// C += A (rows a, a + 16 lda; lda in bytes) x B (tiles b, b + bstride) over `steps` K steps; B2: the second B
// tile is used (more than 16 columns of X^T).
template <bool B2>
inline void accumulate(const uint8_t* a, int64_t lda, const uint8_t* b, int64_t bstride, int64_t steps) {
  for (int64_t ks = 0; ks < steps; ++ks) {
    _tile_loadd(4, a + ks * kStepBytes, lda);
    _tile_loadd(5, a + 16 * lda + ks * kStepBytes, lda);
    _tile_loadd(6, b + ks * kTileBytes, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (B2) {
      _tile_loadd(7, b + bstride + ks * kTileBytes, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
}

inline void accumulate_any(int64_t mb, const uint8_t* a, int64_t lda, const PackedX& x, const uint8_t* b,
                           int64_t steps) {
  if (mb > 16) {
    accumulate<true>(a, lda, b, x.bstride, steps);
  } else {
    accumulate<false>(a, lda, b, x.bstride, steps);
  }
}

// C tiles as they are (tile q: weight rows 16 (q % 2), X^T columns 16 (q / 2); 1 KiB each), the accumulator of
// one block pair between K blocks. mb: the X^T block's columns (the second column tile exists above 16).
inline void save_c(int64_t mb, void* t_) {
  char* t = static_cast<char*>(t_);
  _tile_stored(0, t, 64);
  _tile_stored(1, t + 4 * kCTile, 64);
  if (mb > 16) {
    _tile_stored(2, t + 8 * kCTile, 64);
    _tile_stored(3, t + 12 * kCTile, 64);
  }
}

inline void restore_c(int64_t mb, const void* t_) {
  const char* t = static_cast<const char*>(t_);
  _tile_loadd(0, t, 64);
  _tile_loadd(1, t + 4 * kCTile, 64);
  if (mb > 16) {
    _tile_loadd(2, t + 8 * kCTile, 64);
    _tile_loadd(3, t + 12 * kCTile, 64);
  }
}

// The saved tiles of an X^T block of mb columns, transposed: tile q's 16 rows of m, each 16 values of n, go to
// dst + (16 (q / 2) + i) * ld + 16 (q % 2) (32-bit elements), i < rows of that tile still within mb.
inline void transpose_tiles(const void* t_, int64_t mb, void* dst_, int64_t ld, int64_t nb) {
  const uint32_t* t = static_cast<const uint32_t*>(t_);
  uint32_t* dst = static_cast<uint32_t*>(dst_);
  for (int q = 0; q < (mb > 16 ? 4 : 2); ++q) {
    const int64_t cols = std::min<int64_t>(16, nb - 16 * (q % 2));
    if (cols <= 0) {
      continue;
    }
    __m512i r[16];
    for (int i = 0; i < 16; ++i) {
      r[i] = _mm512_loadu_si512(t + q * kCTile + i * 16);
    }
    transpose16(r);
    const __mmask16 keep = cols >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1);
    const int64_t rows = std::min<int64_t>(16, mb - 16 * (q / 2));
    for (int64_t i = 0; i < rows; ++i) {
      _mm512_mask_storeu_epi32(dst + (16 * (q / 2) + i) * ld + 16 * (q % 2), keep, r[i]);
    }
  }
}

void Bf16Product::finish(const void* tiles, float* c, int64_t m0, int64_t mb, int64_t n0, int64_t nb) const {
  transpose_tiles(tiles, mb, c, kRows, kRows);
  kk.epilogue(p, c, kRows, m0, mb, n0, nb);
}

// The small-M path converts the weight one K step (32 rows x 32 elements) at a time into a ring of kRing
// slots, kAhead steps ahead of the tile step that reads it, so the conversion (AVX-512) runs while the tiles
// multiply: converting 8 steps into a buffer, then multiplying them, left each unit idle while the other ran
// (M = 8-32 on the H200 host's Xeon: 1.10-1.94x bf16 before, 1.23-2.32x with the ring; BENCHMARKS.md, "CPU,
// woq_int8: qlower::woq_int8_gemm"). A slot is read kAhead steps after its stores, which have left the store
// buffer by then. Blocks the ring does not take (a weight scaled in the graph, K not a multiple of 32, a
// partial last block of rows) convert kKcSteps steps at a time through `pack`.
constexpr int64_t kRing = 4;   // step slots of kRows rows x 64 bytes
constexpr int64_t kAhead = 2;  // steps converted ahead of the tiles
constexpr int64_t kSlotBytes = kRows * kStepBytes;

// K step ks (32 elements) of weight rows [n0, n0 + kRows), all within N and K: exact int8 -> bf16 into slot.
inline void convert_step(const Problem& p, int64_t n0, int64_t ks, uint8_t* slot) {
  const int8_t* src = p.w + n0 * p.sn + ks * 32;
#pragma GCC unroll 4
  for (int64_t j = 0; j < kRows; ++j) {
    const int8_t* r = src + j * p.sn;
    if ((ks & 1) == 0) {  // one line per row every two steps, 16 steps ahead
      _mm_prefetch(reinterpret_cast<const char*>(r) + 512, _MM_HINT_T0);
    }
    _mm512_store_si512(slot + j * kStepBytes, (__m512i)avx512_bf16::bf16x32_of_i8(r));
  }
}

bool ring_fits(const Problem& p, int64_t n0) {
  return !p.scale_on_weight && p.K % 32 == 0 && n0 + kRows <= p.N;
}

// C += the block's rows x X^T over all of K through the ring (ring: kRing slots, 64-byte aligned).
template <bool B2>
void accumulate_ring(const Problem& p, const PackedX& x, int64_t n0, uint8_t* ring) {
  const int64_t ksteps = x.ksteps;
  for (int64_t s = 0; s < std::min(kAhead, ksteps); ++s) {
    convert_step(p, n0, s, ring + (s % kRing) * kSlotBytes);
  }
  for (int64_t ks = 0; ks < ksteps; ++ks) {
    const uint8_t* a = ring + (ks % kRing) * kSlotBytes;
    const uint8_t* b = x.at(0, ks);
    _tile_loadd(4, a, kStepBytes);
    _tile_loadd(5, a + 16 * kStepBytes, kStepBytes);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 5, 6);
    if constexpr (B2) {
      _tile_loadd(7, b + x.bstride, 64);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
    if (ks + kAhead < ksteps) {
      convert_step(p, n0, ks + kAhead, ring + ((ks + kAhead) % kRing) * kSlotBytes);
    }
  }
}

// M <= kSmallM: one X^T block; its C stays in tiles over all of K.
void small_m(const Bf16Product& g, const PackedX& x, int64_t lo, int64_t hi) {
  thread_local std::vector<uint8_t> a_buf, ring_buf;
  thread_local std::vector<float> t_buf, c_buf;
  uint8_t* a = grown(a_buf, static_cast<size_t>(kRows * kKcBytes));
  uint8_t* ring_raw = grown(ring_buf, static_cast<size_t>(kRing * kSlotBytes + 64));
  uint8_t* ring = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ring_raw) + 63) & ~uintptr_t{63});
  float* tiles = grown(t_buf, static_cast<size_t>(4 * kCTile));
  float* c = grown(c_buf, static_cast<size_t>(kCols * kRows));
  for (int64_t blk = lo; blk < hi; ++blk) {
    const int64_t n0 = blk * kRows;
    zero_c();
    if (ring_fits(g.p, n0)) {
      if (g.M > 16) {
        accumulate_ring<true>(g.p, x, n0, ring);
      } else {
        accumulate_ring<false>(g.p, x, n0, ring);
      }
    } else {
      for (int64_t s0 = 0; s0 < x.ksteps; s0 += kKcSteps) {
        const int64_t steps = std::min(kKcSteps, x.ksteps - s0);
        g.pack(n0, s0, steps, a, kKcBytes);
        accumulate_any(g.M, a, kKcBytes, x, x.at(0, s0), steps);
      }
    }
    save_c(g.M, tiles);
    g.finish(tiles, c, 0, g.M, n0, std::min(kRows, g.N - n0));
  }
}

// Larger M: chunks of kMChunk columns of X^T (in L2 while the thread's weight blocks pass by); each weight block
// converted kKcSteps steps at a time into an L1 buffer that every X^T block of the chunk reads, their C tiles
// saved and restored between K blocks.
void large_m(const Bf16Product& g, const PackedX& x, int64_t lo, int64_t hi) {
  thread_local std::vector<uint8_t> a_buf;
  thread_local std::vector<float> t_buf, c_buf;
  uint8_t* a = grown(a_buf, static_cast<size_t>(kRows * kKcBytes));
  float* tiles = grown(t_buf, static_cast<size_t>(kMChunk / kCols * 4 * kCTile));
  float* c = grown(c_buf, static_cast<size_t>(kCols * kRows));
  for (int64_t mc0 = 0; mc0 < g.M; mc0 += kMChunk) {
    const int64_t mc1 = std::min(g.M, mc0 + kMChunk);
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t n0 = blk * kRows;
      for (int64_t s0 = 0; s0 < x.ksteps; s0 += kKcSteps) {
        const int64_t steps = std::min(kKcSteps, x.ksteps - s0);
        g.pack(n0, s0, steps, a, kKcBytes);
        for (int64_t m0 = mc0; m0 < mc1; m0 += kCols) {
          const int64_t mb = std::min(kCols, mc1 - m0);
          float* t = tiles + (m0 - mc0) / kCols * 4 * kCTile;
          if (s0 == 0) {
            zero_c();
          } else {
            restore_c(mb, t);
          }
          accumulate_any(mb, a, kKcBytes, x, x.at(m0, s0), steps);
          save_c(mb, t);
        }
      }
      for (int64_t m0 = mc0; m0 < mc1; m0 += kCols) {
        g.finish(tiles + (m0 - mc0) / kCols * 4 * kCTile, c, m0, std::min(kCols, mc1 - m0), n0,
                 std::min(kRows, g.N - n0));
      }
    }
  }
}

void run_product(const Bf16Product& g, const PackedX& x) {
  at::parallel_for(0, (g.N + kRows - 1) / kRows, 1, [&](int64_t lo, int64_t hi) {
    load_config();
    if (g.M <= kSmallM) {
      small_m(g, x, lo, hi);
    } else {
      large_m(g, x, lo, hi);
    }
    _tile_release();
  });
}

// woq_int8_gemm's AMX path: bf16 x, a [N, K] weight (sk == 1).
void run(const Problem& p, const Kernels& kk) {
  run_product(Bf16Product{p, kk, p.M, p.N}, pack_x(p.x, p.lda, p.M, p.K));
}

}  // namespace qlower::woq::amx
#pragma GCC pop_options

#endif  // QLOWER_WOQ_X86

#undef QLOWER_WOQ_GEMM_BODY

namespace qlower::woq {

// ---- run-time ISA choice

enum class Level : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Bf16 = 3 };
constexpr const char* kLevelNames[] = {"scalar", "avx2", "avx512", "avx512_bf16"};

bool cpu_has(Level level) {
#ifdef QLOWER_WOQ_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  switch (level) {
    case Level::Scalar:
      return true;
    case Level::Avx2:
      return avx2;
    case Level::Avx512:
      return avx512;
    case Level::Avx512Bf16:
      return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return level == Level::Scalar;
#endif
}

bool amx_usable();

// The ISA levels this CPU runs, then "amx_bf16" where the AMX path can run (amx_usable).
std::string supported_isas() {
  std::string names;
  for (int i = 0; i <= static_cast<int>(Level::Avx512Bf16); ++i) {
    if (cpu_has(static_cast<Level>(i))) {
      names += (names.empty() ? "" : ",");
      names += kLevelNames[i];
    }
  }
  return amx_usable() ? names + ",amx_bf16" : names;
}

// The level this call runs at: QLOWER_CPU_WOQ_ISA if set (checked against the CPU), else the best one.
Level chosen_level() {
  const char* forced = std::getenv("QLOWER_CPU_WOQ_ISA");
  if (forced != nullptr && forced[0] != '\0') {
    for (int i = 0; i <= static_cast<int>(Level::Avx512Bf16); ++i) {
      if (std::strcmp(forced, kLevelNames[i]) == 0) {
        const Level level = static_cast<Level>(i);
        TORCH_CHECK(cpu_has(level), "qlower::woq_int8_gemm: QLOWER_CPU_WOQ_ISA=", forced,
                    " but this CPU supports only ", supported_isas());
        return level;
      }
    }
    TORCH_CHECK(false, "qlower::woq_int8_gemm: QLOWER_CPU_WOQ_ISA=", forced,
                " is not one of scalar, avx2, avx512, avx512_bf16");
  }
  static const Level best = [] {
    for (int i = static_cast<int>(Level::Avx512Bf16); i > 0; --i) {
      if (cpu_has(static_cast<Level>(i))) {
        return static_cast<Level>(i);
      }
    }
    return Level::Scalar;
  }();
  return best;
}

// Each table is built on first use only: building one runs code of its ISA (a CPU without AVX512 must never
// run avx512::make_kernels, whose stores may use zmm registers).
const Kernels& kernels_for(Level level, DType act) {
#ifdef QLOWER_WOQ_X86
  if (level == Level::Avx512Bf16 && act == DType::BF16) {  // vdpbf16ps only serves bf16 activations
    static const Kernels k = avx512_bf16::make_kernels();
    return k;
  }
  if (level == Level::Avx512 || level == Level::Avx512Bf16) {
    static const Kernels k = avx512::make_kernels("avx512");
    return k;
  }
  if (level == Level::Avx2) {
    static const Kernels k = avx2::make_kernels("avx2");
    return k;
  }
#endif
  (void)level;
  (void)act;
  static const Kernels k = scalar::make_kernels("scalar");
  return k;
}

// ---- the blocked driver (ISA-independent: it calls the chosen path's kernels)

constexpr int64_t kKc = 1024;  // K block of the buffered path
constexpr int64_t kNc = 64;    // N columns per work unit
constexpr int64_t kMc = 256;   // M rows per work unit
void run(const Problem& p, const Kernels& kk) {
  // M <= kk.direct_max_m: the int8 rows converted in registers, one pass over all of K per MR rows (the unit's
  // int8 rows, nb x K bytes, are still in L2 for the second); else K blocks whose converted B buffer serves
  // every M row of the unit.
  const bool direct = p.M <= kk.direct_max_m && p.sk == 1 && !p.scale_on_weight;
  const bool a_direct = kk.a_bf16 || p.act == DType::F32;
  const int64_t kc_max = direct ? std::max<int64_t>(p.K, 1) : std::min(kKc, std::max<int64_t>(p.K, 1));
  // Row strides of the thread-local buffers: a multiple of 4 KiB (K = 1024 fp32) would put every row of a
  // tile in the same L1 set; one cache line more keeps them apart.
  const int64_t ld_a = (kc_max + 15) / 16 * 16 + 16;
  const int64_t ld_b = (kc_max + 31) / 32 * 32 + 64 / kk.b_elem;
  const int64_t m_blocks = (p.M + kMc - 1) / kMc;
  const int64_t n_blocks = (p.N + kNc - 1) / kNc;
  const int64_t a_es = elem_size(p.act);
  at::parallel_for(0, m_blocks * n_blocks, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> c_buf, a_buf, b_buf;
    float* c = grown(c_buf, static_cast<size_t>(std::min(kMc, p.M) * kNc));
    float* a_pack = a_direct ? nullptr : grown(a_buf, static_cast<size_t>(kk.mr_max * ld_a));
    void* b_pack = direct ? nullptr : grown(b_buf, static_cast<size_t>((kNc * ld_b * kk.b_elem + 3) / 4));
    int64_t packed_row = -1, packed_k = -1;  // the A tile in a_pack (valid within this call)
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t m0 = (u / n_blocks) * kMc, mb = std::min(kMc, p.M - m0);
      const int64_t n0 = (u % n_blocks) * kNc, nb = std::min(kNc, p.N - n0);
      std::fill(c, c + mb * kNc, 0.f);
      for (int64_t k0 = 0; k0 < p.K; k0 += kc_max) {
        const int64_t kc = std::min(kc_max, p.K - k0);
        if (!direct) {
          Block next{0, 0, 0, 0};  // this unit's next K block, else the next unit's first
          if (k0 + kc < p.K) {
            next = {n0, nb, k0 + kc, std::min(kc_max, p.K - k0 - kc)};
          } else if (u + 1 < hi) {
            const int64_t n1 = ((u + 1) % n_blocks) * kNc;
            next = {n1, std::min(kNc, p.N - n1), 0, std::min(kc_max, p.K)};
          }
          kk.pack_b(p, Block{n0, nb, k0, kc}, next, b_pack, ld_b);
        }
        for (int64_t i = 0; i < mb;) {
          const int mr = static_cast<int>(std::min<int64_t>(kk.mr_max, mb - i));
          const char* a_src = static_cast<const char*>(p.x) + ((m0 + i) * p.lda + k0) * a_es;
          const void* a = a_src;
          int64_t lda = p.lda;
          if (!a_direct) {
            if (packed_row != m0 + i || packed_k != k0) {
              kk.pack_a(a_src, p.act, p.lda, mr, kc, a_pack, ld_a);
              packed_row = m0 + i;
              packed_k = k0;
            }
            a = a_pack;
            lda = ld_a;
          }
          const int nr_max = direct ? kk.nr_direct[mr] : kk.nr_packed[mr];
          for (int64_t j = 0; j < nb;) {
            const int nr = static_cast<int>(std::min<int64_t>(nr_max, nb - j));
            float* cij = c + i * kNc + j;
            if (direct) {
              kk.direct[mr][nr](a, lda, p.w + (n0 + j) * p.sn + k0, p.sn, kc, cij, kNc);
            } else {
              const void* b = static_cast<const char*>(b_pack) + j * ld_b * kk.b_elem;
              kk.packed[mr][nr](a, lda, b, ld_b, kc, cij, kNc);
            }
            j += nr;
          }
          i += mr;
        }
      }
      kk.epilogue(p, c, kNc, m0, mb, n0, nb);
    }
  });
}

// ---- the chunked driver: qlower converts, ATen's GEMM multiplies

constexpr int64_t kChunkBytes = 512 << 10;     // converted rows of one chunk, in L2 while x's rows stream by
// From M = kChunkLargeM: wide chunks (8 MiB: 128 rows at K = 14336), which oneDNN's GEMM runs at its full rate
// (1 MiB chunks of 32 rows ran 14336->4096 at M = 512 at 0.5-0.6x of bf16, 8 MiB at 0.8x), x re-read fewer times.
constexpr int64_t kChunkBytesLargeM = 8 << 20;
constexpr int64_t kChunkLargeM = 256;
constexpr int64_t kChunkMinRows = 64;    // the fewest M rows of a block when M is split among threads
constexpr int64_t kChunkMaxRows = 1024;  // the most: bounds the [mb, nc] result buffer

void run_chunked(const Problem& p, const Kernels& kk, const at::TensorOptions& opts) {
  const int64_t es = elem_size(p.act);
  const int64_t budget = p.M >= kChunkLargeM ? kChunkBytesLargeM : kChunkBytes;
  const int64_t n16 = (p.N + 15) / 16 * 16;
  int64_t nc = std::clamp<int64_t>(budget / (std::max<int64_t>(p.K, 1) * es) / 16 * 16, 16, n16);
  const int64_t threads = std::max(1, at::get_num_threads());
  if ((p.N + nc - 1) / nc < threads) {  // narrower chunks (multiples of 16 columns) so every thread has one
    nc = std::min(nc, std::max<int64_t>(16, ((p.N + threads - 1) / threads + 15) / 16 * 16));
  }
  const int64_t n_chunks = (p.N + nc - 1) / nc;
  int64_t m_blocks = 1;  // still fewer chunks than threads: blocks of M rows too
  if (n_chunks < threads) {
    const int64_t most = std::max<int64_t>(1, p.M / kChunkMinRows);
    m_blocks = std::clamp<int64_t>((threads + n_chunks - 1) / n_chunks, 1, most);
  }
  m_blocks = std::max(m_blocks, (p.M + kChunkMaxRows - 1) / kChunkMaxRows);
  const int64_t mc = (p.M + m_blocks - 1) / m_blocks;
  m_blocks = (p.M + mc - 1) / mc;
  const int64_t K = p.K;
  const char* x = static_cast<const char*>(p.x);
  // Units run chunk-major: a thread's consecutive units of one chunk convert it once.
  at::parallel_for(0, n_chunks * m_blocks, 1, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> b_buf, c_buf;  // float-typed for alignment; holds x's dtype
    void* b = grown(b_buf, static_cast<size_t>((std::max<int64_t>(nc * K, 1) * es + 3) / 4));
    void* c = grown(c_buf, static_cast<size_t>((mc * nc * es + 3) / 4));
    int64_t packed = -1;
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t chunk = u / m_blocks;
      const int64_t n0 = chunk * nc, nb = std::min(nc, p.N - n0);
      const int64_t m0 = (u % m_blocks) * mc, mb = std::min(mc, p.M - m0);
      if (chunk != packed) {
        kk.pack_rows(p, n0, nb, b, K);
        packed = chunk;
      }
      // Plain tensors over the buffers and x's rows (no autograd, no inference-mode state: this may run on a
      // worker thread, which has neither of the caller's thread-local modes).
      const at::Tensor a_t = at::from_blob(const_cast<char*>(x) + m0 * p.lda * es, {mb, K}, {p.lda, 1}, opts);
      const at::Tensor b_t = at::from_blob(b, {nb, K}, {K, 1}, opts);
      at::Tensor c_t = at::from_blob(c, {mb, nb}, {nb, 1}, opts);
      at::mm_out(c_t, a_t, b_t.t());
      kk.epilogue_act(p, c, nb, m0, mb, n0, nb);
    }
  });
}

// ---- the path of one call

enum class Path : int { Auto = 0, Direct = 1, Chunked = 2, Amx = 3, Panel = 4 };
constexpr const char* kPathNames[] = {"auto", "direct", "chunked", "amx", "panel"};

// auto takes the chunked path from this M on, for bf16 x where oneDNN's bf16 GEMM runs on AMX. Measured on an
// AMX Xeon (2 threads; BENCHMARKS.md, "CPU, woq_int8: qlower::woq_int8_gemm"): at M = 128 / 1024
// the chunked path was 0.63x / 0.94x of bf16 F.linear against the direct path's 0.20x / 0.17x (4096^2), at
// M = 16 the two tied (0.42-0.53x). With oneDNN capped at AVX512_CORE_BF16 (no AMX, as on an AVX512-BF16 EPYC)
// the chunked path lost to the direct one at M = 16 and 128 (0.76x vs 1.06x, 0.83x vs 0.92x of bf16 F.linear)
// and tied at 1024: there auto stays direct.
constexpr int64_t kChunkedMinM = 16;

// Where oneDNN's bf16 GEMM runs on AVX512-BF16 instead (an EPYC; a Xeon with ONEDNN_MAX_CPU_ISA capped below
// AMX), auto runs the vdpbf16ps kernels from M = kDpbf16MinM, the fp32-FMA ones below, and no chunks. Measured
// on an AVX512-BF16 EPYC (2 threads; BENCHMARKS.md, "AMD EPYC with AVX512-BF16"): the fp32-FMA kernels ran
// 0.43-0.62x of bf16 F.linear from M = 16; the two tie at M = 4 and FMA leads at M = 1-2 (0.356 vs 0.528 ms
// at M = 1, 4096^2).
constexpr int64_t kDpbf16MinM = 4;

// From this M on, where oneDNN's bf16 GEMM runs on AVX512-BF16 (no AMX), auto takes the panel path for bf16 x
// (avx512_bf16::run_panel): on an AVX512-BF16 EPYC (2 threads; BENCHMARKS.md, "AMD EPYC with AVX512-BF16") the
// panels ran 1.01-1.03x of bf16 F.linear at M = 64-96 against the in-register tiles' 0.92-1.05x, and the tiles
// led at M = 32 (1.08-1.17x against 1.05-1.07x).
constexpr int64_t kPanelMinM = 64;
// ... and from this M where one panel holds all of K (K <= kPanelKc): with few K steps per output the
// in-register tiles convert each weight vector once per 8 rows over too little work. Small weights on the same
// EPYC (`--shapes 512x512,1024x1024,512x1536,2048x2048 --ms 16,32,48 --paths panel,direct --rounds 3`): panels
// 1.00-1.12x at M = 32 and 0.92-1.11x at 48 against the tiles' 0.84-1.04x and 0.73-0.88x; at M = 16 the tiles
// led (0.89-1.11x against 0.92-1.06x).
constexpr int64_t kPanelMinMOneBlock = 32;

// Whether ATen's bf16 GEMM (oneDNN) runs on AMX here: CPUID's AMX-BF16 bit, unless ONEDNN_MAX_CPU_ISA caps
// oneDNN below AMX (its values that allow AMX name it: AVX512_CORE_AMX, AVX10_1_512_AMX, ...; or ALL).
bool amx_bf16_gemm() {
#ifdef QLOWER_WOQ_X86
  static const bool cpu = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && ((d >> 22) & 1u) != 0;
  }();
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  const bool capped = cap != nullptr && cap[0] != '\0' && std::strstr(cap, "AMX") == nullptr &&
                      std::strcmp(cap, "ALL") != 0 && std::strcmp(cap, "DEFAULT") != 0;
  return cpu && !capped;
#else
  return false;
#endif
}

// Whether this process may run AMX-BF16 tiles: CPUID 7.0 EDX has AMX-TILE (bit 24) and AMX-BF16 (bit 22), the
// CPU has AVX512-BF16 (the weight conversion), and Linux grants the tile data state on request
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process, as oneDNN asks it).
bool amx_usable() {
#ifdef QLOWER_WOQ_X86
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || ((d >> 24) & 1u) == 0 || ((d >> 22) & 1u) == 0 ||
        !cpu_has(Level::Avx512Bf16)) {
      return false;
    }
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

// auto takes the AMX path for bf16 x with a [N, K] weight at the avx512_bf16 level for M in
// [kAmxMinM, kAmxMaxM]: measured faster than the direct path from M = 8 and than the chunked one up to
// M = 128 (BENCHMARKS.md, "CPU, woq_int8: qlower::woq_int8_gemm"); above, tiles fed from L2 (a weight block
// converted once per 128 columns of X^T, or once per call in panels of 8 blocks: both measured) run below
// oneDNN's GEMM on wide converted chunks.
constexpr int64_t kAmxMinM = 8;
constexpr int64_t kAmxMaxM = 128;

// QLOWER_CPU_WOQ_GEMM_PATH, read at each call like QLOWER_CPU_WOQ_ISA.
Path chosen_path() {
  const char* forced = std::getenv("QLOWER_CPU_WOQ_GEMM_PATH");
  if (forced == nullptr || forced[0] == '\0') {
    return Path::Auto;
  }
  for (int i = 0; i <= static_cast<int>(Path::Panel); ++i) {
    if (std::strcmp(forced, kPathNames[i]) == 0) {
      return static_cast<Path>(i);
    }
  }
  TORCH_CHECK(false, "qlower::woq_int8_gemm: QLOWER_CPU_WOQ_GEMM_PATH=", forced,
              " is not one of auto, direct, chunked, amx, panel");
}

bool isa_forced() {
  const char* forced = std::getenv("QLOWER_CPU_WOQ_ISA");
  return forced != nullptr && forced[0] != '\0';
}

// What one call runs: its path and the ISA level of the kernels it calls.
struct Plan {
  Path path;
  Level level;
};

// The path of a call with M rows of `act` activations and K of reduction (0: not known, taken as long and even;
// nk: a [N, K] weight, contiguous along K): the forced one where QLOWER_CPU_WOQ_GEMM_PATH names it (amx and
// panel only for the operands they serve, else as auto), else auto's.
Plan plan_call(int64_t M, int64_t K, DType act, bool nk) {
  Level level = chosen_level();
  if (level == Level::Avx512Bf16 && act != DType::BF16) {
    level = Level::Avx512;  // vdpbf16ps serves bf16 activations only (kernels_for)
  }
  const Path path = chosen_path();
  const bool native_bf16_gemm = level == Level::Avx512Bf16 && act == DType::BF16;
  if (path == Path::Amx) {
    TORCH_CHECK(amx_usable(), "qlower::woq_int8_gemm: QLOWER_CPU_WOQ_GEMM_PATH=amx but this CPU or process "
                "has no AMX-BF16 tiles (ISAs: ", supported_isas(), ")");
  }
  const bool amx_fits = native_bf16_gemm && nk && amx_usable();
  if ((path == Path::Amx && amx_fits) || (path == Path::Auto && amx_fits && M >= kAmxMinM && M <= kAmxMaxM)) {
    return {Path::Amx, Level::Avx512};  // the avx512 epilogue finishes the tiles' sums
  }
  const bool amx_gemm = amx_bf16_gemm();
  const bool panel_fits = native_bf16_gemm && nk && K % 2 == 0;  // x's rows are read as bf16 pairs
  const int64_t panel_min_m = K > 0 && K <= kPanelKc ? kPanelMinMOneBlock : kPanelMinM;
  if ((path == Path::Panel && panel_fits) || (path == Path::Auto && panel_fits && !amx_gemm && M >= panel_min_m)) {
    return {Path::Panel, level};
  }
  const bool chunked_auto = native_bf16_gemm && amx_gemm && M >= kChunkedMinM;
  if (path == Path::Chunked || (path != Path::Direct && chunked_auto)) {
    return {Path::Chunked, level};
  }
  // The direct path at the avx512_bf16 level: the vdpbf16ps kernels where the ISA is forced, or where oneDNN
  // has no AMX from M = kDpbf16MinM; else the fp32-FMA ones.
  const bool dpbf16 = isa_forced() || (!amx_gemm && M >= kDpbf16MinM);
  return {Path::Direct, native_bf16_gemm && !dpbf16 ? Level::Avx512 : level};
}

DType dtype_of(at::ScalarType t, const char* what) {
  switch (t) {
    case at::kFloat:
      return DType::F32;
    case at::kBFloat16:
      return DType::BF16;
    case at::kHalf:
      return DType::F16;
    default:
      TORCH_CHECK(false, "qlower::woq_int8_gemm: ", what, " must be float32, bfloat16 or float16, got ", t);
  }
}

// The path and ISA level a call of M rows of x's dtype takes on this CPU (nk: a [N, K] weight; K: its
// reduction length, 0 when not known): "amx_bf16",
// "chunked-avx512_bf16", "direct-avx2", ... (the report's kernel tier: the kernel decides, Python only asks).
std::string plan_name(int64_t M, at::ScalarType x, bool nk, int64_t K) {
  const Plan plan = plan_call(M, K, dtype_of(x, "x"), nk);
  if (plan.path == Path::Amx) {
    return "amx_bf16";
  }
  return std::string(kPathNames[static_cast<int>(plan.path)]) + "-" + kLevelNames[static_cast<int>(plan.level)];
}

at::Tensor channel_vector(const std::optional<at::Tensor>& t, int64_t n, const char* what) {
  const at::Tensor& v = *t;
  TORCH_CHECK(v.device().is_cpu() && v.numel() == n, "qlower::woq_int8_gemm: ", what,
              " must be a CPU tensor of N = ", n, " elements, got ", v.sizes());
  dtype_of(v.scalar_type(), what);
  return v.to(at::kFloat).contiguous().reshape({n});
}

}  // namespace qlower::woq

namespace qlower {

// x [M, K] @ w_nk [N, K] int8 .T, scaled and biased as the formula at the top of this file says.
at::Tensor woq_int8_gemm(const at::Tensor& x, const at::Tensor& w_nk, const std::optional<at::Tensor>& scale,
                         const std::optional<at::Tensor>& bias, bool scale_on_weight, at::ScalarType out_dtype) {
  using namespace qlower::woq;
  TORCH_CHECK(x.dim() == 2 && w_nk.dim() == 2, "qlower::woq_int8_gemm: x and w_nk must be 2-D, got ",
              x.sizes(), " and ", w_nk.sizes());
  TORCH_CHECK(x.device().is_cpu() && w_nk.device().is_cpu(), "qlower::woq_int8_gemm runs on CPU tensors");
  TORCH_CHECK(w_nk.scalar_type() == at::kChar, "qlower::woq_int8_gemm: w_nk must be int8, got ",
              w_nk.scalar_type());
  const int64_t M = x.size(0), K = x.size(1), N = w_nk.size(0);
  TORCH_CHECK(w_nk.size(1) == K, "qlower::woq_int8_gemm: x is [", M, ", ", K, "] but w_nk is ", w_nk.sizes());
  TORCH_CHECK(!scale_on_weight || scale.has_value(), "qlower::woq_int8_gemm: scale_on_weight without a scale");
  Problem p{};
  p.act = dtype_of(x.scalar_type(), "x");
  p.out_dt = dtype_of(out_dtype, "out_dtype");
  at::Tensor out = at::empty({M, N}, x.options().dtype(out_dtype));
  if (M == 0 || N == 0) {
    return out;
  }
  const at::Tensor xc = (x.stride(1) == 1 || K <= 1) ? x : x.contiguous();
  at::Tensor wc = w_nk;
  if (!(w_nk.stride(1) == 1 || K <= 1 || w_nk.stride(0) == 1 || N <= 1)) {
    wc = w_nk.contiguous();
  }
  const bool nk = wc.stride(1) == 1 || K <= 1 || !(wc.stride(0) == 1 || N <= 1);
  const at::Tensor s = scale.has_value() ? channel_vector(scale, N, "scale") : at::Tensor();
  const at::Tensor b = bias.has_value() ? channel_vector(bias, N, "bias") : at::Tensor();
  p.x = xc.data_ptr();
  p.lda = xc.stride(0);
  p.w = wc.data_ptr<int8_t>();
  p.sn = nk ? wc.stride(0) : 1;
  p.sk = nk ? 1 : wc.stride(1);
  p.scale = s.defined() ? s.data_ptr<float>() : nullptr;
  p.bias = b.defined() ? b.data_ptr<float>() : nullptr;
  p.scale_on_weight = scale_on_weight;
  p.out = out.data_ptr();
  p.ldo = N;
  p.M = M;
  p.N = N;
  p.K = K;
  const Plan plan = plan_call(M, K, p.act, p.sk == 1);
  switch (plan.path) {
#ifdef QLOWER_WOQ_X86
    case Path::Amx:
      amx::run(p, kernels_for(plan.level, p.act));
      break;
    case Path::Panel:
      avx512_bf16::run_panel(p);
      break;
#endif
    case Path::Chunked:
      run_chunked(p, kernels_for(plan.level, p.act), xc.options());
      break;
    default:
      run(p, kernels_for(plan.level, p.act));
  }
  return out;
}

}  // namespace qlower

#if defined(QLOWER_KERNEL_ONLY)
// The shim library (lowerings/aoti/build.py): its shim of qlower::woq_int8_gemm calls the function above
// directly, so nothing is registered.
#elif defined(QLOWER_IN_PROCESS)
// libqlower_native.so (lowerings/kernels/native.py): its ops live in a private namespace, so they never meet
// the `qlower` definitions of libqlower_ops.so; in `qlower` it only adds the CPU kernel below.
TORCH_LIBRARY(qlower_native, m) {
  m.def(
      "woq_int8_gemm(Tensor x, Tensor w_nk, Tensor? scale, Tensor? bias, bool scale_on_weight, "
      "ScalarType out_dtype) -> Tensor",
      TORCH_FN(qlower::woq_int8_gemm));
  m.def("woq_int8_gemm_isas() -> str", &qlower::woq::supported_isas);
  m.def("woq_int8_gemm_plan(int M, ScalarType x, bool nk, int K=0) -> str", &qlower::woq::plan_name);
}
// qlower::woq_int8_gemm's CPU kernel in qlower's own process (its schema and first-call Python kernel:
// lowerings/kernels/custom_ops.py): compiled graphs call it without a Python frame.
TORCH_LIBRARY_IMPL(qlower, CPU, m) {
  m.impl("woq_int8_gemm", TORCH_FN(qlower::woq_int8_gemm));
}
#else
// libqlower_ops.so: the schema is generated from the Python registration (lowerings/aoti/build.py).
TORCH_LIBRARY_IMPL(qlower, CompositeExplicitAutograd, m) {
  m.impl("woq_int8_gemm", TORCH_FN(qlower::woq_int8_gemm));
}
#endif

#else  // QLOWER_WOQ_GEMM_BODY: the ISA-generic kernels, compiled once per ISA namespace (struct Isa above)

using V = Isa::V;
constexpr int W = Isa::W;
constexpr int64_t kLineBytes = 64;
static_assert(kLineBytes % W == 0, "an int8 row's cache line holds whole vector steps");
constexpr int kNextTileLocality = 2;  // __builtin_prefetch: into L2 (prefetcht1)
constexpr int64_t kPrefetchSkew = 1024;  // bytes: the next tile's line prefetched ahead of this tile's offset
constexpr int kL1Ways = 8;               // L1d associativity of the x86 cores measured (Zen 2-4, Skylake on)
constexpr int64_t kPageBytes = 4096;     // rows this far apart map to the same L1 sets

inline V load_b(const int8_t* p) {
  return Isa::load_i8(p);
}

inline V load_b(const float* p) {
  return Isa::loadu(p);
}

inline float scalar_b(const int8_t* p) {
  return static_cast<float>(*p);
}

inline float scalar_b(const float* p) {
  return *p;
}

inline V round_v(DType dt, V v) {
  switch (dt) {
    case DType::BF16:
      return Isa::round_bf16(v);
    case DType::F16:
      return Isa::round_f16(v);
    default:
      return v;
  }
}

// c[i * ldc + j] += sum_k a[i][k] * b[j][k]: fp32 A rows, B rows of int8 (converted here) or of fp32.
// Int8 B rows are the direct path's, read straight from the weight: each line of the next NR rows (the next
// tile's, adjacent in memory) is prefetched into L2 while this tile reads its own, at the same offset, or
// kPrefetchSkew bytes ahead where the rows are 4 KiB-aliased and 2 * NR lines would not fit one L1 set. At
// K = 4096 each int8 row is one 4 KiB page, short for the hardware prefetcher to ramp up on. On the AVX2 EPYC
// the prefetch made M = 4 10-25 % faster, and M = 1 gained only once skewed (BENCHMARKS.md, "CPU, woq_int8").
template <int MR, int NR, class BT>
void tile(const void* a_, int64_t lda, const void* b_, int64_t ldb, int64_t kc, float* c, int64_t ldc) {
  const float* a = static_cast<const float*>(a_);
  const BT* b = static_cast<const BT*>(b_);
  V acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      acc[i][j] = Isa::zero();
    }
  }
  const int64_t kv = kc / W * W;
  // Rows a multiple of 4 KiB apart share their L1 sets: this tile's NR lines and the next tile's NR
  // prefetched lines of one offset would need 2 * NR ways. Where that is more than L1 has, the next tile is
  // prefetched kPrefetchSkew bytes ahead instead, on other sets.
  const bool skew = 2 * NR > kL1Ways && (ldb * static_cast<int64_t>(sizeof(BT))) % kPageBytes == 0;
  const int64_t ahead = skew ? std::min<int64_t>(kPrefetchSkew, kc / 4 / kLineBytes * kLineBytes) : 0;
  for (int64_t k = 0; k < kv; k += W) {
    if constexpr (std::is_same_v<BT, int8_t>) {
      if (k % kLineBytes == 0) {  // once per cache line of each row (W divides the line)
        const int64_t kp = k + ahead < kc ? k + ahead : k + ahead - kc;
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          __builtin_prefetch(b + (NR + j) * ldb + kp, 0, kNextTileLocality);
        }
      }
    }
    V bv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      bv[j] = load_b(b + j * ldb + k);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const V av = Isa::loadu(a + i * lda + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = Isa::fma(av, bv[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = Isa::hsum(acc[i][j]);
      for (int64_t k = kv; k < kc; ++k) {
        s += a[i * lda + k] * scalar_b(b + j * ldb + k);
      }
      c[i * ldc + j] += s;
    }
  }
}

void pack_a(const void* src, DType dt, int64_t lda, int64_t rows, int64_t kc, float* dst, int64_t ldd) {
  const int64_t kv = kc / W * W;
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ldd;
    if (dt == DType::F32) {
      std::memcpy(d, static_cast<const float*>(src) + r * lda, static_cast<size_t>(kc) * sizeof(float));
      continue;
    }
    const uint16_t* s = static_cast<const uint16_t*>(src) + r * lda;
    for (int64_t k = 0; k < kv; k += W) {
      Isa::storeu(d + k, dt == DType::BF16 ? Isa::load_bf16(s + k) : Isa::load_f16(s + k));
    }
    for (int64_t k = kv; k < kc; ++k) {
      d[k] = load_scalar(dt, s, k);
    }
  }
}

// w block -> fp32 rows: exact int8 values, or the graph's scaled weight round_act(fp32(w) * s[n]).
void pack_b(const Problem& p, const Block& blk, const Block& next, void* dst_, int64_t ldd) {
  const int64_t n0 = blk.n0, nb = blk.nb, k0 = blk.k0, kc = blk.kc;
  float* dst = static_cast<float*>(dst_);
  const bool scaled = p.scale_on_weight;
  if (p.sk == 1) {
    const int64_t kv = kc / W * W;
    for (int64_t j = 0; j < nb; ++j) {
      prefetch_row(p, next, j);
      const int8_t* src = p.w + (n0 + j) * p.sn + k0;
      float* d = dst + j * ldd;
      if (!scaled) {
        for (int64_t k = 0; k < kv; k += W) {
          Isa::storeu(d + k, Isa::load_i8(src + k));
        }
        for (int64_t k = kv; k < kc; ++k) {
          d[k] = static_cast<float>(src[k]);
        }
        continue;
      }
      const float s = p.scale[n0 + j];
      const V sv = Isa::set1(s);
      for (int64_t k = 0; k < kv; k += W) {
        Isa::storeu(d + k, round_v(p.act, Isa::mul(Isa::load_i8(src + k), sv)));
      }
      for (int64_t k = kv; k < kc; ++k) {
        d[k] = round_scalar(p.act, static_cast<float>(src[k]) * s);
      }
    }
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const int8_t* src = p.w + (k0 + k) * p.sk + n0 * p.sn;
    for (int64_t j = 0; j < nb; ++j) {
      const float v = static_cast<float>(src[j * p.sn]);
      dst[j * ldd + k] = scaled ? round_scalar(p.act, v * p.scale[n0 + j]) : v;
    }
  }
}

inline V finish_v(const Problem& p, V v, int64_t n) {
  v = round_v(p.act, v);
  if (p.scale != nullptr && !p.scale_on_weight) {
    v = Isa::keep(Isa::mul(v, Isa::loadu(p.scale + n)));
    if (p.bias != nullptr) {
      v = round_v(p.out_dt, v);
    }
  }
  if (p.bias != nullptr) {
    v = Isa::add(v, Isa::loadu(p.bias + n));
  }
  return v;
}

inline void store_v(DType dt, void* base, int64_t i, V v) {
  switch (dt) {
    case DType::BF16:
      Isa::store_bf16(static_cast<uint16_t*>(base) + i, v);
      break;
    case DType::F16:
      Isa::store_f16(static_cast<uint16_t*>(base) + i, v);
      break;
    default:
      Isa::storeu(static_cast<float*>(base) + i, v);
  }
}

void epilogue(const Problem& p, const float* c, int64_t ldc, int64_t m0, int64_t mb, int64_t n0, int64_t nb) {
  const int64_t nv = nb / W * W;
  for (int64_t i = 0; i < mb; ++i) {
    const float* row = c + i * ldc;
    const int64_t base = (m0 + i) * p.ldo + n0;
    for (int64_t j = 0; j < nv; j += W) {
      store_v(p.out_dt, p.out, base + j, finish_v(p, Isa::loadu(row + j), n0 + j));
    }
    for (int64_t j = nv; j < nb; ++j) {
      store_scalar(p.out_dt, p.out, base + j, finish_scalar(p, row[j], n0 + j));
    }
  }
}

inline V load_v(DType dt, const void* base, int64_t i) {
  switch (dt) {
    case DType::BF16:
      return Isa::load_bf16(static_cast<const uint16_t*>(base) + i);
    case DType::F16:
      return Isa::load_f16(static_cast<const uint16_t*>(base) + i);
    default:
      return Isa::loadu(static_cast<const float*>(base) + i);
  }
}

// w rows [n0, n0 + nb), all of K -> rows of x's dtype (store_v rounds to nearest even, as pack_b's round_v).
void pack_rows(const Problem& p, int64_t n0, int64_t nb, void* dst, int64_t ldd) {
  const bool scaled = p.scale_on_weight;
  if (p.sk == 1) {
    const int64_t kv = p.K / W * W;
    for (int64_t j = 0; j < nb; ++j) {
      const int8_t* src = p.w + (n0 + j) * p.sn;
      const int64_t row = j * ldd;
      const float s = scaled ? p.scale[n0 + j] : 1.f;
      const V sv = Isa::set1(s);
      for (int64_t k = 0; k < kv; k += W) {
        const V v = Isa::load_i8(src + k);
        store_v(p.act, dst, row + k, scaled ? Isa::mul(v, sv) : v);
      }
      for (int64_t k = kv; k < p.K; ++k) {
        const float v = static_cast<float>(src[k]);
        store_scalar(p.act, dst, row + k, scaled ? v * s : v);
      }
    }
    return;
  }
  for (int64_t k = 0; k < p.K; ++k) {  // a [K, N] weight: its rows run along N
    const int8_t* src = p.w + k * p.sk + n0 * p.sn;
    for (int64_t j = 0; j < nb; ++j) {
      const float v = static_cast<float>(src[j * p.sn]);
      store_scalar(p.act, dst, j * ldd + k, scaled ? v * p.scale[n0 + j] : v);
    }
  }
}

void epilogue_act(const Problem& p, const void* c, int64_t ldc, int64_t m0, int64_t mb, int64_t n0,
                  int64_t nb) {
  const int64_t nv = nb / W * W;
  for (int64_t i = 0; i < mb; ++i) {
    const int64_t base = (m0 + i) * p.ldo + n0;
    for (int64_t j = 0; j < nv; j += W) {
      store_v(p.out_dt, p.out, base + j, finish_v(p, load_v(p.act, c, i * ldc + j), n0 + j));
    }
    for (int64_t j = nv; j < nb; ++j) {
      store_scalar(p.out_dt, p.out, base + j, finish_scalar(p, load_scalar(p.act, c, i * ldc + j), n0 + j));
    }
  }
}

template <class BT, int MR, int NR>
void fill(TileFn (&row)[kMaxNr + 1]) {
  row[NR] = &tile<MR, NR, BT>;
  if constexpr (NR > 1) {
    fill<BT, MR, NR - 1>(row);
  }
}

Kernels make_kernels(const char* name) {
  static_assert(Isa::kMr == 4 && Isa::kMr <= kMaxMr, "make_kernels fills MR = 1..4");
  Kernels k{};
  k.name = name;
  k.mr_max = Isa::kMr;
  for (int mr = 0; mr <= kMaxMr; ++mr) {
    k.nr_direct[mr] = Isa::kNrDirect[mr];
    k.nr_packed[mr] = Isa::kNrPacked[mr];
  }
  k.a_bf16 = false;
  k.b_elem = 4;
  k.direct_max_m = kDirectMaxM;
  fill<int8_t, 1, Isa::kNrDirect[1]>(k.direct[1]);
  fill<int8_t, 2, Isa::kNrDirect[2]>(k.direct[2]);
  fill<int8_t, 3, Isa::kNrDirect[3]>(k.direct[3]);
  fill<int8_t, 4, Isa::kNrDirect[4]>(k.direct[4]);
  fill<float, 1, Isa::kNrPacked[1]>(k.packed[1]);
  fill<float, 2, Isa::kNrPacked[2]>(k.packed[2]);
  fill<float, 3, Isa::kNrPacked[3]>(k.packed[3]);
  fill<float, 4, Isa::kNrPacked[4]>(k.packed[4]);
  k.pack_a = &pack_a;
  k.pack_b = &pack_b;
  k.epilogue = &epilogue;
  k.pack_rows = &pack_rows;
  k.epilogue_act = &epilogue_act;
  return k;
}

#endif  // QLOWER_WOQ_GEMM_BODY
