// C++ kernels of qlower's ops that reach AOTInductor packages, on any device (they call aten ops only).
// Built twice: with QLOWER_KERNEL_ONLY into each device's shim library, whose shims call these functions
// directly (cpp_build.DIRECT_KERNELS), so a package runs them from its own wrapper with no qlower op
// registered (tests/integrations/aoti/test_aoti_portable.py); and into libqlower_ops.so, which registers them under `qlower`
// for the proxy executor and C++ deployments (schemas generated from the Python registrations in
// lowerings/kernels/custom_ops.py, lowerings/aoti/build.py). Each kernel must compute exactly what its Python
// implementation computes (tests/integrations/aoti/test_aoti_export.py::test_package_runs_without_qlower_python_on_the_cpp_ops_library).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/_weight_int8pack_mm.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

namespace qlower {

// x [M, K] @ (w_nk int8 [N, K] * scale [N]).T: the packed kernel up to max_m_packed rows, dequant + GEMM above.
at::Tensor woq_int8_mm_by_m(const at::Tensor& x, const at::Tensor& w_nk, const at::Tensor& scale,
                            int64_t max_m_packed) {
  const int64_t m = x.size(0);
  if (m == 0) {
    return x.new_empty({0, w_nk.size(0)});
  }
  if (m <= max_m_packed) {
    return at::_weight_int8pack_mm(x.contiguous(), w_nk.contiguous(), scale.contiguous());
  }
  return at::mm(x, w_nk.to(x.scalar_type()).t()).mul(scale);  // as the Python kernel: mm, then scale
}

// x int8 [M, K] @ w_nk int8 [N, K].T -> int32, zero-padding M up to min_m for kernels that need it.
at::Tensor int8_mm_min_m(const at::Tensor& x, const at::Tensor& w_nk, int64_t min_m) {
  const int64_t m = x.size(0);
  if (m >= min_m) {
    return at::_int_mm(x, w_nk.t());
  }
  const at::Tensor padded = at::constant_pad_nd(x, {0, 0, 0, min_m - m}, 0);
  return at::_int_mm(padded, w_nk.t()).slice(0, 0, m);
}

// The bytes of an 8-bit tensor of a dtype generated code cannot name (fp4x2, e8m0), as uint8.
at::Tensor mx_bytes(const at::Tensor& t) {
  return t.view(at::kByte).clone();
}

}  // namespace qlower

#if !defined(QLOWER_KERNEL_ONLY)
TORCH_LIBRARY_IMPL(qlower, CompositeExplicitAutograd, m) {
  m.impl("woq_int8_mm_by_m", TORCH_FN(qlower::woq_int8_mm_by_m));
  m.impl("int8_mm_min_m", TORCH_FN(qlower::int8_mm_min_m));
  m.impl("mx_bytes", TORCH_FN(qlower::mx_bytes));
}
#endif
