// qlower::int8_gemm: x int8 [M, K] @ w_nk int8 [N, K].T -> int32 [M, N], exactly (int32 sums, wrapping as
// two's complement int32 does), on CPU, for the small M of decode steps; above `max_m` rows it calls
// `at::_int_mm(x, w_nk.t())` (oneDNN), so one op serves a symbolic M (except K = 1, where CPU `_int_mm` returns
// wrong numbers for N > 1 on torch 2.13: this file's kernels take every M there).
//
// Why: CPU `_int_mm` with an [N, K] weight re-packs the weight on every call, which costs tens of microseconds
// at small layers (30 us for a 512x512 M = 1 call against 4 us here, 2 threads on an AMX Xeon) and reads the
// weight twice at large ones (4096x4096 M = 1: 0.72 ms against 0.35 ms). This kernel reads the int8 weight
// once, as stored, with no packing (BENCHMARKS.md, "CPU, dynamic_int8: qlower::int8_gemm").
//
// The dot products run along K on both operands (both are contiguous along K): blocks of 4 weight rows x up to
// 4 activation rows of vector accumulators, summed horizontally at the end. ISA levels, chosen at run time
// (`__builtin_cpu_supports`; `QLOWER_CPU_INT8_GEMM_ISA=scalar|avx2|avx512|avx512_vnni` forces one, an error
// where the CPU lacks it):
// - avx512_vnni: vpdpbusd takes an unsigned and a signed operand: the weight byte w is read as w ^ 0x80 =
//   w + 128 (unsigned), so each sum is x . w + 128 * sum(x), and 128 * sum(x) (one per activation row, computed
//   once per call) is subtracted at the end; exact in int32 modular arithmetic.
// - avx512 / avx2: both operands widened to int16 (the activation once per call, the weight as it is loaded),
//   vpmaddwd pairs summed into int32 (exact: |x * w| <= 2^14, a pair <= 2^15).
// - scalar: plain int32 loops.
// Threads split the N rows (at::parallel_for), each task at least kMinTaskBytes of weight.
//
// Built twice, like woq_gemm.cpp: into libqlower_native.so (QLOWER_IN_PROCESS: `qlower_native::int8_gemm` and
// the CPU kernel of `qlower::int8_gemm`, whose schema qlower's Python defines in
// lowerings/kernels/custom_ops.py) and into libqlower_ops.so / the AOTInductor shim library.
// Tests: tests/lowerings/kernels/test_cpu_int8_gemm.py.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__GNUC__) && defined(__x86_64__)
#define QLOWER_I8_X86 1
#include <immintrin.h>
#endif

// Full unrolling keeps every accumulator of a block in registers (GCC at -O2 leaves these loops rolled).
#define QLOWER_I8_UNROLL _Pragma("GCC unroll 16")
// Bytes ahead along each weight row that the vnni loop prefetches into L1 (1024 was at least as fast as 256
// and 2048 at M = 1 and 4 in one interleaved run of scripts/bench_cpu_int8_gemm.py on the AMX Xeon VM).
constexpr int64_t kPrefetchAhead = 1024;

