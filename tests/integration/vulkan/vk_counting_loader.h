/* The counting Vulkan loader of the plugin's tests (vk_counting_loader.cpp):
 * what a test reads and sets through dlsym on the library the plugin was
 * given as runtime_library. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Device memory as the driver sees it, since the library was loaded. */
struct devalloc_test_vk_memory {
  uint64_t allocations;  /* vkAllocateMemory calls that succeeded */
  uint64_t refusals;     /* vkAllocateMemory calls refused by the limit */
  uint64_t live_count;   /* VkDeviceMemory objects not freed */
  uint64_t live_bytes;   /* their allocationSize summed */
};

typedef void (*devalloc_test_vk_read_memory_fn)(struct devalloc_test_vk_memory* out);
/* vkAllocateMemory answers VK_ERROR_OUT_OF_DEVICE_MEMORY when live_bytes
 * would exceed this; UINT64_MAX (the start) for no limit. */
typedef void (*devalloc_test_vk_limit_memory_fn)(uint64_t live_bytes);
/* Non-zero: devices offer VK_EXT_memory_budget, every DEVICE_LOCAL heap's
 * budget its size and its usage live_bytes. Read at vkCreateDevice time by
 * the plugin, so set before the plugin is created. */
typedef void (*devalloc_test_vk_offer_budget_fn)(int offer);

#ifdef __cplusplus
}
#endif
