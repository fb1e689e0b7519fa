// qlower's W8A16 GEMM for sm_90a: out[M, N] = (x[M, K] @ w[N, K].T) * scale + bias, int8 w, bf16/fp16 x.
//
// Built on CUTLASS's SM90 mixed-input collective (TMA loads, warp-specialized mainloop, the int8 weight
// converted to x's type in registers and fed to wgmma as its register operand). The weight must be that
// register operand, so the problem is run transposed: D'[N, M] = w[N, K] @ x[M, K].T, with D' written
// column-major, which is `out` row-major (CUTLASS example 55 does the same swap to keep the TMA epilogue).
// The per-channel scale is per row of D', applied to the fp32 accumulator in the epilogue together with the
// bias (one rounding to x's type), as CUTLASS's PerRowLinCombPerRowBias fusion does.
//
// One configuration per object: the build (lowerings/kernels/cutlass/build.py) compiles this file once per
// entry of lowerings/kernels/cutlass/configs.py, each with -DQLOWER_NAME, the tile, the cluster and the
// schedule as macros, in parallel, and links the objects into one library. Each object exports
// `qlower_w8a16_sm90_<NAME>`: a plain C entry point (no torch headers), called from Python through ctypes
// (cutlass/w8a16.py) and from the AOTInductor C shim's kernel (woq_int8_cutlass.cpp) alike.

#include <cstdint>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "cutlass_run.h"
#include "w8a16_sm90.h"

#ifndef QLOWER_NAME
#error "compile with -DQLOWER_NAME=<config> and the tile macros (lowerings/kernels/cutlass/build.py)"
#endif

using namespace cute;

namespace {

constexpr int kTileM = QLOWER_TILE_M;  // rows of D' per tile: output channels (N of the linear)
constexpr int kTileN = QLOWER_TILE_N;  // columns of D' per tile: tokens (M of the linear)

using KernelSchedule = qlower_cutlass::KernelSchedule;
using EpilogueSchedule = qlower_cutlass::EpilogueSchedule;
using TileScheduler = qlower_cutlass::TileScheduler;
constexpr int kTileK = 64;             // 128 bytes of bf16/fp16 per row: one TMA swizzle atom

template <class Element>
struct W8A16 {
  using TileShape = Shape<Int<kTileM>, Int<kTileN>, Int<kTileK>>;
  using ClusterShape = Shape<Int<QLOWER_CLUSTER_M>, Int<QLOWER_CLUSTER_N>, _1>;
  using LayoutW = cutlass::layout::RowMajor;     // w [N, K]: D''s A operand, K-major
  using LayoutX = cutlass::layout::ColumnMajor;  // x [M, K] row-major is D''s B [K, M] column-major
  using LayoutD = cutlass::layout::ColumnMajor;  // D' [N, M] column-major is out [M, N] row-major
  static constexpr int kAlignW = 16;             // 16 bytes of int8
  static constexpr int kAlignX = 8;              // 16 bytes of bf16/fp16
  static constexpr int kAlignD = 8;

  // D' = scale[row] * acc + bias[row], scale a vector or one value, bias optional (null: 0).
  using Fusion = cutlass::epilogue::fusion::PerRowLinCombPerRowBiasEltAct<
      cutlass::epilogue::thread::Identity, Element, float, Element, Element, Element>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlignD, Element, LayoutD,
      kAlignD, EpilogueSchedule, Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, int8_t, LayoutW, kAlignW, Element, LayoutX, kAlignX,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const QlowerW8A16Args& a) {
    using StrideW = typename Kernel::StrideA;
    using StrideX = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    StrideW stride_w = cutlass::make_cute_packed_stride(StrideW{}, make_shape(int(a.n), int(a.k), 1));
    StrideX stride_x = cutlass::make_cute_packed_stride(StrideX{}, make_shape(int(a.m), int(a.k), 1));
    StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, make_shape(int(a.n), int(a.m), 1));
    get<0>(stride_w) = a.ldw;
    get<0>(stride_x) = a.ldx;
    get<1>(stride_d) = a.ldout;

    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {int(a.n), int(a.m), int(a.k), 1},
        {static_cast<const int8_t*>(a.w), stride_w, static_cast<const Element*>(a.x), stride_x},
        {{}, nullptr, stride_d, static_cast<Element*>(a.out), stride_d}};
    auto& fusion = args.epilogue.thread;
    fusion.alpha_ptr = static_cast<const Element*>(a.scale);
    fusion.dAlpha = {bool(a.scale_per_channel), _0{}, 0};
    fusion.beta = Element(0);
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

  static int run(QlowerW8A16Args* a) {
    return qlower_cutlass::run<Gemm>(arguments(*a), a->workspace, &a->workspace_bytes, a->stream);
  }
};

}  // namespace

extern "C" __attribute__((visibility("default"))) int QLOWER_CAT(qlower_w8a16_sm90_, QLOWER_NAME)(
    QlowerW8A16Args* a) {
#if defined(CUTLASS_ARCH_MMA_SM90_SUPPORTED)
  switch (a->dtype) {
    case QLOWER_W8A16_BF16:
      return W8A16<cutlass::bfloat16_t>::run(a);
    case QLOWER_W8A16_FP16:
      return W8A16<cutlass::half_t>::run(a);
    default:
      return QLOWER_W8A16_BAD_DTYPE;
  }
#else
  (void)a;
  return QLOWER_W8A16_NOT_BUILT_FOR_SM90A;
#endif
}
