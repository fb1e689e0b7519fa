// qlower::mxfp4_cutlass in C++: the kernel the op's AOTInductor C shim calls, compiled with the shim into the
// CUDA CUTLASS shim library together with the library's objects (lowerings/aoti/build.py,
// `separate_shim_library`). Python processes run the op through lowerings/kernels/cutlass/mxfp4.py; both do the
// same per call: the operand checks (mxfp4.py `operand_blocker`), the copies into the kernel's layout, the
// configuration (`mxfp4.choose`, generated as qlower_cutlass_mxfp4.h), the workspace query, the launch on the
// current stream. The host side is cutlass_host.h's, shared with woq_int8_cutlass.cpp.

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "cutlass_host.h"
#include "qlower_cutlass_mxfp4.h"

namespace qlower {
namespace {

constexpr int64_t kBlock = 32, kNMultiple = 8;  // MX block; cutlass/configs.py MXFP4_N_MULTIPLE

}  // namespace

// x [M, K] bf16 @ dequant(w [N, K/2] e2m1 codes, scales [K/128, N, 4] bf16).T + bias [N] -> [M, N] bf16, on
// sm_90a.
at::Tensor mxfp4_cutlass(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                         const std::optional<at::Tensor>& bias) {
  const char* op = "qlower::mxfp4_cutlass: ";
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, op, "x is ", x.scalar_type(), " ", x.dim(),
              "-D (the kernel takes 2-D bf16)");
  TORCH_CHECK(w.scalar_type() == at::kByte && w.dim() == 2, op, "w is ", w.scalar_type(), " ", w.dim(),
              "-D (the kernel takes [N, K/2] uint8 e2m1 codes)");
  const int64_t m = x.size(0), n = w.size(0), k = 2 * w.size(1);
  TORCH_CHECK(x.size(1) == k, op, "x has K=", x.size(1), ", w holds ", k);
  TORCH_CHECK(k % QLOWER_MXFP4_TILE_K == 0 && n % kNMultiple == 0 && n > 0, op, "needs K % ",
              QLOWER_MXFP4_TILE_K, " == 0 and N % ", kNMultiple, " == 0 (K=", k, ", N=", n, ")");
  const int64_t tiles = k / QLOWER_MXFP4_TILE_K, per_tile = QLOWER_MXFP4_TILE_K / kBlock;
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.dim() == 3 && scales.size(0) == tiles &&
                  scales.size(1) == n && scales.size(2) == per_tile,
              op, "scales ", scales.sizes(), " ", scales.scalar_type(), " (needs [", tiles, ", ", n, ", ",
              per_tile, "] bf16)");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == n, op, "bias of ", bias->numel(), " ",
                bias->scalar_type(), " values (needs ", n, " bf16)");
  }
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0) {
    return out;
  }
  if (k == 0) {  // an empty K: the bias alone, as the Python op
    return bias.has_value() ? out.copy_(bias->reshape({1, n}).expand({m, n})) : out.zero_();
  }
  using namespace cutlass_host;
  const at::Tensor xr = rows_ok(x), wr = rows_ok(w), sc = scales.contiguous();
  const std::optional<at::Tensor> b = bias.has_value() ? std::optional<at::Tensor>(aligned_vector(*bias))
                                                       : std::nullopt;
  const int device = x.get_device();
  const DeviceFacts& facts = device_facts(device);
  const qlower_cutlass_mxfp4::Choice choice = qlower_cutlass_mxfp4::choose(m, n, k);

  QlowerMxfp4Args args{};
  fill_common(args, xr, wr, b, out, n, k, choice.splits, device, facts.sm_count, op);
  args.scales = sc.data_ptr();

  const int status = run_with_workspace(qlower_cutlass_mxfp4::entry(choice.config), &args, x);
  TORCH_CHECK(status == QLOWER_W8A16_OK, op, status_text(status), " (configuration ",
              qlower_cutlass_mxfp4::kConfigNames[choice.config], ", M=", m, ", N=", n, ", K=", k, ")");
  return out;
}

}  // namespace qlower
