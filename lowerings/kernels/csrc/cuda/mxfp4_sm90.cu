// qlower's MXFP4 weight-only GEMM for sm_90a: out[M, N] = x[M, K] @ dequant(w)[N, K].T + bias, bf16 x, w in
// e2m1 codes with one e8m0 scale per 32 consecutive elements of a row (OCP MX, block size 32).
//
// Built on CUTLASS's SM90 mixed-input collective (TMA loads, warp-specialized mainloop, the weight converted
// to bf16 in registers and fed to wgmma as its register operand, so the problem runs transposed as in
// w8a16_sm90.cu: D'[N, M] = w @ x.T, column-major D' is row-major out). That collective applies one scale per
// row and K tile; an MX block is 32 elements and the K tile 128 (64 bytes of e2m1 per row: one TMA swizzle
// atom). So the scale element here is `BlockScales`, the tile's four block scales of one row as bf16, loaded
// by the collective's own scale TMA once per K tile, and qlower's specialization of the collective's
// conversion step (`MixedInputUtils` below) picks the block's scale for each 16-element wgmma step of K and
// folds it into the conversion:
//
//   e2m1 -> bf16 without a table: the nibble's 3 magnitude bits go to bf16 bits 6..8 (the exponent's lowest
//   two bits and the mantissa's top bit) and its sign to bit 15. Read as bf16 that is the e2m1 value * 2^-126
//   for every code (0.5 is the bf16 subnormal 2^-127). A multiply by 2^126 makes it exact, a second by the
//   block scale rounds value * 2^(E - 127) once to bf16, as the user's dequantize-then-cast computes it
//   (special scales included: the scale tensor holds 2^(E - 127) as bf16, NaN for the NaN code, as the graph
//   decodes them; lowerings/kernels/cutlass/mxfp4.py).
//
// One configuration per object, as w8a16_sm90.cu: built by lowerings/kernels/cutlass/build.py with
// -DQLOWER_NAME, the tile, the cluster and the schedule as macros; each exports `qlower_mxfp4_sm90_<NAME>`.

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/util/packed_stride.hpp"

#include "cutlass_run.h"
#include "mxfp4_sm90.h"

#ifndef QLOWER_NAME
#error "compile with -DQLOWER_NAME=<config> and the tile macros (lowerings/kernels/cutlass/build.py)"
#endif

namespace qlower_mxfp4 {

constexpr int kTileK = QLOWER_MXFP4_TILE_K;
constexpr int kBlock = 32;  // MX block size
constexpr int kMmaK = 16;   // K of one bf16 wgmma

// The four MX block scales of one row in one K tile, as bf16 bit patterns: lo = blocks 0 | 1 << 16,
// hi = blocks 2 | 3 << 16.
struct alignas(8) BlockScales {
  uint32_t lo;
  uint32_t hi;
};
static_assert(kTileK == 4 * kBlock, "BlockScales holds four blocks");

// The collective's member types the generic conversion utilities read (and nothing else), so they can be
// instantiated for qlower's scale type while the collective is still being defined.
template <class C>
struct UtilsView {
  using KernelSchedule = typename C::KernelSchedule;
  using SmemLayoutA = typename C::SmemLayoutA;
  using SmemLayoutB = typename C::SmemLayoutB;
  using SmemLayoutScale = typename C::SmemLayoutScale;
  using SwappedElementA = typename C::SwappedElementA;
  using SwappedElementB = typename C::SwappedElementB;
  using RealSwappedElementA = typename C::RealSwappedElementA;
  using RealSwappedElementB = typename C::RealSwappedElementB;
  using ElementScale = typename C::ElementScale;
  using ElementZero = typename C::ElementZero;
  using SmemCopyAtomScale = typename C::SmemCopyAtomScale;
  static constexpr auto KernelConversionMode = C::KernelConversionMode;
  static constexpr auto ModeHasScales = C::ModeHasScales;
  static constexpr auto UseScaleLookupTable = C::UseScaleLookupTable;
};

// Elements 2p (low nibble) and 2p + 1 of an e2m1 word as a bf16x2 pair times `scale2` (both halves the
// block's scale), rounded once. `even` / `odd` are the word's even / odd nibbles, one per byte.
CUTLASS_DEVICE uint32_t e2m1_pair_scaled(uint32_t even, uint32_t odd, int p, uint32_t scale2) {
  // Byte p of `even` to bits 0..3, byte p of `odd` to bits 16..19, zeros elsewhere (selector 8 | p
  // replicates the sign of a byte whose top bit is clear: 0x00).
  uint32_t const sel = uint32_t(p) | ((8u | p) << 4) | ((4u + p) << 8) | ((8u | p) << 12);
  uint32_t v;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(v) : "r"(even), "r"(odd), "r"(sel));
  uint32_t const mag = (v << 6) & 0x01C001C0u;  // magnitude bits e1 e0 m -> bf16 bits 6..8 (22..24)
  uint32_t bits;
  constexpr uint32_t kLut = (0xF0 & 0xCC) | 0xAA;  // (a & b) | c
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(bits) : "r"(v << 12), "r"(0x80008000u), "r"(mag), "n"(kLut));
  __nv_bfloat162 x = reinterpret_cast<__nv_bfloat162&>(bits);
  __nv_bfloat162 const two126 = __halves2bfloat162(__ushort_as_bfloat16(0x7E80), __ushort_as_bfloat16(0x7E80));
  x = __hmul2(x, two126);  // exact: the e2m1 value
  x = __hmul2(x, reinterpret_cast<__nv_bfloat162 const&>(scale2));
  return reinterpret_cast<uint32_t&>(x);
}

}  // namespace qlower_mxfp4

