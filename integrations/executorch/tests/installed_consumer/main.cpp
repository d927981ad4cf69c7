// Registers devalloc as ExecuTorch's CUDA allocator, with "cuda:0" served by
// the installed host plugin, and moves bytes through a buffer that
// ExecuTorch's own DeviceMemoryBuffer::create allocated.
#include <devalloc/core/config.hpp>
#include <devalloc/core/runtime.hpp>
#include <devalloc/executorch/device_allocator.hpp>

#include <executorch/runtime/core/device_memory_buffer.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

namespace et = ::executorch::runtime;

int main() {
  et::runtime_init();
  auto config = devalloc::parse_config("[devices.\"cuda:0\"]\nuse = [\"host\", { index = 0 }]\n",
                                       "consumer.toml");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().message().c_str());
    return 1;
  }
  config->plugin_path.push_back(CONSUMER_PLUGIN_DIR);
  auto allocator =
      devalloc::executorch::register_allocator(devalloc::Runtime::create(std::move(*config)));
  if (!allocator.ok()) {
    std::fprintf(stderr, "%s\n", allocator.status().message().c_str());
    return 1;
  }
  {
    auto buffer = et::DeviceMemoryBuffer::create(256, et::etensor::DeviceType::CUDA, 0);
    if (!buffer.ok()) {
      std::fprintf(stderr, "DeviceMemoryBuffer::create failed (ExecuTorch error %d)\n",
                   static_cast<int>(buffer.error()));
      return 1;
    }
    std::vector<uint8_t> in(256), out(256);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7 + 1);
    if ((*allocator)->copy_host_to_device(buffer->data(), in.data(), in.size(), 0) !=
            et::Error::Ok ||
        (*allocator)->copy_device_to_host(out.data(), buffer->data(), out.size(), 0) !=
            et::Error::Ok ||
        out != in) {
      std::fprintf(stderr, "the bytes did not come back\n");
      return 1;
    }
  }
  if ((*allocator)->live_allocations() != 0) {
    std::fprintf(stderr, "the buffer was not freed through the adapter\n");
    return 1;
  }
  auto device = (*allocator)->device(0);
  std::printf("ok: 256 bytes through DeviceMemoryBuffer on %s (plugin %s)\n",
              (*allocator)->tag(0).c_str(), device.ok() ? device->plugin_name.c_str() : "?");
  return 0;
}