namespace qlower::i8 {

enum class Level { Scalar, Avx2, Avx512, Avx512Vnni };

constexpr int kRows = 4;                   // weight rows per block
constexpr int kMaxActRows = 4;             // activation rows per block
constexpr int64_t kMinTaskBytes = 32768;   // weight bytes per parallel task at least

inline const char* level_name(Level l) {
  switch (l) {
    case Level::Avx512Vnni:
      return "avx512_vnni";
    case Level::Avx512:
      return "avx512";
    case Level::Avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

inline bool cpu_has(Level l) {
#ifdef QLOWER_I8_X86
  switch (l) {
    case Level::Avx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni");
    case Level::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    case Level::Avx2:
      return __builtin_cpu_supports("avx2");
    default:
      return true;
  }
#else
  return l == Level::Scalar;
#endif
}

// The level a call runs at: QLOWER_CPU_INT8_GEMM_ISA, else the best this CPU has.
inline Level level() {
  const char* forced = std::getenv("QLOWER_CPU_INT8_GEMM_ISA");
  if (forced != nullptr && *forced != '\0') {
    for (Level l : {Level::Scalar, Level::Avx2, Level::Avx512, Level::Avx512Vnni}) {
      if (std::strcmp(forced, level_name(l)) == 0) {
        TORCH_CHECK(cpu_has(l), "qlower::int8_gemm: QLOWER_CPU_INT8_GEMM_ISA=", forced,
                    " but this CPU lacks that instruction set");
        return l;
      }
    }
    TORCH_CHECK(false, "qlower::int8_gemm: QLOWER_CPU_INT8_GEMM_ISA=", forced,
                " is not one of scalar, avx2, avx512, avx512_vnni");
  }
  for (Level l : {Level::Avx512Vnni, Level::Avx512, Level::Avx2}) {
    if (cpu_has(l)) {
      return l;
    }
  }
  return Level::Scalar;
}

inline std::string level_now() {
  return level_name(level());
}

// One call's operands. x16: the activation widened to int16 (avx2/avx512 levels); xsum: sum_k x[m, k] (vnni).
struct Problem {
  const int8_t* x;
  int64_t ldx;
  const int8_t* w;
  int64_t ldw;
  int32_t* y;
  int64_t ldy;
  int64_t M, N, K;
  const int16_t* x16;
  const int32_t* xsum;
};

// y[m0 : m0 + MB, n0 : n0 + nb] for weight rows `rows` (kRows pointers; rows past nb repeat a valid one).
template <int MB>
void block_scalar(const Problem& p, int64_t m0, const int8_t* const* rows, int nb, int64_t n0) {
  QLOWER_I8_UNROLL
  for (int i = 0; i < MB; ++i) {
    const int8_t* xr = p.x + (m0 + i) * p.ldx;
    for (int j = 0; j < nb; ++j) {
      uint32_t acc = 0;  // unsigned: wraps as int32 two's complement sums do, without undefined behaviour
      for (int64_t k = 0; k < p.K; ++k) {
        acc += static_cast<uint32_t>(static_cast<int32_t>(xr[k]) * static_cast<int32_t>(rows[j][k]));
      }
      p.y[(m0 + i) * p.ldy + n0 + j] = static_cast<int32_t>(acc);
    }
  }
}

#ifdef QLOWER_I8_X86

template <int MB>
__attribute__((target("avx2"))) void block_avx2(const Problem& p, int64_t m0, const int8_t* const* rows, int nb,
                                                  int64_t n0) {
  __m256i acc[MB][kRows] = {};  // zero
  const int64_t kv = p.K / 16 * 16;
  for (int64_t k = 0; k < kv; k += 16) {
    __m256i wv[kRows];
    QLOWER_I8_UNROLL
    for (int j = 0; j < kRows; ++j) {
      wv[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + k)));
    }
    QLOWER_I8_UNROLL
    for (int i = 0; i < MB; ++i) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.x16 + (m0 + i) * p.K + k));
      QLOWER_I8_UNROLL
      for (int j = 0; j < kRows; ++j) {
        acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(xv, wv[j]));
      }
    }
  }
  QLOWER_I8_UNROLL
  for (int i = 0; i < MB; ++i) {
    const int8_t* xr = p.x + (m0 + i) * p.ldx;
    for (int j = 0; j < nb; ++j) {
      alignas(32) int32_t lanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[i][j]);
      uint32_t sum = 0;
      for (int32_t v : lanes) {
        sum += static_cast<uint32_t>(v);
      }
      for (int64_t k = kv; k < p.K; ++k) {
        sum += static_cast<uint32_t>(static_cast<int32_t>(xr[k]) * static_cast<int32_t>(rows[j][k]));
      }
      p.y[(m0 + i) * p.ldy + n0 + j] = static_cast<int32_t>(sum);
    }
  }
}

