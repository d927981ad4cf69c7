// A runtime config from the fuzz input, then every tag resolved to its
// candidate devices.
#include <devalloc/core/config.hpp>
#include <devalloc/core/device_selection.hpp>

#include "memory_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  devalloc::fuzz::MemoryFile file(data, size);
  auto config = devalloc::read_config(file.path());
  if (!config.ok()) {
    devalloc::fuzz::check_names_file(config.status().message(), file.path());
    return 0;
  }
  for (const auto& [tag, device] : config->devices) {
    (void)devalloc::candidate_bindings(*config, tag);
  }
  return 0;
}
