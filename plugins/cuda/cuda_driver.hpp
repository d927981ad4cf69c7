// The CUDA driver as this plugin sees it: a library opened at run time (the
// plugin has no link-time dependency on libcuda), every entry point looked
// up by the versioned symbol the driver exports, and CUDA errors turned into
// a Failure that names the call, its arguments and the driver's own words.
#pragma once

#include <cuda.h>

#include <devalloc/plugin_kit/runtime_calls.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>

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
  X(cuMemGetInfo_v2)                  \
  X(cuStreamCreate)                   \
  X(cuStreamDestroy_v2)               \
  X(cuStreamSynchronize)              \
  X(cuStreamQuery)                    \
  X(cuLaunchHostFunc)                 \
  X(cuMemAlloc_v2)                    \
  X(cuMemFree_v2)                     \
  X(cuMemcpyHtoDAsync_v2)             \
  X(cuMemcpyDtoHAsync_v2)             \
  X(cuMemHostAlloc)                   \
  X(cuMemFreeHost)

// check() (runtime_calls.hpp) turns a failed call into a Failure.
class Driver
    : public plugin::CheckedRuntime<Driver, CUresult, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY> {
 public:
  // Opens `library` and looks up every entry point. Throws Failure
  // (RUNTIME_UNAVAILABLE) with the dlerror text when either fails.
  explicit Driver(const std::string& library);

  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
  std::string describe(CUresult result) const;

 private:
  plugin::RuntimeLibrary library;

 public:
  DEVALLOC_CUDA_ENTRY_POINTS(DEVALLOC_KIT_DECLARE_ENTRY_POINT)
};

}  // namespace devalloc::cuda
