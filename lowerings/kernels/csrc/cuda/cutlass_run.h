// What qlower's CUTLASS objects (w8a16_sm90.cu, mxfp4_sm90.cu) share: the schedule and tile scheduler the
// configuration macros name (QLOWER_PINGPONG, QLOWER_STREAMK; lowerings/kernels/cutlass/configs.py), and one
// GEMM run for their C entry points: can_implement, the workspace query protocol of QlowerW8A16Status
// (w8a16_sm90.h), initialize and launch on the caller's stream. Included after CUTLASS's gemm and epilogue headers.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"

#include "w8a16_sm90.h"

#define QLOWER_CAT2(a, b) a##b
#define QLOWER_CAT(a, b) QLOWER_CAT2(a, b)

namespace qlower_cutlass {

#if QLOWER_PINGPONG
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
#else
using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
#endif

#if QLOWER_STREAMK
using TileScheduler = cutlass::gemm::StreamKScheduler;
#else
using TileScheduler = cutlass::gemm::PersistentScheduler;
#endif

// A null `workspace` with a workspace needed, or `*workspace_bytes` too small: `*workspace_bytes` gets the size
// and the call returns QLOWER_W8A16_NEEDS_WORKSPACE (the caller allocates and calls again).
template <class Gemm>
int run(typename Gemm::Arguments const& args, void* workspace, int64_t* workspace_bytes, void* stream) {
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
    return QLOWER_W8A16_CANNOT_IMPLEMENT;
  }
  size_t const need = Gemm::get_workspace_size(args);
  if ((workspace == nullptr && need > 0) || *workspace_bytes < int64_t(need)) {
    *workspace_bytes = int64_t(need);
    return QLOWER_W8A16_NEEDS_WORKSPACE;
  }
  auto const s = static_cast<cudaStream_t>(stream);
  if (gemm.initialize(args, workspace, s) != cutlass::Status::kSuccess) {
    return QLOWER_W8A16_INIT_FAILED;
  }
  if (gemm.run(s) != cutlass::Status::kSuccess) {
    return QLOWER_W8A16_LAUNCH_FAILED;
  }
  return cudaGetLastError() == cudaSuccess ? QLOWER_W8A16_OK : QLOWER_W8A16_LAUNCH_FAILED;
}

}  // namespace qlower_cutlass
