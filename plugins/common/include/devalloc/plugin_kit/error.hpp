// Error text for plugins: the Failure a plugin throws inside a call, the
// printf-style helpers that build messages, and fail(), which writes a
// message into the caller's devalloc_error.
#pragma once

#include <devalloc/plugin_abi.h>

#include <cstdarg>
#include <cstddef>
#include <string>

namespace devalloc::plugin {

// Thrown inside a plugin to leave through guard() (abi_glue.hpp) with a
// status and a message.
struct Failure {
  devalloc_status status;
  std::string message;
};

// Writes a printf-style message into a caller-owned error (if any, and if
// its struct_size holds the message) and returns status, so that failures
// read `return fail(error, STATUS, ...)`. Never allocates.
devalloc_status fail(devalloc_error* error, devalloc_status status,
                     const char* format, ...)
    __attribute__((format(printf, 3, 4)));

// printf into a std::string, any length. vformat never throws (an empty
// string when host memory runs out), so that a variadic caller reaches its
// va_end before it throws.
std::string format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string vformat(const char* format, va_list args) noexcept;

// Throws Failure{status, "<call> failed: <reason>"}: the form every vendor
// call's failure takes, e.g. "cuMemAlloc_v2(bytesize = 4096) failed:
// CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
[[noreturn]] void raise_call_failure(devalloc_status status, std::string call,
                                     const std::string& reason);

// After an allocation call that answered success: throws Failure
// {DEVICE_ERROR, "<call> returned <success> without memory (a null
// pointer)"} unless it gave memory (`allocated`), so that a plugin never
// hands out address 0 or a NULL staging buffer (PLUGIN-11, PLUGIN-18), nor
// keeps one to free later, when a broken runtime gives nothing.
void require_memory(bool allocated, const std::string& call, const char* success);

// What a failed vendor call was doing, which decides its status: out of
// memory in an allocation is OUT_OF_DEVICE_MEMORY or OUT_OF_HOST_MEMORY,
// everything else DEVICE_ERROR.
enum class CallKind { work, device_allocation, host_allocation };
devalloc_status status_of_failed_call(CallKind kind, bool out_of_memory);

// raise_call_failure with the status status_of_failed_call gives, for a
// vendor's variadic check(result, format, ...) helper, which formats the
// call with vformat and calls va_end first.
[[noreturn]] void raise_vendor_failure(CallKind kind, bool out_of_memory,
                                       const std::string& reason, std::string call);

// Copies text into a fixed char array of the ABI, truncated and
// NUL-terminated. Never allocates.
void copy_text(char* dst, size_t capacity, const char* text) noexcept;
inline void copy_text(char* dst, size_t capacity, const std::string& text) noexcept {
  copy_text(dst, capacity, text.c_str());
}

}  // namespace devalloc::plugin