namespace cutlass::gemm::collective::detail {

// The collective's conversion utilities for an e2m1 operand with `BlockScales`: everything generic except
// the conversion step, which applies each 16-element K step's own block scale.
template <int Stages, class ClusterShape, class KernelSchedule, class TileShape, class StrideA, class ElementB,
          class StrideB, class TiledMma, class GmemTiledCopyA, class SmemLayoutAtomA, class SmemCopyAtomA,
          class TransformA, class GmemTiledCopyB, class SmemLayoutAtomB, class SmemCopyAtomB, class TransformB>
struct MixedInputUtils<CollectiveMma<
    MainloopSm90TmaGmmaRmemAWarpSpecializedMixedInput<Stages, ClusterShape, KernelSchedule>, TileShape,
    cute::tuple<cutlass::float_e2m1_t, qlower_mxfp4::BlockScales>, StrideA, ElementB, StrideB, TiledMma,
    GmemTiledCopyA, SmemLayoutAtomA, SmemCopyAtomA, TransformA, GmemTiledCopyB, SmemLayoutAtomB, SmemCopyAtomB,
    TransformB>>
    : MixedInputUtils<qlower_mxfp4::UtilsView<CollectiveMma<
          MainloopSm90TmaGmmaRmemAWarpSpecializedMixedInput<Stages, ClusterShape, KernelSchedule>, TileShape,
          cute::tuple<cutlass::float_e2m1_t, qlower_mxfp4::BlockScales>, StrideA, ElementB, StrideB, TiledMma,
          GmemTiledCopyA, SmemLayoutAtomA, SmemCopyAtomA, TransformA, GmemTiledCopyB, SmemLayoutAtomB,
          SmemCopyAtomB, TransformB>>> {
  template <class EngineIn, class EngineOut, class LayoutIn, class LayoutOut, class... Ts>
  CUTLASS_DEVICE static void dequantize_A_kblock(cute::Tensor<EngineIn, LayoutIn> const& tCrA_load,
                                                 cute::Tensor<EngineOut, LayoutOut>& tCrA_mma,
                                                 cute::tuple<Ts...>& partitioned_extra_info, int const k_block) {
    using namespace cute;
    static_assert(is_same_v<typename EngineIn::value_type, cutlass::float_e2m1_t>);
    static_assert(is_same_v<typename EngineOut::value_type, cutlass::bfloat16_t>);
    static_assert(decltype(size<2>(tCrA_mma))::value * qlower_mxfp4::kMmaK == qlower_mxfp4::kTileK,
                  "one bf16 wgmma step is 16 elements of K");

    Tensor src = tCrA_load(_, _, k_block);
    Tensor dst = tCrA_mma(_, _, k_block);
    Tensor scales = cute::get<1>(partitioned_extra_info)(_, _, k_block);
    // wgmma's A fragment: 8 values per thread and M step, (k, k + 1), rows (r, r + 8), (k, k + 8): value
    // pairs 2p, 2p + 1 share a row and a block.
    static_assert(decltype(size(src(_, 0)))::value == 8, "8 values of the A fragment per M step");
    Tensor src_vm = cute::group_modes<1, -1>(cute::zipped_divide(src, Int<8>{}));
    Tensor dst_vm = cute::group_modes<1, -1>(cute::zipped_divide(dst, Int<8>{}));
    Tensor scales_vm = cute::group_modes<1, -1>(cute::zipped_divide(scales, Int<8>{}));

    int const block = k_block * qlower_mxfp4::kMmaK / qlower_mxfp4::kBlock;  // 0..3 within the tile
    uint32_t const half_sel = (block & 1) ? 0x3232u : 0x1010u;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<1>(dst_vm); ++i) {
      uint32_t const w = recast<uint32_t>(src_vm(_, i))(0);
      uint32_t const even = w & 0x0F0F0F0Fu;
      uint32_t const odd = (w >> 4) & 0x0F0F0F0Fu;
      auto&& d = recast<uint32_t>(dst_vm(_, i));
      CUTLASS_PRAGMA_UNROLL
      for (int p = 0; p < 4; ++p) {
        qlower_mxfp4::BlockScales const s = scales_vm(2 * p, i);
        uint32_t const word = block < 2 ? s.lo : s.hi;
        uint32_t scale2;
        asm("prmt.b32 %0, %1, %1, %2;" : "=r"(scale2) : "r"(word), "r"(half_sel));
        d(p) = qlower_mxfp4::e2m1_pair_scaled(even, odd, p, scale2);
      }
    }
  }
};

}  // namespace cutlass::gemm::collective::detail

