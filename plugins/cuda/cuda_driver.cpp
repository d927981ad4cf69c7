#include "cuda_driver.hpp"

#include <dlfcn.h>

#include <string>

namespace devalloc::cuda {

// RTLD_NODELETE: the CUDA driver cannot be de-initialized and keeps threads
// of its own after cuInit, so its code must stay mapped after the last
// instance has closed it. A later create() finds it initialized.
Driver::Driver(const std::string& path)
    : CheckedRuntime("CUDA_SUCCESS"), library(path, "the CUDA driver", RTLD_NODELETE) {
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

}  // namespace devalloc::cuda
