#include "host_device.hpp"

#include <devalloc/huge_pages.hpp>
#include <devalloc/plugin_kit/error.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace devalloc::host {
namespace {

using plugin::Failure;

uint64_t pages_to_bytes(long pages) {
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t page_size() {
  const long size = sysconf(_SC_PAGE_SIZE);
  return size > 0 ? static_cast<uint64_t>(size) : 4096;
}

// posix_memalign rather than aligned_alloc: no size-multiple rule, and the
// reason for a failure comes back as a code. Device memory is filled right
// after it is allocated: a large block starts on a 2 MiB boundary and asks
// for huge pages (a fault per 2 MiB, not per 4 KiB, when it is filled).
void* aligned_memory(uint64_t nbytes, uint64_t alignment) {
  constexpr uint64_t kHugePage = uint64_t{2} << 20;
  if (nbytes >= kHugePage && alignment < kHugePage) alignment = kHugePage;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, nbytes) != 0) return nullptr;
  advise_huge_pages(p, nbytes);
  return p;
}

std::byte* pointer(uint64_t address) {
  return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address));
}

void free_address(uint64_t address) { std::free(pointer(address)); }

// MemAvailable from /proc/meminfo, in bytes; nullopt where it is missing
// (kernels before 3.14, no /proc).
std::optional<uint64_t> available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

HostDevice::HostDevice(const Settings& settings)
    : total_memory_(settings.memory_limit > 0 ? settings.memory_limit
                                              : pages_to_bytes(sysconf(_SC_PHYS_PAGES))),
      limited_(settings.memory_limit > 0),
      pooling_(settings.pool) {
  if (settings.async) queue_ = std::make_unique<plugin::CompletionThread>();
}

HostDevice::~HostDevice() {
  queue_.reset();
  allocations_.for_each([](const plugin::AllocationTable::Allocation& a) { free_address(a.base); });
  host_buffers_.for_each([](void* buffer, uint64_t) { std::free(buffer); });
  for (const auto& [shape, block] : pool_) std::free(block);
}

void* HostDevice::obtain(uint64_t nbytes, uint64_t alignment) {
  if (pooling_) {
    std::lock_guard lock(pool_mutex_);
    if (auto it = pool_.find({nbytes, alignment}); it != pool_.end()) {
      void* block = it->second;
      pool_.erase(it);
      return block;
    }
  }
  return aligned_memory(nbytes, alignment);
}

uint64_t HostDevice::free_memory() const {
  if (limited_) return total_memory_ - std::min(total_memory_, allocations_.live_bytes());
  return available_memory().value_or(pages_to_bytes(sysconf(_SC_AVPHYS_PAGES)));
}

uint64_t HostDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  // Checked before asking malloc: with overcommit a huge request could
  // succeed and fail only when touched.
  if (!limited_ && nbytes > total_memory_) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  "out of device memory (the host has " + std::to_string(total_memory_) +
                      " bytes)"};
  }
  std::unique_lock limit_lock(allocate_mutex_, std::defer_lock);
  if (limited_) {
    limit_lock.lock();
    if (const uint64_t left = free_memory(); nbytes > left) {
      throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                    "out of device memory: " + std::to_string(nbytes) + " bytes asked, " +
                        std::to_string(left) + " of the memory_limit " +
                        std::to_string(total_memory_) + " free"};
    }
  }
  void* p = obtain(nbytes, alignment);
  if (p == nullptr) throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "out of device memory"};
  const auto base = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
  if (pooling_) {
    std::lock_guard lock(pool_mutex_);
    try {
      shape_of_[base] = {nbytes, alignment};
    } catch (...) {
      std::free(p);
      throw;
    }
  }
  return allocations_.adopt(base, nbytes, alignment, [this](uint64_t unrecorded) {
    if (pooling_) {
      std::lock_guard lock(pool_mutex_);
      shape_of_.erase(unrecorded);
    }
    free_address(unrecorded);
  });
}

void HostDevice::deallocate(uint64_t address) {
  std::unique_lock lock(memory_lifetime_);
  if (!pooling_) {
    allocations_.free(address, free_address);
    return;
  }
  // posix_memalign honours the alignment itself: address is the base.
  allocations_.free(address, [this](uint64_t base) {
    std::lock_guard pool_lock(pool_mutex_);
    const auto shape = shape_of_.find(base);
    if (shape == shape_of_.end()) {
      free_address(base);
      return;
    }
    void* block = pointer(base);
    pool_.emplace(shape->second, block);  // may throw: the allocation stays live
    shape_of_.erase(shape);
  });
}

void HostDevice::copy_now(uint64_t dst, const void* src, uint64_t nbytes) {
  // Waiting keeps FIFO order with earlier queued copies to overlapping
  // bytes without holding a second copy of src; the caller could not reuse
  // src any sooner if it were staged instead.
  if (queue_) queue_->wait_for_earlier();
  std::shared_lock lock(memory_lifetime_);
  allocations_.require_range(dst, nbytes, "destination");
  std::memcpy(pointer(dst), src, nbytes);
}

void HostDevice::copy_later(uint64_t dst, const void* src, uint64_t nbytes,
                            plugin::Release release) {
  if (!queue_) {
    copy_now(dst, src, nbytes);
    return;
  }
  {
    std::shared_lock lock(memory_lifetime_);
    allocations_.require_range(dst, nbytes, "destination");
  }
  queue_->push([this, dst, src, nbytes] { perform(dst, src, nbytes); }, std::move(release));
}

void HostDevice::perform(uint64_t dst, const void* src, uint64_t nbytes) {
  std::shared_lock lock(memory_lifetime_);
  if (!allocations_.contains(dst, nbytes)) {
    throw Failure{DEVALLOC_STATUS_DEVICE_ERROR,
                  "queued copy of " + std::to_string(nbytes) +
                      " bytes: its destination was freed before it ran"};
  }
  std::memcpy(pointer(dst), src, nbytes);
}

void HostDevice::copy_to_host(void* dst, uint64_t src, uint64_t nbytes) {
  if (queue_) queue_->wait_for_earlier();
  std::shared_lock lock(memory_lifetime_);
  allocations_.require_range(src, nbytes, "source");
  std::memcpy(dst, pointer(src), nbytes);
}

void HostDevice::synchronize() {
  if (!queue_) return;
  queue_->wait_for_earlier();
  if (auto failure = queue_->take_error()) {
    throw Failure{DEVALLOC_STATUS_DEVICE_ERROR, "an earlier queued copy failed: " + *failure};
  }
}

void* HostDevice::allocate_host(uint64_t nbytes) {
  void* p = nbytes > total_memory_ ? nullptr : aligned_memory(nbytes, page_size());
  if (p == nullptr) throw Failure{DEVALLOC_STATUS_OUT_OF_HOST_MEMORY, "out of host memory"};
  host_buffers_.adopt(p, nbytes, [](void* buffer) { std::free(buffer); });
  return p;
}

void HostDevice::free_host(void* host) {
  host_buffers_.free(host, [](void* buffer) { std::free(buffer); });
}

}  // namespace devalloc::host