using namespace cute;

namespace {

constexpr int kTileM = QLOWER_TILE_M;  // rows of D' per tile: output channels (N of the linear)
constexpr int kTileN = QLOWER_TILE_N;  // columns of D' per tile: tokens (M of the linear)

using KernelSchedule = qlower_cutlass::KernelSchedule;
using EpilogueSchedule = qlower_cutlass::EpilogueSchedule;
using TileScheduler = qlower_cutlass::TileScheduler;

struct Mxfp4 {
  using Element = cutlass::bfloat16_t;
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, Int<qlower_mxfp4::kTileK>>;
  using ClusterShape = Shape<Int<QLOWER_CLUSTER_M>, Int<QLOWER_CLUSTER_N>, _1>;
  using LayoutW = cutlass::layout::RowMajor;     // w [N, K]: D''s A operand, K-major
  using LayoutX = cutlass::layout::ColumnMajor;  // x [M, K] row-major is D''s B [K, M] column-major
  using LayoutD = cutlass::layout::ColumnMajor;  // D' [N, M] column-major is out [M, N] row-major
  static constexpr int kAlignW = 32;             // 16 bytes of e2m1
  static constexpr int kAlignX = 8;              // 16 bytes of bf16
  static constexpr int kAlignD = 8;

  // D' = acc + bias[row] (bias optional, null: 0).
  using Fusion = cutlass::epilogue::fusion::LinCombPerRowBias<Element, float, Element, Element, float>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, Element, LayoutD,
      kAlignD, EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      cute::tuple<cutlass::float_e2m1_t, qlower_mxfp4::BlockScales>, LayoutW, kAlignW, Element, LayoutX, kAlignX,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const QlowerMxfp4Args& a) {
    using StrideW = typename Kernel::StrideA;
    using StrideX = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    using StrideS = typename Mainloop::StrideScale;
    int const n = int(a.n), m = int(a.m), k = int(a.k);
    StrideW stride_w = cutlass::make_cute_packed_stride(StrideW{}, make_shape(n, k, 1));
    StrideX stride_x = cutlass::make_cute_packed_stride(StrideX{}, make_shape(m, k, 1));
    StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(n, m, 1));
    StrideS stride_s = cutlass::make_cute_packed_stride(StrideS{}, make_shape(n, k / qlower_mxfp4::kTileK, 1));
    get<0>(stride_w) = a.ldw * 2;  // in elements: two e2m1 per byte
    get<0>(stride_x) = a.ldx;
    get<1>(stride_d) = a.ldout;

    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {n, m, k, 1},
        {static_cast<const cutlass::float_e2m1_t*>(a.w), stride_w, static_cast<const Element*>(a.x), stride_x,
         static_cast<const qlower_mxfp4::BlockScales*>(a.scales), stride_s, qlower_mxfp4::kTileK},
        {{}, nullptr, stride_d, static_cast<Element*>(a.out), stride_d}};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;
    fusion.beta = 0.0f;
    fusion.bias_ptr = static_cast<const Element*>(a.bias);
    args.hw_info.device_id = a.device;
    args.hw_info.sm_count = a.sm_count;
#if QLOWER_STREAMK
    args.scheduler.splits = a.splits > 0 ? a.splits : 1;
    using Mode = typename Kernel::TileScheduler::DecompositionMode;
    args.scheduler.decomposition_mode = a.splits > 0 ? Mode::SplitK : Mode::Heuristic;
#endif
    return args;
  }

  static int run(QlowerMxfp4Args* a) {
    if (a->k % qlower_mxfp4::kTileK != 0) {
      return QLOWER_W8A16_CANNOT_IMPLEMENT;
    }
    return qlower_cutlass::run<Gemm>(arguments(*a), a->workspace, &a->workspace_bytes, a->stream);
  }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int QLOWER_CAT(qlower_mxfp4_sm90_, QLOWER_NAME)(
    QlowerMxfp4Args* a) {
#if defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED)
  return Mxfp4::run(a);
#else
  (void)a;
  return QLOWER_W8A16_NOT_BUILT_FOR_SM90A;
#endif
}
