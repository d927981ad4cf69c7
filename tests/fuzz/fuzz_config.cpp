// A runtime config from the fuzz input, then its tags (the first 64)
// resolved to their candidate devices.
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
  // Each tag's expansion is linear in the config, so all of them together
  // are quadratic in a long fallback chain (a load resolves only the plan's
  // few tags); the first 64 cover every shape without turning a chain the
  // fuzzer grows into a timeout. ParseScaling covers 30 000-tag chains.
  size_t expanded = 0;
  for (const auto& [tag, device] : config->devices) {
    if (++expanded > 64) break;
    (void)devalloc::candidate_bindings(*config, tag);
  }
  return 0;
}
