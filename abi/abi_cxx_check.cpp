// Compiled as C++11 and as the project's C++, with -Wall -Wextra -Wpedantic
// -Wold-style-cast -Wzero-as-null-pointer-constant -Werror: the ABI header
// must stand alone in C++, its macros must expand without the warnings C++
// code turns on, and the frozen negotiation layout must not move. The
// header itself refuses targets that are not LP64, so the sizes below hold
// wherever this compiles.
#include <devalloc/plugin_abi.h>

#define DEVALLOC_CHECK(condition) static_assert(condition, #condition)

DEVALLOC_CHECK(offsetof(devalloc_negotiation, struct_size) == 0);
DEVALLOC_CHECK(offsetof(devalloc_negotiation, host_min_major) == 8);
DEVALLOC_CHECK(offsetof(devalloc_negotiation, plugin_major) == 20);
DEVALLOC_CHECK(sizeof(devalloc_status) == 4);
DEVALLOC_CHECK(DEVALLOC_PLUGIN_API_V1_MIN_SIZE <= sizeof(devalloc_plugin_api_v1));

// ABI 1.1 appended only: the 1.0 table keeps its size, the new function lies
// right after it.
DEVALLOC_CHECK(DEVALLOC_PLUGIN_API_V1_MIN_SIZE == 128);
DEVALLOC_CHECK(DEVALLOC_PLUGIN_API_V1_1_SIZE == DEVALLOC_PLUGIN_API_V1_MIN_SIZE + sizeof(void*));
DEVALLOC_CHECK(DEVALLOC_STRUCT_SIZE(devalloc_negotiation, api) == sizeof(devalloc_negotiation));

// The capability flags keep their values and their type.
DEVALLOC_CHECK(DEVALLOC_CAPABILITY_ASYNC_COPY == 1 && DEVALLOC_CAPABILITY_HOST_STAGING == 2 &&
               DEVALLOC_CAPABILITY_HOST_ADDRESSABLE == 4);
DEVALLOC_CHECK(sizeof(DEVALLOC_CAPABILITY_HOST_ADDRESSABLE) == sizeof(uint64_t) &&
               DEVALLOC_CAPABILITY_ASYNC_COPY - 2 > DEVALLOC_CAPABILITY_ASYNC_COPY);

// Every DLPack 1.x code is known; the gaps and the ends are not.
constexpr bool every_known(int first, int last) {
  return first > last || (DEVALLOC_DLPACK_IS_KNOWN(first) && every_known(first + 1, last));
}
DEVALLOC_CHECK(every_known(1, 4) && every_known(7, 18));
DEVALLOC_CHECK(!DEVALLOC_DLPACK_IS_KNOWN(0) && !DEVALLOC_DLPACK_IS_KNOWN(5) &&
               !DEVALLOC_DLPACK_IS_KNOWN(6) && !DEVALLOC_DLPACK_IS_KNOWN(19) &&
               !DEVALLOC_DLPACK_IS_KNOWN(-1));
DEVALLOC_CHECK(DEVALLOC_DLPACK_EXT_DEV == 12 && DEVALLOC_DLPACK_TRAINIUM == 18);

// The macros in ordinary code, where C++ warnings apply too.
uint64_t devalloc_abi_cxx_check_use(uint64_t flags, int32_t code);
uint64_t devalloc_abi_cxx_check_use(uint64_t flags, int32_t code) {
  const uint64_t known = DEVALLOC_CAPABILITY_ASYNC_COPY | DEVALLOC_CAPABILITY_HOST_STAGING |
                         DEVALLOC_CAPABILITY_HOST_ADDRESSABLE;
  return (flags & known) + DEVALLOC_STRUCT_SIZE(devalloc_capabilities, flags) +
         static_cast<uint64_t>(DEVALLOC_DLPACK_IS_KNOWN(code));
}
