// A call into a plugin's C ABI that no C++ exception leaves.
#pragma once

#include <devalloc/plugin_abi.h>

#include <cstdio>
#include <exception>
#include <utility>

namespace devalloc::detail {

// PLUGIN-7: nothing may cross the C ABI. A plugin written in C++ that lets
// an exception out anyway (a missing catch) would otherwise unwind through
// the host into callers that expect a status, or end the process from a
// loading thread. It is caught here and becomes the call's failure:
// INTERNAL, with a message that names the function and the rule.
// The message of a caught exception, written while it is still alive.
inline void write_thrown(devalloc_error* error, const char* function, const char* what) {
  if (error == nullptr) return;
  std::snprintf(error->message, sizeof error->message,
                "%s threw a C++ exception across the C ABI (PLUGIN-7)%s%s", function,
                what != nullptr ? ": " : "", what != nullptr ? what : "");
}

template <class Call>
devalloc_status guarded_call(const char* function, devalloc_error* error, Call&& call) noexcept {
  try {
    return std::forward<Call>(call)();
  } catch (const std::exception& e) {
    write_thrown(error, function, e.what());  // e.what() dies with e
  } catch (...) {
    write_thrown(error, function, nullptr);
  }
  return DEVALLOC_STATUS_INTERNAL;
}

}  // namespace devalloc::detail
