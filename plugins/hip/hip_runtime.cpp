#include "hip_runtime.hpp"

#include <dlfcn.h>

#include <string>

namespace devalloc::hip {

// RTLD_NODELETE: once initialized, the HIP runtime (and ROCr below it)
// keeps threads of its own; unmapping its code under them would crash the
// process. It stays loaded, and a later create() finds it initialized.
Runtime::Runtime(const std::vector<std::string>& libraries)
    : CheckedRuntime("hipSuccess"), library_(libraries, "the HIP runtime", RTLD_NODELETE) {
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

}  // namespace devalloc::hip
