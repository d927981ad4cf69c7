// How the loader words a status that a plugin returned.
#pragma once

#include <devalloc/plugin_abi.h>

#include <string>

namespace devalloc::detail {

// Whether the header defines status (PLUGIN-5: a plugin returns no other).
inline bool abi_defines(devalloc_status status) {
  return status >= DEVALLOC_STATUS_OK && status <= DEVALLOC_STATUS_INTERNAL;
}

// What a status the header does not define says, for every call alike
// (the entry point, create, and each function of the table): "synchronize
// returned status 42, which the ABI does not define (PLUGIN-5), taken as
// internal: <the plugin's message>", or ", and gave no message" instead of
// the message when it is empty.
inline std::string undefined_status_text(const char* call, devalloc_status status,
                                         const std::string& message) {
  return std::string(call) + " returned status " + std::to_string(status) +
         ", which the ABI does not define (PLUGIN-5), taken as internal" +
         (message.empty() ? std::string(", and gave no message") : ": " + message);
}

}  // namespace devalloc::detail
