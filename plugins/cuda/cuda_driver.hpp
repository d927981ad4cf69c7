// The CUDA driver as this plugin sees it: a library opened at run time (the
// plugin has no link-time dependency on libcuda), every entry point looked up
// by the versioned symbol the driver exports, and CUDA errors turned into a
// Failure that names the call, its arguments and the driver's own words.
#pragma once

#include <cuda.h>

#include <plugin_support.hpp>

#include <string>

// cuda.h maps these names to _ptsz variants under per-thread default
// streams; dlsym would then look up a different function than the one whose
// type is declared below.
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error "the CUDA plugin uses the legacy default-stream entry points"
#endif

namespace devalloc::cuda {

// Every driver function the plugin calls, spelled as the symbol the driver
// exports. cuda.h renames plain names with macros (cuMemAlloc is
// cuMemAlloc_v2); dlsym sees no macros, so the versioned names are written
// out, and each pointer's type is decltype of that same declaration.
#define DEVALLOC_CUDA_ENTRY_POINTS(X) \
  X(cuGetErrorName)                   \
  X(cuGetErrorString)                 \
  X(cuInit)                           \
  X(cuDeviceGetCount)                 \
  X(cuDeviceGet)                      \
  X(cuDeviceGetName)                  \
  X(cuDeviceTotalMem_v2)              \
  X(cuDeviceGetUuid_v2)               \
  X(cuDeviceGetPCIBusId)              \
  X(cuDevicePrimaryCtxRetain)         \
  X(cuDevicePrimaryCtxRelease_v2)     \
  X(cuCtxPushCurrent_v2)              \
  X(cuCtxPopCurrent_v2)               \
  X(cuStreamCreate)                   \
  X(cuStreamDestroy_v2)               \
  X(cuStreamSynchronize)              \
  X(cuLaunchHostFunc)                 \
  X(cuMemAlloc_v2)                    \
  X(cuMemFree_v2)                     \
  X(cuMemcpyHtoDAsync_v2)             \
  X(cuMemcpyDtoHAsync_v2)             \
  X(cuMemHostAlloc)                   \
  X(cuMemFreeHost)

class Driver {
 public:
  // Opens `library` and looks up every entry point. Throws Failure
  // (RUNTIME_UNAVAILABLE) with the dlerror text when either fails.
  explicit Driver(const std::string& library);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
  std::string describe(CUresult result) const;

  // Each throws Failure unless result is CUDA_SUCCESS, with the message
  // "<call> failed: <describe(result)>", the call printf-formatted. They
  // differ in the status, which follows what the ABI function that makes
  // the call may return:
  // - check: DEVICE_ERROR (create() turns whatever fails in it into
  //   RUNTIME_UNAVAILABLE).
  void check(CUresult result, const char* call_format, ...) const
      __attribute__((format(printf, 3, 4)));
  // - check_allocation: OUT_OF_DEVICE_MEMORY for CUDA_ERROR_OUT_OF_MEMORY.
  void check_allocation(CUresult result, const char* call_format, ...) const
      __attribute__((format(printf, 3, 4)));
  // - check_host_allocation: OUT_OF_HOST_MEMORY for CUDA_ERROR_OUT_OF_MEMORY.
  void check_host_allocation(CUresult result, const char* call_format,
                             ...) const __attribute__((format(printf, 3, 4)));

#define DEVALLOC_CUDA_DECLARE_ENTRY_POINT(name) \
  decltype(&::name) name = nullptr;
  DEVALLOC_CUDA_ENTRY_POINTS(DEVALLOC_CUDA_DECLARE_ENTRY_POINT)
#undef DEVALLOC_CUDA_DECLARE_ENTRY_POINT

 private:
  [[noreturn]] void raise(CUresult result, devalloc_status status,
                          std::string call) const;

  void* handle_ = nullptr;
};

using plugin::format;

}  // namespace devalloc::cuda
