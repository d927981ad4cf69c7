// The Level Zero loader as this plugin sees it: a library opened at run time
// (no link-time dependency on libze_loader), each API function looked up by
// name, and every ze_result_t other than success turned into a Failure that
// names the call, its arguments and the result's symbolic name.
#pragma once

#include <level_zero/ze_api.h>

#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/runtime_library.hpp>
#include <string>

namespace devalloc::level_zero {

#define DEVALLOC_ZE_ENTRY_POINTS(X)         \
  X(zeInit)                                 \
  X(zeDriverGet)                            \
  X(zeDeviceGet)                            \
  X(zeDeviceGetProperties)                  \
  X(zeDeviceGetStatus)                      \
  X(zeDeviceGetMemoryProperties)            \
  X(zeDeviceGetCommandQueueGroupProperties) \
  X(zeDevicePciGetPropertiesExt)            \
  X(zeContextCreate)                        \
  X(zeContextDestroy)                       \
  X(zeCommandListCreateImmediate)           \
  X(zeCommandListDestroy)                   \
  X(zeCommandListAppendMemoryCopy)          \
  X(zeCommandListAppendBarrier)             \
  X(zeEventPoolCreate)                      \
  X(zeEventPoolDestroy)                     \
  X(zeEventCreate)                          \
  X(zeEventDestroy)                         \
  X(zeEventHostSynchronize)                 \
  X(zeEventQueryStatus)                     \
  X(zeEventHostReset)                       \
  X(zeMemAllocDevice)                       \
  X(zeMemAllocHost)                         \
  X(zeMemFree)

// "ZE_RESULT_ERROR_DEVICE_LOST", or "ze_result_t 0x..." for a code this
// plugin does not know.
std::string result_name(ze_result_t result);

// What an allocation of `nbytes` chains to its descriptor: nothing below
// maxMemAllocSize, else ze_relaxed_allocation_limits_exp_desc_t with
// ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE. zeMemAllocDevice and
// zeMemAllocHost take only sizes less than maxMemAllocSize without it, and
// that is a fraction of the memory of many Intel GPUs (often 4 GiB).
class RelaxedLimits {
 public:
  RelaxedLimits(uint64_t nbytes, uint64_t max_allocation)
      : nbytes_(nbytes), max_allocation_(max_allocation) {
    desc_.stype = ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC;
    desc_.flags = ZE_RELAXED_ALLOCATION_LIMITS_EXP_FLAG_MAX_SIZE;
  }
  RelaxedLimits(const RelaxedLimits&) = delete;
  RelaxedLimits& operator=(const RelaxedLimits&) = delete;

  bool needed() const { return nbytes_ >= max_allocation_; }
  // For the descriptor's pNext: this object, which must outlive the call.
  const void* chain() const { return needed() ? &desc_ : nullptr; }
  // For the message of a failed call: "" or ", with relaxed limits:
  // maxMemAllocSize = N".
  std::string describe() const;

 private:
  uint64_t nbytes_;
  uint64_t max_allocation_;
  ze_relaxed_allocation_limits_exp_desc_t desc_ = {};
};

class Runtime {
 public:
  // Opens `path` and looks up every entry point. Throws Failure
  // (RUNTIME_UNAVAILABLE) with the dlerror text when either fails.
  explicit Runtime(const std::string& path);

  // Throws Failure unless result is ZE_RESULT_SUCCESS, with the message
  // "<call> failed: <result_name>", the call printf-formatted; the status
  // follows from kind (plugin::status_of_failed_call).
  void check(ze_result_t result, plugin::CallKind kind, const char* call_format, ...) const
      __attribute__((format(printf, 4, 5)));

  // First, so that the entry points below are bound after it is open.
  plugin::RuntimeLibrary library;
  DEVALLOC_ZE_ENTRY_POINTS(DEVALLOC_KIT_DECLARE_ENTRY_POINT)
};

}  // namespace devalloc::level_zero
