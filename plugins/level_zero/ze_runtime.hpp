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
  X(zeEventHostReset)                       \
  X(zeMemAllocDevice)                       \
  X(zeMemAllocHost)                         \
  X(zeMemFree)

// "ZE_RESULT_ERROR_DEVICE_LOST", or "ze_result_t 0x..." for a code this
// plugin does not know.
std::string result_name(ze_result_t result);

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
