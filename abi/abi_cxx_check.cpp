// Compiled as C++ -pedantic -Werror: the ABI header must stand alone, and
// the frozen negotiation layout must not move.
#include <devalloc/plugin_abi.h>

static_assert(offsetof(devalloc_negotiation, struct_size) == 0);
static_assert(offsetof(devalloc_negotiation, host_min_major) == 8);
static_assert(offsetof(devalloc_negotiation, plugin_major) == 20);
static_assert(sizeof(devalloc_status) == 4);
static_assert(DEVALLOC_PLUGIN_API_V1_MIN_SIZE <= sizeof(devalloc_plugin_api_v1));

// ABI 1.1 appended only: the 1.0 table keeps its size on LP64, the new
// function lies right after it.
static_assert(sizeof(void*) != 8 || DEVALLOC_PLUGIN_API_V1_MIN_SIZE == 128);
static_assert(DEVALLOC_PLUGIN_API_V1_1_SIZE ==
              DEVALLOC_PLUGIN_API_V1_MIN_SIZE + sizeof(void*));
static_assert(DEVALLOC_CAPABILITY_HOST_ADDRESSABLE == 4);

// Every DLPack 1.x code is known; the gaps and the ends are not.
constexpr bool every_known(int first, int last) {
  for (int code = first; code <= last; ++code) {
    if (!DEVALLOC_DLPACK_IS_KNOWN(code)) return false;
  }
  return true;
}
static_assert(every_known(1, 4) && every_known(7, 18));
static_assert(!DEVALLOC_DLPACK_IS_KNOWN(0) && !DEVALLOC_DLPACK_IS_KNOWN(5) &&
              !DEVALLOC_DLPACK_IS_KNOWN(6) && !DEVALLOC_DLPACK_IS_KNOWN(19) &&
              !DEVALLOC_DLPACK_IS_KNOWN(-1));
static_assert(DEVALLOC_DLPACK_EXT_DEV == 12 && DEVALLOC_DLPACK_TRAINIUM == 18);
