#include <devalloc/core/device_buffer.hpp>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

namespace devalloc {

namespace {
std::atomic<uint64_t> g_live_buffers{0};
std::atomic<uint64_t> g_kept_buffers{0};
// What alignment 0 asks for at least (PLUGIN-11: natural, at least 256).
constexpr uint64_t kNaturalAlignment = 256;
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
  // PLUGIN-11, checked on every load (the validation layer checks more):
  // a tensor placed from a misaligned, null or wrapping base would be
  // silently misplaced, and a host-addressable device's base is written
  // through as a pointer.
  const uint64_t base = *address;
  const uint64_t need = alignment == 0 ? kNaturalAlignment : alignment;
  std::string wrong;
  if (nbytes > 0) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(base));
    if (base == 0) {
      wrong = "returned address 0";
    } else if (base % need != 0) {
      wrong = std::string("returned address ") + hex + ", not aligned to " + std::to_string(need);
    } else if (base > UINT64_MAX - (nbytes - 1)) {
      wrong = std::string("returned address ") + hex + ", whose " + std::to_string(nbytes) +
              " bytes run past the end of the address space";
    }
  }
  if (!wrong.empty()) {
    // Handed back as the plugin gave it; 0 is a no-op (PLUGIN-12). When
    // that fails too, the error says so: the memory stays lost to the
    // device until the plugin is destroyed.
    const Status handed_back = device.plugin->deallocate(device.device, base);
    return Status(StatusCode::device_error,
                  "allocating buffer " + std::to_string(memory_id) + " (" +
                      std::to_string(nbytes) + " bytes, alignment " + std::to_string(alignment) +
                      ") on " + device.describe() + ": plugin " + device.plugin_name +
                      " broke PLUGIN-11: allocate " + wrong +
                      (handed_back.ok() ? std::string()
                                        : "; handing it back failed too (" +
                                              handed_back.message() +
                                              "): the memory stays allocated until the plugin "
                                              "is destroyed"));
  }
  return std::shared_ptr<DeviceBuffer>(
      new DeviceBuffer(std::move(device), memory_id, base, nbytes));
}

}  // namespace devalloc
