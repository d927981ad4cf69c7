/* Compiled as C89 and C17, -Wall -Wextra -Wpedantic -Werror: the ABI header
 * must stand alone in every C a plugin may be written in, and its macros
 * must expand cleanly in use. */
#include <devalloc/plugin_abi.h>

typedef char devalloc_error_is_first_field_sized
    [(offsetof(devalloc_error, struct_size) == 0) ? 1 : -1];

uint64_t devalloc_abi_c_check_use(uint64_t flags, int32_t code);
uint64_t devalloc_abi_c_check_use(uint64_t flags, int32_t code) {
  const uint64_t known = DEVALLOC_CAPABILITY_ASYNC_COPY |
                         DEVALLOC_CAPABILITY_HOST_STAGING |
                         DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
  return (flags & known) + DEVALLOC_STRUCT_SIZE(devalloc_capabilities, flags) +
         (uint64_t)DEVALLOC_DLPACK_IS_KNOWN(code);
}