template <int MB>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void block_avx512(const Problem& p, int64_t m0,
                                                               const int8_t* const* rows, int nb, int64_t n0) {
  __m512i acc[MB][kRows] = {};  // zero
  for (int64_t k = 0; k < p.K; k += 32) {
    const __mmask32 mk = p.K - k >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (p.K - k)) - 1u);
    __m512i wv[kRows];
    QLOWER_I8_UNROLL
    for (int j = 0; j < kRows; ++j) {
      wv[j] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mk, rows[j] + k));
    }
    QLOWER_I8_UNROLL
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_maskz_loadu_epi16(mk, p.x16 + (m0 + i) * p.K + k);
      QLOWER_I8_UNROLL
      for (int j = 0; j < kRows; ++j) {
        acc[i][j] = _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(xv, wv[j]));
      }
    }
  }
  QLOWER_I8_UNROLL
  for (int i = 0; i < MB; ++i) {
    for (int j = 0; j < nb; ++j) {
      p.y[(m0 + i) * p.ldy + n0 + j] = _mm512_reduce_add_epi32(acc[i][j]);
    }
  }
}

template <int MB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void block_vnni(const Problem& p, int64_t m0,
                                                                        const int8_t* const* rows, int nb,
                                                                        int64_t n0) {
  __m512i acc[MB][kRows] = {};  // zero
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t k = 0; k < p.K; k += 64) {
    const __mmask64 mk = p.K - k >= 64 ? ~__mmask64{0} : (__mmask64{1} << (p.K - k)) - 1;
    __m512i wv[kRows];
    QLOWER_I8_UNROLL
    for (int j = 0; j < kRows; ++j) {  // past K both operands load 0: (0 ^ 0x80) * 0 adds nothing
      _mm_prefetch(reinterpret_cast<const char*>(rows[j] + k + kPrefetchAhead), _MM_HINT_T0);
      wv[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, rows[j] + k), flip);
    }
    QLOWER_I8_UNROLL
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_maskz_loadu_epi8(mk, p.x + (m0 + i) * p.ldx + k);
      QLOWER_I8_UNROLL
      for (int j = 0; j < kRows; ++j) {
        acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xv);
      }
    }
  }
  QLOWER_I8_UNROLL
  for (int i = 0; i < MB; ++i) {
    const uint32_t shift = 128u * static_cast<uint32_t>(p.xsum[m0 + i]);
    for (int j = 0; j < nb; ++j) {
      const uint32_t sum = static_cast<uint32_t>(_mm512_reduce_add_epi32(acc[i][j]));
      p.y[(m0 + i) * p.ldy + n0 + j] = static_cast<int32_t>(sum - shift);
    }
  }
}

#endif  // QLOWER_I8_X86

using BlockFn = void (*)(const Problem&, int64_t, const int8_t* const*, int, int64_t);

// The block kernels of a level, indexed by the block's activation rows - 1.
inline const BlockFn* blocks_for(Level l) {
  static constexpr BlockFn scalar[kMaxActRows] = {block_scalar<1>, block_scalar<2>, block_scalar<3>,
                                                  block_scalar<4>};
#ifdef QLOWER_I8_X86
  static constexpr BlockFn avx2[kMaxActRows] = {block_avx2<1>, block_avx2<2>, block_avx2<3>, block_avx2<4>};
  static constexpr BlockFn avx512[kMaxActRows] = {block_avx512<1>, block_avx512<2>, block_avx512<3>,
                                                  block_avx512<4>};
  static constexpr BlockFn vnni[kMaxActRows] = {block_vnni<1>, block_vnni<2>, block_vnni<3>, block_vnni<4>};
  switch (l) {
    case Level::Avx512Vnni:
      return vnni;
    case Level::Avx512:
      return avx512;
    case Level::Avx2:
      return avx2;
    default:
      break;
  }
#endif
  return scalar;
}

// Every [M, N] output of the problem: tasks of weight-row blocks, each over all M rows in groups of kMaxActRows.
inline void run(const Problem& p, Level l) {
  const BlockFn* fns = blocks_for(l);
  const int64_t n_blocks = (p.N + kRows - 1) / kRows;
  const int64_t grain = std::max<int64_t>(1, kMinTaskBytes / std::max<int64_t>(kRows * p.K, 1));
  at::parallel_for(0, n_blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kRows;
      const int nb = static_cast<int>(std::min<int64_t>(kRows, p.N - n0));
      const int8_t* rows[kRows];
      QLOWER_I8_UNROLL
      for (int j = 0; j < kRows; ++j) {
        rows[j] = p.w + (n0 + std::min(j, nb - 1)) * p.ldw;
      }
      for (int64_t m0 = 0; m0 < p.M; m0 += kMaxActRows) {
        const int mb = static_cast<int>(std::min<int64_t>(kMaxActRows, p.M - m0));
        fns[mb - 1](p, m0, rows, nb, n0);
      }
    }
  });
}

}  // namespace qlower::i8

