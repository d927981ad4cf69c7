// Compiled as C++ -pedantic -Werror: the ABI header must stand alone, and
// the frozen negotiation layout must not move.
#include <devalloc/plugin_abi.h>

static_assert(offsetof(devalloc_negotiation, struct_size) == 0);
static_assert(offsetof(devalloc_negotiation, host_min_major) == 8);
static_assert(offsetof(devalloc_negotiation, plugin_major) == 20);
static_assert(sizeof(devalloc_status) == 4);
static_assert(DEVALLOC_PLUGIN_API_V1_MIN_SIZE <= sizeof(devalloc_plugin_api_v1));
