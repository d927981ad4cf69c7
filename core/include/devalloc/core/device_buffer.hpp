// One planned buffer on its device: the single allocation every method that
// uses the memory id shares. Freed when its last owner lets go.
#pragma once

#include <devalloc/core/device.hpp>
#include <devalloc/status.hpp>

#include <atomic>
#include <cstdint>
#include <memory>

namespace devalloc {

class DeviceBuffer {
 public:
  // Allocates nbytes aligned to alignment on device. The error names the
  // memory id, the device and the plugin's reason; an address that breaks
  // PLUGIN-11 is refused by the plugin handle (Plugin::allocate).
  static Result<std::shared_ptr<DeviceBuffer>> allocate(ResolvedDevice device,
                                                        uint32_t memory_id,
                                                        uint64_t nbytes,
                                                        uint64_t alignment);
  // Deallocates. The owner has synchronized every copy into the buffer.
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  uint32_t memory_id() const { return memory_id_; }
  const ResolvedDevice& device() const { return device_; }
  uint64_t address() const { return address_; }
  uint64_t nbytes() const { return nbytes_; }

  // Buffers alive in this process: a failed load must leave this where it
  // was before the load.
  static uint64_t live_count();

  // When the buffer goes, its memory is not handed back to the plugin: a
  // copy into it may still be running (the plugin never released it,
  // PLUGIN-14/PLUGIN-20), and memory freed under it could be given to the
  // next allocation and overwritten. It stays allocated until the plugin
  // instance is destroyed. Thread-safe; the copy schedule calls it.
  void keep_allocated() noexcept { keep_allocated_.store(true); }
  // Buffers of this process whose memory was kept allocated that way.
  static uint64_t kept_count();

 private:
  DeviceBuffer(ResolvedDevice device, uint32_t memory_id, uint64_t address,
               uint64_t nbytes);
  ResolvedDevice device_;
  uint32_t memory_id_;
  uint64_t address_;
  uint64_t nbytes_;
  std::atomic<bool> keep_allocated_{false};
};

}  // namespace devalloc
