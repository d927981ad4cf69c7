#include "ze_runtime.hpp"

#include <dlfcn.h>

#include <cinttypes>
#include <cstdarg>
#include <cstdio>

namespace devalloc::level_zero {

std::string result_name(ze_result_t result) {
  switch (result) {
#define DEVALLOC_ZE_RESULT(name) \
  case name:                     \
    return #name;
    DEVALLOC_ZE_RESULT(ZE_RESULT_SUCCESS)
    DEVALLOC_ZE_RESULT(ZE_RESULT_NOT_READY)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_DEVICE_LOST)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_NOT_AVAILABLE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNINITIALIZED)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNSUPPORTED_VERSION)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INVALID_ARGUMENT)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INVALID_NULL_POINTER)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INVALID_SIZE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_INVALID_ENUMERATION)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_OVERLAPPING_REGIONS)
    DEVALLOC_ZE_RESULT(ZE_RESULT_ERROR_UNKNOWN)
#undef DEVALLOC_ZE_RESULT
    default:
      return plugin::format("ze_result_t 0x%x", static_cast<unsigned>(result));
  }
}

// RTLD_NODELETE: the loader keeps its drivers (and their threads) once zeInit
// ran, and Level Zero has no call that undoes zeInit.
Runtime::Runtime(const std::string& path) : library(path, "the Level Zero loader", RTLD_NODELETE) {
  DEVALLOC_ZE_ENTRY_POINTS(DEVALLOC_KIT_BIND_ENTRY_POINT)
}

std::string RelaxedLimits::describe() const {
  if (!needed()) return {};
  return plugin::format(", with relaxed limits: maxMemAllocSize = %" PRIu64, max_allocation_);
}

void Runtime::check(ze_result_t result, plugin::CallKind kind, const char* call_format, ...) const {
  if (result == ZE_RESULT_SUCCESS) return;
  // An allocation refused for its size is one that cannot be satisfied
  // (PLUGIN-11), like one beyond the free memory.
  const bool too_large = result == ZE_RESULT_ERROR_UNSUPPORTED_SIZE &&
                         kind != plugin::CallKind::work;
  const bool out_of_memory = result == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY ||
                             result == ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY || too_large;
  std::string reason = result_name(result);
  if (too_large) reason += " (the driver makes no single allocation of this size)";
  va_list args;
  va_start(args, call_format);
  std::string call = plugin::vformat(call_format, args);
  va_end(args);
  plugin::raise_vendor_failure(kind, out_of_memory, reason, std::move(call));
}

}  // namespace devalloc::level_zero
