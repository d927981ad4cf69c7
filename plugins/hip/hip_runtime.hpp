// The HIP runtime as this plugin sees it: libamdhip64 opened at run time
// (no link-time dependency, so the plugin loads where ROCm is missing), its
// entry points typed here rather than by decltype (the header overloads
// hipMalloc and hipHostMalloc with C++ templates), and HIP errors turned
// into a Failure that names the call, its arguments and hipGetErrorName.
// Only calls whose signatures have been stable across ROCm releases:
// no hipDeviceProp_t, whose layout changes between versions.
#pragma once

#include <hip/hip_runtime_api.h>

#include <devalloc/plugin_kit/runtime_calls.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>

#include <string>
#include <type_traits>
#include <vector>

namespace devalloc::hip {

#define DEVALLOC_HIP_ENTRY_POINTS(X)                                              \
  X(hipGetErrorName, const char*(hipError_t))                                 \
  X(hipGetErrorString, const char*(hipError_t))                               \
  X(hipGetDeviceCount, hipError_t(int*))                                      \
  X(hipGetDevice, hipError_t(int*))                                           \
  X(hipSetDevice, hipError_t(int))                                            \
  X(hipDeviceGetName, hipError_t(char*, int, hipDevice_t))                    \
  X(hipDeviceTotalMem, hipError_t(size_t*, hipDevice_t))                      \
  X(hipDeviceGetUuid, hipError_t(hipUUID*, hipDevice_t))                      \
  X(hipDeviceGetPCIBusId, hipError_t(char*, int, int))                        \
  X(hipMemGetInfo, hipError_t(size_t*, size_t*))                              \
  X(hipStreamCreateWithFlags, hipError_t(hipStream_t*, unsigned int))         \
  X(hipStreamDestroy, hipError_t(hipStream_t))                                \
  X(hipStreamSynchronize, hipError_t(hipStream_t))                            \
  X(hipStreamQuery, hipError_t(hipStream_t))                                  \
  X(hipStreamAddCallback,                                                         \
    hipError_t(hipStream_t, hipStreamCallback_t, void*, unsigned int))        \
  X(hipMalloc, hipError_t(void**, size_t))                                    \
  X(hipFree, hipError_t(void*))                                               \
  X(hipMemcpyHtoDAsync, hipError_t(hipDeviceptr_t, void*, size_t, hipStream_t)) \
  X(hipMemcpyDtoHAsync, hipError_t(void*, hipDeviceptr_t, size_t, hipStream_t)) \
  X(hipHostMalloc, hipError_t(void**, size_t, unsigned int))                  \
  X(hipHostFree, hipError_t(void*))

// check() (runtime_calls.hpp) turns a failed call into a Failure.
class Runtime
    : public plugin::CheckedRuntime<Runtime, hipError_t, hipSuccess, hipErrorOutOfMemory> {
 public:
  // Opens the first of `libraries` that dlopen opens and looks up every
  // entry point. Throws Failure (RUNTIME_UNAVAILABLE) with the dlerror text
  // of each library tried, or naming a missing entry point.
  explicit Runtime(const std::vector<std::string>& libraries);

  // "hipErrorOutOfMemory (out of memory)"
  std::string describe(hipError_t result) const;

 private:
  plugin::RuntimeLibrary library_;

 public:
#define DEVALLOC_HIP_DECLARE(name, signature) std::add_pointer_t<signature> name = nullptr;
  DEVALLOC_HIP_ENTRY_POINTS(DEVALLOC_HIP_DECLARE)
#undef DEVALLOC_HIP_DECLARE
};

}  // namespace devalloc::hip
