// qlower::woq_int8_cutlass in C++: the kernel the op's AOTInductor C shim calls, compiled with the shim into a
// library of its own together with w8a16_sm90.cu's objects, so a package runs the GEMM from its own wrapper
// (lowerings/aoti/build.py, `separate_shim_library`). Python processes run the op through
// lowerings/kernels/cutlass/w8a16.py; both do the same per call: the operand checks, the copies into the
// kernel's layout, the configuration of the tuned table (qlower_cutlass_choices.h, generated from
// cutlass/configs.py), the workspace query, the launch on the current stream.
//
// No CUDA header and no link-time dependency on torch_cuda or the driver: the stream comes from AOTInductor's
// C ABI (`aoti_torch_get_current_cuda_stream`, in the libtorch_cuda any CUDA process running a package has
// loaded), the GPU's name and multiprocessor count from the driver (libcuda.so.1), both looked up at the first
// call. The library's objects call the CUDA runtime, which the shim library links (libcudart, resolved to the
// one torch loaded: cutlass/build.py, `cudart_link_flags`).

#include <ATen/ATen.h>
#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "qlower_cutlass_choices.h"
#include "qlower_cutlass_entries.h"

namespace qlower {
namespace {

using CurrentStreamFn = int32_t (*)(int32_t device_index, void** ret_stream);
using DeviceGetNameFn = int (*)(char* name, int len, int device);
using DeviceGetAttributeFn = int (*)(int* value, int attribute, int device);

// `symbol` of a loaded library (matched by soname), else of the process's global scope, else nullptr;
// `load`: open the library when no one has yet (the driver, present wherever CUDA runs).
void* find_symbol(const char* library, const char* symbol, bool load) {
  void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr && load) {
    handle = dlopen(library, RTLD_LAZY);
  }
  void* found = handle != nullptr ? dlsym(handle, symbol) : nullptr;
  return found != nullptr ? found : dlsym(RTLD_DEFAULT, symbol);
}

template <typename Fn>
Fn required_symbol(const char* library, const char* symbol, bool load) {
  void* found = find_symbol(library, symbol, load);
  TORCH_CHECK(found != nullptr, "qlower::woq_int8_cutlass: ", symbol, " not found (", library,
              " is not loaded in this process)");
  return reinterpret_cast<Fn>(found);
}

CurrentStreamFn current_stream_fn() {
  static const CurrentStreamFn fn =
      required_symbol<CurrentStreamFn>("libtorch_cuda.so", "aoti_torch_get_current_cuda_stream", false);
  return fn;
}

constexpr int kMaxDevices = 64;
constexpr int kAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int64_t kKMultiple = 16, kNMultiple = 8;  // cutlass/configs.py K_MULTIPLE, N_MULTIPLE

struct DeviceFacts {
  std::string name;
  int sm_count = 0;
};

const DeviceFacts& device_facts(int index) {
  static DeviceFacts facts[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "qlower::woq_int8_cutlass: CUDA device index ", index);
  std::call_once(once[index], [index] {
    const auto get_name = required_symbol<DeviceGetNameFn>("libcuda.so.1", "cuDeviceGetName", true);
    const auto get_attribute =
        required_symbol<DeviceGetAttributeFn>("libcuda.so.1", "cuDeviceGetAttribute", true);
    char name[256] = {0};
    if (get_name(name, sizeof(name) - 1, index) == 0) {
      facts[index].name = name;
    }
    int sms = 0;
    if (get_attribute(&sms, kAttributeMultiprocessorCount, index) == 0) {
      facts[index].sm_count = sms;
    }
  });
  return facts[index];
}

const char* status_text(int status) {
  switch (status) {
    case QLOWER_W8A16_CANNOT_IMPLEMENT:
      return "CUTLASS's can_implement refused the problem (shape, stride or alignment)";
    case QLOWER_W8A16_INIT_FAILED:
      return "CUTLASS's initialize failed";
    case QLOWER_W8A16_LAUNCH_FAILED:
      return "the launch failed";
    case QLOWER_W8A16_BAD_DTYPE:
      return "unsupported dtype";
    case QLOWER_W8A16_NOT_BUILT_FOR_SM90A:
      return "the library was not built for sm_90a";
    default:
      return "unknown status";
  }
}

// w8a16.py's _rows_ok: unit stride along K, 16-byte row stride and address; copied otherwise.
at::Tensor rows_ok(const at::Tensor& t) {
  const bool ok = t.stride(-1) == 1 && (t.stride(0) * t.element_size()) % 16 == 0 &&
                  reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? t : t.contiguous();
}

// w8a16.py's _aligned_vector: a contiguous 1-D vector at a 16-byte address (the epilogue's vector loads).
at::Tensor aligned_vector(const at::Tensor& t) {
  at::Tensor v = t.reshape({-1});
  const bool ok = v.is_contiguous() && reinterpret_cast<std::uintptr_t>(v.data_ptr()) % 16 == 0;
  return ok ? v : v.clone();
}

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
  const at::Tensor xr = rows_ok(x), wr = rows_ok(w), s = aligned_vector(scale);
  const std::optional<at::Tensor> b = bias.has_value() ? std::optional<at::Tensor>(aligned_vector(*bias))
                                                       : std::nullopt;
  const int device = x.get_device();
  const DeviceFacts& facts = device_facts(device);
  const qlower_cutlass::Choice choice = qlower_cutlass::choose(facts.name.c_str(), m, n, k);
  void* stream = nullptr;
  TORCH_CHECK(current_stream_fn()(device, &stream) == 0, op, "no current CUDA stream");

  QlowerW8A16Args args{};
  args.x = xr.data_ptr();
  args.w = wr.data_ptr();
  args.scale = s.data_ptr();
  args.bias = b.has_value() ? b->data_ptr() : nullptr;
  args.out = out.data_ptr();
  args.workspace = nullptr;
  args.stream = stream;
  args.m = m;
  args.n = n;
  args.k = k;
  args.ldx = xr.stride(0);
  args.ldw = wr.stride(0);
  args.ldout = out.stride(0);
  args.workspace_bytes = 0;
  args.dtype = x.scalar_type() == at::kBFloat16 ? QLOWER_W8A16_BF16 : QLOWER_W8A16_FP16;
  args.scale_per_channel = scale.numel() != 1;
  args.splits = choice.splits;
  args.device = device;
  args.sm_count = facts.sm_count;

  const qlower_cutlass::Entry entry = qlower_cutlass::kEntries[choice.config];
  int status = entry(&args);
  at::Tensor workspace;
  if (status == QLOWER_W8A16_NEEDS_WORKSPACE) {
    workspace = at::empty({args.workspace_bytes}, x.options().dtype(at::kByte));
    args.workspace = workspace.data_ptr();
    status = entry(&args);
  }
  TORCH_CHECK(status == QLOWER_W8A16_OK, op, status_text(status), " (configuration ",
              qlower_cutlass::kConfigNames[choice.config], ", M=", m, ", N=", n, ", K=", k, ", x ",
              x.scalar_type(), ")");
  return out;
}

}  // namespace qlower
