#include "host_device.hpp"

#include <devalloc/plugin_kit/error.hpp>

#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
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
// reason for a failure comes back as a code.
void* aligned_memory(uint64_t nbytes, uint64_t alignment) {
  void* p = nullptr;
  return posix_memalign(&p, alignment, nbytes) == 0 ? p : nullptr;
}

std::byte* pointer(uint64_t address) {
  return reinterpret_cast<std::byte*>(static_cast<uintptr_t>(address));
}

void free_address(uint64_t address) { std::free(pointer(address)); }

}  // namespace

HostDevice::HostDevice(bool async) : total_memory_(pages_to_bytes(sysconf(_SC_PHYS_PAGES))) {
  if (async) queue_ = std::make_unique<plugin::CompletionThread>();
}

HostDevice::~HostDevice() {
  queue_.reset();
  allocations_.for_each([](const plugin::AllocationTable::Allocation& a) { free_address(a.base); });
  host_buffers_.for_each([](void* buffer, uint64_t) { std::free(buffer); });
}

uint64_t HostDevice::free_memory() const { return pages_to_bytes(sysconf(_SC_AVPHYS_PAGES)); }

uint64_t HostDevice::allocate(uint64_t nbytes, uint64_t alignment) {
  // Checked before asking malloc: with overcommit a huge request could
  // succeed and fail only when touched.
  if (nbytes > total_memory_) {
    throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY,
                  "out of device memory (the host has " + std::to_string(total_memory_) +
                      " bytes)"};
  }
  void* p = aligned_memory(nbytes, alignment);
  if (p == nullptr) throw Failure{DEVALLOC_STATUS_OUT_OF_DEVICE_MEMORY, "out of device memory"};
  return allocations_.adopt(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)), nbytes,
                            alignment, free_address);
}

void HostDevice::deallocate(uint64_t address) {
  std::unique_lock lock(memory_lifetime_);
  allocations_.free(address, free_address);
}

void HostDevice::require_destination(uint64_t dst, uint64_t nbytes) const {
  std::shared_lock lock(memory_lifetime_);
  allocations_.require_range(dst, nbytes, "destination");
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
                            plugin::Release release, std::chrono::milliseconds read_delay) {
  if (!queue_) {
    copy_now(dst, src, nbytes);
    return;
  }
  {
    std::shared_lock lock(memory_lifetime_);
    allocations_.require_range(dst, nbytes, "destination");
  }
  queue_->push(
      [this, dst, src, nbytes, read_delay] {
        if (read_delay.count() > 0) std::this_thread::sleep_for(read_delay);
        perform(dst, src, nbytes);
      },
      std::move(release));
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
