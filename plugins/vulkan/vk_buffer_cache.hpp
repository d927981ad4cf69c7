// Freed allocations' buffers kept for reuse, as GPU allocators keep freed
// device memory: a new buffer costs vkAllocateMemory, and a driver that
// backs device memory with fresh host pages (lavapipe) makes the first
// write to each page fault; a cached buffer costs neither. One cache per
// device, of its device memory type; bounded in bytes, least recently
// freed destroyed first. Thread-safe.
#pragma once

#include <vulkan/vulkan_core.h>

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>

#include "vk_buffer.hpp"
#include "vk_runtime.hpp"

namespace devalloc::vulkan {

class BufferCache {
 public:
  // A cached buffer serves a request that leaves at most 1/kWasteDivisor
  // of it unused, so that a small request never pins a large buffer.
  static constexpr uint64_t kWasteDivisor = 8;

  struct Entry {
    Buffer buffer;
    uint64_t base = 0;  // where its addresses start: device address or window
  };

  BufferCache(const DeviceFunctions& vk, VkDevice device, uint64_t capacity_bytes)
      : vk_(vk), device_(device), capacity_(capacity_bytes) {}
  // Destroys every cached buffer (PLUGIN-9).
  ~BufferCache() { release_all(); }
  BufferCache(const BufferCache&) = delete;
  BufferCache& operator=(const BufferCache&) = delete;

  // The smallest cached buffer with nbytes behind align_up(base, alignment)
  // that `size` (what a new buffer for the request would be) fills but for
  // 1/kWasteDivisor, taken out of the cache.
  std::optional<Entry> take(uint64_t nbytes, uint64_t alignment, uint64_t size);
  // Keeps a buffer that no copy uses any more, destroying the least
  // recently freed ones past the bound; one larger than the bound, or one
  // there is no host memory to record, is destroyed.
  void keep(Entry freed) noexcept;
  // Destroys every cached buffer; false when there was none.
  bool release_all() noexcept;
  // Device memory held: the cached buffers' memory_size summed.
  uint64_t bytes() const;

 private:
  using Age = std::list<Entry>;  // oldest first

  const DeviceFunctions& vk_;
  VkDevice device_;
  const uint64_t capacity_;
  mutable std::mutex mutex_;
  Age by_age_;
  std::multimap<uint64_t, Age::iterator> by_size_;  // by buffer size
  uint64_t bytes_ = 0;  // of device memory: the bound counts memory_size
};

}  // namespace devalloc::vulkan
