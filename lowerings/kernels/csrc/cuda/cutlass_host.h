// The host side shared by the C++ kernels of qlower's CUTLASS ops (woq_int8_cutlass.cpp, mxfp4_cutlass.cpp), the
// functions their AOTInductor C shims call: the current stream, the GPU's name and multiprocessor count, the
// operand copies into the kernels' layout and the run with its workspace. Python processes do the same through
// lowerings/kernels/cutlass/w8a16.py (`rows_ok`, `aligned_vector`, `run_entry`, `sm_count`).
//
// No CUDA header and no link-time dependency on torch_cuda or the driver: the stream comes from AOTInductor's
// C ABI (`aoti_torch_get_current_cuda_stream`, in the libtorch_cuda any CUDA process running a package has
// loaded), the GPU's name and multiprocessor count from the driver (libcuda.so.1), both looked up at the first
// call. The library's objects call the CUDA runtime, which the shim library links (libcudart, resolved to the
// one torch loaded: cutlass/build.py, `cudart_link_flags`).
#pragma once

#include <ATen/ATen.h>
#include <dlfcn.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "w8a16_sm90.h"

namespace qlower {
namespace cutlass_host {

using CurrentStreamFn = int32_t (*)(int32_t device_index, void** ret_stream);
using DeviceGetNameFn = int (*)(char* name, int len, int device);
using DeviceGetAttributeFn = int (*)(int* value, int attribute, int device);

// `symbol` of a loaded library (matched by soname), else of the process's global scope, else nullptr;
// `load`: open the library when no one has yet (the driver, present wherever CUDA runs).
inline void* find_symbol(const char* library, const char* symbol, bool load) {
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
  TORCH_CHECK(found != nullptr, "qlower CUTLASS ops: ", symbol, " not found (", library,
              " is not loaded in this process)");
  return reinterpret_cast<Fn>(found);
}

// The stream AOTInductor runs the package on for `device`.
inline void* current_stream(int device, const char* op) {
  static const CurrentStreamFn fn =
      required_symbol<CurrentStreamFn>("libtorch_cuda.so", "aoti_torch_get_current_cuda_stream", false);
  void* stream = nullptr;
  TORCH_CHECK(fn(device, &stream) == 0, op, "no current CUDA stream");
  return stream;
}

constexpr int kMaxDevices = 64;
constexpr int kAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT

struct DeviceFacts {
  std::string name;
  int sm_count = 0;
};

// The name (the tuned tables' key, `torch.cuda.get_device_name`) and multiprocessor count of GPU `index`.
inline const DeviceFacts& device_facts(int index) {
  static DeviceFacts facts[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "qlower CUTLASS ops: CUDA device index ", index);
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

// The library's status codes (QlowerW8A16Status, shared by every entry point) in words.
inline const char* status_text(int status) {
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

// w8a16.py's rows_ok: unit stride along K, 16-byte row stride and address; copied otherwise.
inline at::Tensor rows_ok(const at::Tensor& t) {
  const bool ok = t.stride(-1) == 1 && (t.stride(0) * t.element_size()) % 16 == 0 &&
                  reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 16 == 0;
  return ok ? t : t.contiguous();
}

// w8a16.py's aligned_vector: a contiguous 1-D vector at a 16-byte address (the epilogue's vector loads).
inline at::Tensor aligned_vector(const at::Tensor& t) {
  at::Tensor v = t.reshape({-1});
  const bool ok = v.is_contiguous() && reinterpret_cast<std::uintptr_t>(v.data_ptr()) % 16 == 0;
  return ok ? v : v.clone();
}

// The fields both libraries' argument structs share (QlowerW8A16Args, QlowerMxfp4Args), for the GEMM
// out[M, N] = x[M, K] @ w.T on `device`'s current stream with `splits` (stream-K split count, 0: CUTLASS's own);
// the caller fills the rest (the scales, the dtype).
template <typename Args>
void fill_common(Args& args, const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                 const at::Tensor& out, int64_t n, int64_t k, int32_t splits, int device, int sm_count,
                 const char* op) {
  args.x = x.data_ptr();
  args.w = w.data_ptr();
  args.bias = bias.has_value() ? bias->data_ptr() : nullptr;
  args.out = out.data_ptr();
  args.workspace = nullptr;
  args.stream = current_stream(device, op);
  args.m = x.size(0);
  args.n = n;
  args.k = k;
  args.ldx = x.stride(0);
  args.ldw = w.stride(0);
  args.ldout = out.stride(0);
  args.workspace_bytes = 0;
  args.splits = splits;
  args.device = device;
  args.sm_count = sm_count;
}

// w8a16.py's run_entry: run `entry` on `args`; when it asks for a workspace, allocate one on `like`'s device
// (kept alive until the launch is queued: the caching allocator orders its reuse on the stream) and run again.
template <typename Args>
int run_with_workspace(int (*entry)(Args*), Args* args, const at::Tensor& like) {
  int status = entry(args);
  at::Tensor workspace;
  if (status == QLOWER_W8A16_NEEDS_WORKSPACE) {
    workspace = at::empty({args->workspace_bytes}, like.options().dtype(at::kByte));
    args->workspace = workspace.data_ptr();
    status = entry(args);
  }
  return status;
}

}  // namespace cutlass_host
}  // namespace qlower