namespace qlower {

// x int8 [M, K] @ w_nk int8 [N, K].T -> int32 [M, N]: this file's kernels up to max_m rows, at::_int_mm above.
at::Tensor int8_gemm(const at::Tensor& x, const at::Tensor& w_nk, int64_t max_m) {
  using namespace qlower::i8;
  TORCH_CHECK(x.dim() == 2 && w_nk.dim() == 2, "qlower::int8_gemm: x and w_nk must be 2-D, got ", x.sizes(),
              " and ", w_nk.sizes());
  TORCH_CHECK(x.device().is_cpu() && w_nk.device().is_cpu(), "qlower::int8_gemm runs on CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kChar && w_nk.scalar_type() == at::kChar,
              "qlower::int8_gemm: x and w_nk must be int8, got ", x.scalar_type(), " and ", w_nk.scalar_type());
  const int64_t M = x.size(0), K = x.size(1), N = w_nk.size(0);
  TORCH_CHECK(w_nk.size(1) == K, "qlower::int8_gemm: x is [", M, ", ", K, "] but w_nk is ", w_nk.sizes());
  if (M > max_m && K > 1) {  // K = 1: CPU `_int_mm` misreads the [1, N] operand (tests/lowerings/kernels/test_cpu_int8_gemm.py)
    return at::_int_mm(x, w_nk.t());
  }
  if (M == 0 || N == 0 || K == 0) {
    return at::zeros({M, N}, x.options().dtype(at::kInt));
  }
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kInt));
  const at::Tensor xc = x.stride(1) == 1 ? x : x.contiguous();
  const at::Tensor wc = w_nk.stride(1) == 1 ? w_nk : w_nk.contiguous();
  const Level l = level();
  Problem p{};
  p.x = xc.data_ptr<int8_t>();
  p.ldx = xc.stride(0);
  p.w = wc.data_ptr<int8_t>();
  p.ldw = wc.stride(0);
  p.y = out.data_ptr<int32_t>();
  p.ldy = N;
  p.M = M;
  p.N = N;
  p.K = K;
  std::vector<int16_t> x16;
  std::vector<int32_t> xsum;
  if (l == Level::Avx2 || l == Level::Avx512) {
    x16.resize(static_cast<size_t>(M * K));
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) {
        x16[m * K + k] = p.x[m * p.ldx + k];
      }
    }
    p.x16 = x16.data();
  } else if (l == Level::Avx512Vnni) {
    xsum.resize(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) {
      uint32_t s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += static_cast<uint32_t>(static_cast<int32_t>(p.x[m * p.ldx + k]));
      }
      xsum[m] = static_cast<int32_t>(s);
    }
    p.xsum = xsum.data();
  }
  run(p, l);
  return out;
}

}  // namespace qlower

#if defined(QLOWER_KERNEL_ONLY)
// The shim library (lowerings/aoti/build.py): its shim of qlower::int8_gemm calls the function above directly.
#elif defined(QLOWER_IN_PROCESS)
TORCH_LIBRARY_FRAGMENT(qlower_native, m) {
  m.def("int8_gemm(Tensor x, Tensor w_nk, int max_m) -> Tensor", TORCH_FN(qlower::int8_gemm));
  m.def("int8_gemm_isa() -> str", &qlower::i8::level_now);
}
// qlower::int8_gemm's CPU kernel in qlower's own process (schema and first-call Python kernel:
// lowerings/kernels/custom_ops.py): compiled graphs call it without a Python frame.
TORCH_LIBRARY_IMPL(qlower, CPU, m) {
  m.impl("int8_gemm", TORCH_FN(qlower::int8_gemm));
}
#else
// libqlower_ops.so: the schema is generated from the Python registration (lowerings/aoti/build.py).
TORCH_LIBRARY_IMPL(qlower, CompositeExplicitAutograd, m) {
  m.impl("int8_gemm", TORCH_FN(qlower::int8_gemm));
}
#endif
