#include "hip_runtime.hpp"

#include <dlfcn.h>

#include <cstdarg>

namespace devalloc::hip {

// RTLD_NODELETE: once initialized, the HIP runtime (and ROCr below it)
// keeps threads of its own; unmapping its code under them would crash the
// process. It stays loaded, and a later create() finds it initialized.
Runtime::Runtime(const std::vector<std::string>& libraries)
    : library_(libraries, "the HIP runtime", RTLD_NODELETE) {
#define DEVALLOC_HIP_BIND(name, type) library_.bind(name, #name);
  DEVALLOC_HIP_ENTRY_POINTS(DEVALLOC_HIP_BIND)
#undef DEVALLOC_HIP_BIND
}

std::string Runtime::describe(hipError_t result) const {
  const char* name = hipGetErrorName(result);
  const char* text = hipGetErrorString(result);
  std::string described = name != nullptr ? name : "hipError " + std::to_string(static_cast<int>(result));
  if (text != nullptr && (name == nullptr || std::string(text) != name)) {
    described += std::string(" (") + text + ")";
  }
  return described;
}

void Runtime::check(hipError_t result, plugin::CallKind kind, const char* call_format, ...) const {
  if (result == hipSuccess) return;
  va_list args;
  va_start(args, call_format);
  std::string call = plugin::vformat(call_format, args);
  va_end(args);
  plugin::raise_vendor_failure(kind, result == hipErrorOutOfMemory, describe(result),
                               std::move(call));
}

}  // namespace devalloc::hip
