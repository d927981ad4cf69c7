#include <devalloc/plugin_kit/error.hpp>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <utility>

namespace devalloc::plugin {

devalloc_status fail(devalloc_error* error, devalloc_status status,
                     const char* format, ...) {
  if (error != nullptr &&
      error->struct_size >= DEVALLOC_STRUCT_SIZE(devalloc_error, message)) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return status;
}

std::string vformat(const char* format, va_list args) noexcept {
  va_list measure;
  va_copy(measure, args);
  const int length = std::vsnprintf(nullptr, 0, format, measure);
  va_end(measure);
  if (length <= 0) return {};
  try {
    std::string text(static_cast<size_t>(length), '\0');
    std::vsnprintf(text.data(), text.size() + 1, format, args);
    return text;
  } catch (...) {
    return {};  // out of host memory: the caller's va_end must still run
  }
}

std::string format(const char* format, ...) {
  va_list args;
  va_start(args, format);
  std::string text = vformat(format, args);
  va_end(args);
  return text;
}

void raise_call_failure(devalloc_status status, std::string call,
                        const std::string& reason) {
  call += " failed: ";
  call += reason;
  throw Failure{status, std::move(call)};
}

void require_memory(bool allocated, const std::string& call, const char* success) {
  if (allocated) return;
  throw Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                call + " returned " + success + " without memory (a null pointer)"};
}

devalloc_status status_of_failed_call(CallKind kind, bool out_of_memory) {
  if (out_of_memory && kind == CallKind::device_allocation) {
    return DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY;
  }
  if (out_of_memory && kind == CallKind::host_allocation) return DEVALLOC_STATUS_OUT_OF_HOST_MEMORY;
  return DEVALLOC_STATUS_DEVICE_ERROR;
}

void raise_vendor_failure(CallKind kind, bool out_of_memory, const std::string& reason,
                          std::string call) {
  raise_call_failure(status_of_failed_call(kind, out_of_memory), std::move(call), reason);
}

void copy_text(char* dst, size_t capacity, const char* text) noexcept {
  if (capacity == 0) return;
  const size_t n = std::min(std::strlen(text), capacity - 1);
  std::memcpy(dst, text, n);
  dst[n] = '\0';
}

}  // namespace devalloc::plugin
