#include <devalloc/core/device_buffer.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

namespace devalloc {

namespace {
std::atomic<uint64_t> g_live_buffers{0};
std::atomic<uint64_t> g_kept_buffers{0};
}

uint64_t DeviceBuffer::live_count() { return g_live_buffers.load(); }
uint64_t DeviceBuffer::kept_count() { return g_kept_buffers.load(); }

DeviceBuffer::DeviceBuffer(ResolvedDevice device, uint32_t memory_id,
                           uint64_t address, uint64_t nbytes)
    : device_(std::move(device)),
      memory_id_(memory_id),
      address_(address),
      nbytes_(nbytes) {
  ++g_live_buffers;
}

DeviceBuffer::~DeviceBuffer() {
  if (keep_allocated_.load()) {
    ++g_kept_buffers;
    --g_live_buffers;
    return;
  }
  Status s = device_.plugin->deallocate(device_.device, address_);
  if (!s.ok()) {
    // Nothing can be done about it here but say so: the memory is lost to
    // the device until the plugin is destroyed. Wording it allocates, and
    // nothing may leave a destructor: without memory, a shorter line.
    try {
      const std::string why =
          s.message().empty() ? std::string("failed (") + to_string(s.code()) + ", no message)"
                            : s.message();
      std::fprintf(stderr, "devalloc: freeing buffer %u on %s: %s\n", memory_id_,
                   device_.describe().c_str(), why.c_str());
    } catch (...) {
      std::fprintf(stderr,
                   "devalloc: freeing buffer %u on device %u failed, and the host ran out of "
                   "memory saying why\n",
                   memory_id_, device_.device);
    }
  }
  --g_live_buffers;
}

Result<std::shared_ptr<DeviceBuffer>> DeviceBuffer::allocate(
    ResolvedDevice device, uint32_t memory_id, uint64_t nbytes,
    uint64_t alignment) {
  auto address = device.plugin->allocate(device.device, nbytes, alignment);
  if (!address.ok()) {
    return address.status().with_context(
        "allocating buffer " + std::to_string(memory_id) + " (" +
        std::to_string(nbytes) + " bytes, alignment " +
        std::to_string(alignment) + ") on " + device.describe());
  }
  // The plugin handle refused an address that breaks PLUGIN-11 (0, not
  // aligned, wrapping, overlapping a live allocation).
  const uint64_t base = *address;
  return std::shared_ptr<DeviceBuffer>(
      new DeviceBuffer(std::move(device), memory_id, base, nbytes));
}

}  // namespace devalloc
