// Which DEVALLOC_CAPABILITY_* flags a plugin may mean.
#pragma once

#include <devalloc/plugin_abi.h>

#include <cstdint>

namespace devalloc::detail {

// The flags that ABI 1.<minor> defines, of those this loader knows. A
// plugin that negotiated an older minor cannot mean a flag added later
// (HOST_ADDRESSABLE, bit 2, came with 1.1): its other bits are ignored, by
// Plugin::create and by the validation layer alike (docs/abi.md,
// Versioning).
constexpr uint64_t capability_flags_of_minor(uint32_t minor) {
  uint64_t flags = DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_STAGING;  // 1.0
  if (minor >= 1) flags |= DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
  if (minor >= 2) flags |= DEVALLOC_CAPABILITY_HOST_MAPPABLE;
  return flags;
}

}  // namespace devalloc::detail
