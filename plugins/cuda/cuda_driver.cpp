#include "cuda_driver.hpp"

#include <devalloc/plugin_kit/error.hpp>

#include <dlfcn.h>

#include <cstdarg>
#include <string>

namespace devalloc::cuda {

using plugin::CallKind;

// RTLD_NODELETE: the CUDA driver cannot be de-initialized and keeps threads
// of its own after cuInit, so its code must stay mapped after the last
// instance has closed it. A later create() finds it initialized.
Driver::Driver(const std::string& path) : library(path, "the CUDA driver", RTLD_NODELETE) {
  DEVALLOC_CUDA_ENTRY_POINTS(DEVALLOC_KIT_BIND_ENTRY_POINT)
}

std::string Driver::describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUDA error " + std::to_string(static_cast<int>(result)) + " (unknown to the driver)";
  }
  if (cuGetErrorString(result, &text) != CUDA_SUCCESS || text == nullptr) return name;
  return std::string(name) + " (" + text + ")";
}

void Driver::check(CUresult result, CallKind kind, const char* call_format, ...) const {
  if (result == CUDA_SUCCESS) return;
  va_list args;
  va_start(args, call_format);
  std::string call = plugin::vformat(call_format, args);
  va_end(args);
  plugin::raise_vendor_failure(kind, result == CUDA_ERROR_OUT_OF_MEMORY, describe(result),
                               std::move(call));
}

}  // namespace devalloc::cuda
