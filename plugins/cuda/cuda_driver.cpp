#include "cuda_driver.hpp"

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <type_traits>

namespace devalloc::cuda {

using plugin::vformat;

Driver::Driver(const std::string& library) {
  // RTLD_NODELETE: the CUDA driver cannot be de-initialized and keeps
  // threads of its own after cuInit, so its code must stay mapped after the
  // last instance has closed it. A later create() finds it initialized.
  handle_ = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle_ == nullptr) {
    const char* reason = ::dlerror();
    throw plugin::Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE,
                          "cannot open the CUDA driver \"" + library +
                              "\": " + (reason ? reason : "unknown reason")};
  }
  const auto bind = [this, &library](auto& entry_point, const char* name) {
    ::dlerror();
    void* symbol = ::dlsym(handle_, name);
    if (symbol == nullptr) {
      const char* reason = ::dlerror();
      std::string message = "the CUDA driver \"" + library +
                            "\" has no entry point " + name +
                            " (driver too old for this plugin?)";
      if (reason != nullptr) message += std::string(": ") + reason;
      ::dlclose(handle_);
      throw plugin::Failure{DEVALLOC_STATUS_RUNTIME_UNAVAILABLE, message};
    }
    entry_point =
        reinterpret_cast<std::remove_reference_t<decltype(entry_point)>>(
            symbol);
  };
#define DEVALLOC_CUDA_BIND_ENTRY_POINT(name) bind(name, #name);
  DEVALLOC_CUDA_ENTRY_POINTS(DEVALLOC_CUDA_BIND_ENTRY_POINT)
#undef DEVALLOC_CUDA_BIND_ENTRY_POINT
}

Driver::~Driver() { ::dlclose(handle_); }

std::string Driver::describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUDA error " + std::to_string(static_cast<int>(result)) +
           " (unknown to the driver)";
  }
  if (cuGetErrorString(result, &text) != CUDA_SUCCESS || text == nullptr) {
    return name;
  }
  return std::string(name) + " (" + text + ")";
}

void Driver::check(CUresult result, const char* call_format, ...) const {
  if (result == CUDA_SUCCESS) return;
  va_list args;
  va_start(args, call_format);
  std::string call = vformat(call_format, args);
  va_end(args);
  raise(result, DEVALLOC_STATUS_DEVICE_ERROR, std::move(call));
}

void Driver::check_allocation(CUresult result, const char* call_format,
                              ...) const {
  if (result == CUDA_SUCCESS) return;
  va_list args;
  va_start(args, call_format);
  std::string call = vformat(call_format, args);
  va_end(args);
  raise(result,
        result == CUDA_ERROR_OUT_OF_MEMORY
            ? DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY
            : DEVALLOC_STATUS_DEVICE_ERROR,
        std::move(call));
}

void Driver::check_host_allocation(CUresult result, const char* call_format,
                                   ...) const {
  if (result == CUDA_SUCCESS) return;
  va_list args;
  va_start(args, call_format);
  std::string call = vformat(call_format, args);
  va_end(args);
  raise(result,
        result == CUDA_ERROR_OUT_OF_MEMORY ? DEVALLOC_STATUS_OUT_OF_HOST_MEMORY
                                           : DEVALLOC_STATUS_DEVICE_ERROR,
        std::move(call));
}

void Driver::raise(CUresult result, devalloc_status status,
                   std::string call) const {
  throw plugin::Failure{status,
                        std::move(call) + " failed: " + describe(result)};
}

}  // namespace devalloc::cuda
