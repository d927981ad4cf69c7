#include <devalloc/plugin_kit/error.hpp>
#include <devalloc/plugin_kit/instance.hpp>

void* devalloc_instance::allocate_host(uint64_t) {
  throw devalloc::plugin::Failure{DEVALLOC_STATUS_UNSUPPORTED,
                                  "this plugin offers no host staging (PLUGIN-18)"};
}

void devalloc_instance::free_host(void*) {
  throw devalloc::plugin::Failure{DEVALLOC_STATUS_UNSUPPORTED,
                                  "this plugin offers no host staging (PLUGIN-18)"};
}

void* devalloc_instance::map_to_host(uint32_t, uint64_t, uint64_t) {
  throw devalloc::plugin::Failure{DEVALLOC_STATUS_UNSUPPORTED,
                                  "this plugin cannot map device memory (PLUGIN-22)"};
}

void devalloc_instance::unmap_from_host(uint32_t, void*) {
  throw devalloc::plugin::Failure{DEVALLOC_STATUS_UNSUPPORTED,
                                  "this plugin cannot map device memory (PLUGIN-22)"};
}

devalloc::plugin::MemoryInfo devalloc_instance::memory_info(uint32_t) {
  throw devalloc::plugin::Failure{DEVALLOC_STATUS_UNSUPPORTED,
                                  "this plugin does not report free memory"};
}
