// qlower::woq_int8_cutlass in C++: the kernel the op's AOTInductor C shim calls, compiled with the shim into the
// CUDA CUTLASS shim library together with the library's objects, so a package runs the GEMM from its own wrapper
// (lowerings/aoti/build.py, `separate_shim_library`). Python processes run the op through
// lowerings/kernels/cutlass/w8a16.py; both do the same per call: the operand checks, the copies into the
// kernel's layout, the configuration of the tuned table (qlower_cutlass_choices.h, generated from
// cutlass/configs.py), the workspace query, the launch on the current stream.
//
// The host side (stream, GPU facts, operand copies, workspace) is cutlass_host.h's, shared with
// mxfp4_cutlass.cpp.

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "cutlass_host.h"
#include "qlower_cutlass_choices.h"
#include "qlower_cutlass_entries.h"

namespace qlower {
namespace {

constexpr int64_t kKMultiple = 16, kNMultiple = 8;  // cutlass/configs.py K_MULTIPLE, N_MULTIPLE

}  // namespace

// x [M, K] @ (w [N, K] int8).T * scale ([N] or [1]) + bias [N], in x's dtype (bf16/fp16), on sm_90a.
at::Tensor woq_int8_cutlass(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                            const std::optional<at::Tensor>& bias) {
  const char* op = "qlower::woq_int8_cutlass: ";
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf, op, "x dtype ",
              x.scalar_type(), " (the kernel takes bf16/fp16)");
  TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 2 && x.dim() == 2, op,
              "x or w is not 2-D, or w is not int8");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  TORCH_CHECK(w.size(1) == k, op, "x has K=", k, " but w has K=", w.size(1));
  TORCH_CHECK(k % kKMultiple == 0 && n % kNMultiple == 0, op, "needs K % ", kKMultiple, " == 0 and N % ",
              kNMultiple, " == 0 (K=", k, ", N=", n, ")");
  TORCH_CHECK(scale.scalar_type() == x.scalar_type() && (scale.numel() == 1 || scale.numel() == n), op,
              "scale of ", scale.numel(), " ", scale.scalar_type(), " values (needs ", n, " or 1 of x's dtype)");
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->numel() == n, op, "bias of ", bias->numel(),
                " ", bias->scalar_type(), " values (needs ", n, " of x's dtype)");
  }
  at::Tensor out = at::empty({m, n}, x.options());
  if (m == 0) {
    return out;
  }
  if (k == 0) {
    return bias.has_value() ? out.copy_(bias->reshape({1, n}).expand({m, n})) : out.zero_();
  }
  using namespace cutlass_host;
  const at::Tensor xr = rows_ok(x), wr = rows_ok(w), s = aligned_vector(scale);
  const std::optional<at::Tensor> b = bias.has_value() ? std::optional<at::Tensor>(aligned_vector(*bias))
                                                       : std::nullopt;
  const int device = x.get_device();
  const DeviceFacts& facts = device_facts(device);
  const qlower_cutlass::Choice choice = qlower_cutlass::choose(facts.name.c_str(), m, n, k);

  QlowerW8A16Args args{};
  fill_common(args, xr, wr, b, out, n, k, choice.splits, device, facts.sm_count, op);
  args.scale = s.data_ptr();
  args.dtype = x.scalar_type() == at::kBFloat16 ? QLOWER_W8A16_BF16 : QLOWER_W8A16_FP16;
  args.scale_per_channel = scale.numel() != 1;

  const qlower_cutlass::Entry entry = qlower_cutlass::kEntries[choice.config];
  const int status = run_with_workspace(entry, &args, x);
  TORCH_CHECK(status == QLOWER_W8A16_OK, op, status_text(status), " (configuration ",
              qlower_cutlass::kConfigNames[choice.config], ", M=", m, ", N=", n, ", K=", k, ", x ",
              x.scalar_type(), ")");
  return out;
}

}  // namespace qlower
