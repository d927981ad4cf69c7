#include "vk_buffer_cache.hpp"

#include <devalloc/plugin_kit/allocation_table.hpp>
#include <iterator>

namespace devalloc::vulkan {

std::optional<BufferCache::Entry> BufferCache::take(uint64_t nbytes, uint64_t alignment,
                                                    uint64_t size) {
  std::lock_guard lock(mutex_);
  for (auto it = by_size_.lower_bound(nbytes);
       it != by_size_.end() && it->first - it->first / kWasteDivisor <= size; ++it) {
    const Entry& e = *it->second;
    // The base is fixed: what aligning it costs must fit the buffer.
    if (plugin::align_up(e.base, alignment) - e.base > e.buffer.size - nbytes) continue;
    Entry taken = e;
    by_age_.erase(it->second);
    by_size_.erase(it);
    bytes_ -= taken.buffer.memory_size;
    return taken;
  }
  return std::nullopt;
}

void BufferCache::keep(Entry freed) noexcept {
  std::lock_guard lock(mutex_);
  if (freed.buffer.memory_size > capacity_) {
    destroy_buffer(vk_, device_, freed.buffer);
    return;
  }
  while (bytes_ + freed.buffer.memory_size > capacity_) {
    Entry& oldest = by_age_.front();
    // by_size_ holds one iterator to it among the buffers of its size.
    auto it = by_size_.lower_bound(oldest.buffer.size);
    while (it->second != by_age_.begin()) ++it;
    by_size_.erase(it);
    bytes_ -= oldest.buffer.memory_size;
    destroy_buffer(vk_, device_, oldest.buffer);
    by_age_.pop_front();
  }
  try {
    by_age_.push_back(freed);
    try {
      by_size_.emplace(freed.buffer.size, std::prev(by_age_.end()));
    } catch (...) {
      by_age_.pop_back();
      throw;
    }
  } catch (...) {
    // No host memory to record it: given back instead.
    destroy_buffer(vk_, device_, freed.buffer);
    return;
  }
  bytes_ += freed.buffer.memory_size;
}

bool BufferCache::release_all() noexcept {
  std::lock_guard lock(mutex_);
  const bool any = !by_age_.empty();
  for (Entry& e : by_age_) destroy_buffer(vk_, device_, e.buffer);
  by_age_.clear();
  by_size_.clear();
  bytes_ = 0;
  return any;
}

uint64_t BufferCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace devalloc::vulkan
